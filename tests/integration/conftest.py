"""The real Slurm test cluster (cluster/testcluster.sh) for the integration suite.

The session fixture brings the cluster up (idempotent) and gives helpers to
submit jobs, wait for them, and read what users see: env, bundles, sacct, sinfo,
`sattr`. Everything runs through the real daemons, plugin and epilogs.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import tempfile
import time
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernel_inject import KernelLines

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "cluster" / "testcluster.sh"
BASE = Path(os.environ.get("SATTR_CLUSTER_BASE", "/var/lib/sattr-testcluster"))
FINAL = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL")


class Gate:
    """A job that holds at ``gate.wait`` until the test opens the gate.

    A fault injected "while the job runs" must land inside the job's run: a fixed ``sleep N``
    in the job raced the test on a loaded machine (the job ended before the test, waiting on
    another job, wrote its Xid). The wait is bounded (3 min), so a test that fails before
    opening it leaves no job behind for long. /tmp is shared by every pretend node."""

    DIR = Path("/tmp/sattr-gates")
    made: list["Gate"] = []  # opened at each test's end (a failed test holds no job)

    def __init__(self) -> None:
        self.DIR.mkdir(exist_ok=True)
        os.chmod(self.DIR, 0o755)
        self.path = self.DIR / os.urandom(8).hex()
        Gate.made.append(self)

    @property
    def wait(self) -> str:
        return f"for _ in $(seq 1800); do [ -e {self.path} ] && break; sleep 0.1; done"

    def open(self) -> None:
        self.path.touch()


@pytest.fixture(autouse=True)
def _open_gates():
    yield
    while Gate.made:
        Gate.made.pop().open()


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def atomic_write(path: Path, text: str) -> None:
    """Replace a file whole (a hook never reads half of it)."""
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".sattr-test-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@dataclass
class Cluster:
    base: Path
    env: dict[str, str]

    @property
    def config_path(self) -> Path:
        return self.base / "etc" / "slurm_attr.toml"

    @property
    def db_path(self) -> Path:
        return self.base / "attr" / "sattr.db"

    def bundle(self, job_id: str) -> Path:
        return self.base / "attr" / "spool" / "bundles" / str(job_id)

    def run(self, args: list[str] | str, user: str | None = None, check: bool = True, timeout: float = 120,
            env: dict[str, str] | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
        if isinstance(args, str):
            args = shlex.split(args)
        e = dict(self.env)
        e.update(env or {})
        if user:
            # runuser resets the environment: pass what the user's shell would have.
            args = ["runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in (env or {}).items()],
                    f"SLURM_CONF={e['SLURM_CONF']}", f"SLURM_ATTR_CONFIG={e['SLURM_ATTR_CONFIG']}",
                    f"PATH={e['PATH']}", *args]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd)
        if check and proc.returncode != 0:
            raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def sbatch(self, script: str, *opts: str, user: str | None = None, cwd: str | None = None) -> str:
        """Submit a batch script (text); returns the job id."""
        workdir = cwd or self.workdir(user)
        path = Path(workdir) / f"job-{time.time_ns()}.sh"
        path.write_text(script if script.startswith("#!") else "#!/bin/bash\n" + script)
        path.chmod(0o755)
        if user:
            subprocess.run(["chown", user, str(path)], check=True)
        out = self.run(["sbatch", "--parsable", *opts, str(path)], user=user, cwd=workdir).stdout.strip()
        return out.split(";")[0]

    def workdir(self, user: str | None = None) -> str:
        d = self.base / "work" / (user or "root")
        d.mkdir(parents=True, exist_ok=True)
        if user:
            subprocess.run(["chown", user, str(d)], check=True)
        return str(d)

    def sacct(self, job_id: str, fields: str = "State,ExitCode,Comment%400") -> dict[str, str]:
        names = [f.split("%")[0] for f in fields.split(",")]
        # Accounting may be restarting (a concurrent `up`): callers poll, so an error is "not yet".
        out = self.run(["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", fields], check=False).stdout
        for ln in out.splitlines():
            parts = ln.split("|", len(names) - 1)
            if len(parts) == len(names):
                return dict(zip(names, parts))
        return {}

    def wait_state(self, job_id: str, timeout: float = 180) -> str:
        """Wait until accounting shows a final state; return it."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.sacct(job_id, "State").get("State", "")
            if state.split(" ")[0] in FINAL:
                return state.split(" ")[0]
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not finished after {timeout}s (state {state!r})")

    def verdict(self, job_id: str, timeout: float = 90) -> dict:
        """Wait for the stored verdict of a job; return the contract dict."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.db_path.exists():
                try:
                    con = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=5)
                    row = con.execute("select verdict_json from verdicts where job_id = ?", [str(job_id)]).fetchone()
                    con.close()
                except sqlite3.Error:
                    row = None
                if row:
                    return json.loads(row[0])
            time.sleep(0.3)
        log = (self.base / "log" / "sattr-epilog_slurmctld.log")
        tail = log.read_text()[-3000:] if log.exists() else ""
        raise AssertionError(f"no verdict for job {job_id} after {timeout}s\n{tail}")

    def comment(self, job_id: str, timeout: float = 60, marker: str = "SATTR1:") -> str:
        deadline = time.monotonic() + timeout
        c = ""
        while time.monotonic() < deadline:
            c = self.sacct(job_id, "Comment%400").get("Comment", "")
            if marker in c:
                return c
            time.sleep(0.5)
        raise AssertionError(f"job {job_id}: no {marker} in Comment after {timeout}s: {c!r}")

    def node_state(self, node: str) -> tuple[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"]).stdout.strip().splitlines()
        state, _, reason = (out[0] if out else "|").partition("|")
        return state, reason

    def job_nodes(self, job_id: str, timeout: float = 120) -> tuple[str, list[str]]:
        """(batch host, the job's nodes) once it runs."""
        from slurm_attr.slurm.hostlist import expand

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%B|%N"], check=False).stdout.strip()
            state, _, rest = out.partition("|")
            host, _, nodes = rest.partition("|")
            if state == "RUNNING" and host and nodes:
                return host, expand(nodes)
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} not running after {timeout}s")

    def is_running(self, job_id: str) -> bool:
        return self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False).stdout.strip() == "RUNNING"

    def gate(self) -> Gate:
        """A fresh gate for a held job (see Gate)."""
        return Gate()

    @contextmanager
    def settings(self, **sections: dict):
        """Merge {section: {key: value}} into slurm_attr.toml; restore the file exactly afterwards.
        Written atomically: the hooks read the config at any moment."""
        path = self.config_path
        original = path.read_text()
        data = tomllib.loads(original)
        body = original
        for section, values in sections.items():
            merged = dict(data.get(section) or {})
            merged.update(values)
            body = re.sub(rf"(?ms)^\[{section}\][^\[]*", "", body).rstrip("\n")
            body += f"\n\n[{section}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in merged.items())
        atomic_write(path, body)
        try:
            yield
        finally:
            atomic_write(path, original)

    def wait_running(self, job_id: str, timeout: float = 180) -> None:
        """Until the job is RUNNING (scheduling on a loaded 2-core machine can take a while) and its
        batch host's Prolog has ended: Slurm says RUNNING before the Prolog, and a fatal line a
        test writes "while the job runs" must not reach the Prolog gate (gate.py) first, which
        would rightly take it for a failure before the job and requeue it."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False).stdout.strip()
            if state == "RUNNING":
                self.wait_prolog(job_id, min(30.0, max(1.0, deadline - time.monotonic())))
                return
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} did not start (state {state!r})")

    def wait_prolog(self, job_id: str, timeout: float = 30) -> None:
        """Until a Prolog of this job has ended (the hook wrappers' timing log says so); at once
        on a cluster without a Prolog, and after ``timeout`` (a job with no step launched yet)."""
        log = self.base / "log" / "prolog-times.log"
        if not (self.base / "hooks" / "prolog").exists():
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.exists() and any(ln.startswith(f"{job_id} ") for ln in log.read_text().splitlines()[-2000:]):
                return
            time.sleep(0.05)

    def wait_idle(self, nodes: list[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        states = {}
        while time.monotonic() < deadline:
            states = {n: self.node_state(n)[0] for n in nodes}
            if all(s == "idle" for s in states.values()):
                return
            time.sleep(0.2)
        raise AssertionError(f"nodes not idle: {states}")

    def kernel_log(self, node: str, line: str, at: float | None = None) -> str:
        """Append a kernel line for a node, as journalctl -k prints it (the test kernel source),
        stamped now or at ``at``; returns the line written."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() if at is None else at))
        stamp = stamp[:-2] + ":" + stamp[-2:]
        text = f"{stamp} {os.uname().nodename} kernel: {line}\n"
        with open(self.base / "kernel" / f"{node}.log", "a") as f:
            f.write(text)
        return text

    def ours(self, node: str) -> bool:
        """Whether slurm-attr drained the node (its reason starts with SATTR:)."""
        return self.node_state(node)[1].startswith("SATTR:")

    def sattr(self, *args: str, user: str | None = None, check: bool = False) -> subprocess.CompletedProcess:
        # The site install (a venv every user can run), as users would call it.
        return self.run([self.env["SATTR_BIN"], *args], user=user, check=check)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    if os.geteuid() != 0:
        pytest.fail("the integration suite needs root (it runs Slurm's daemons)")
    proc = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"test cluster did not come up:\n{proc.stdout}\n{proc.stderr}")
    env = dict(os.environ)
    for part in subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True, check=True).stdout.split():
        if "=" in part:
            k, v = part.split("=", 1)
            env[k] = v
    return Cluster(base=BASE, env=env)


@pytest.fixture
def kernel_lines(cluster):
    """Write kernel lines for nodes (KernelLines.add); afterwards they are removed, the SATTR:
    drains of the test nodes undone and the drain breaker reset. No node may start drained by us."""
    nodes = ("n1", "n2", "n3", "n4")
    assert not any(cluster.ours(n) for n in nodes), "a node is still drained by sattr"
    cluster.sattr("breaker", "reset", "--reason", "test start")
    got = KernelLines(cluster)
    try:
        yield got
    finally:
        got.remove()
        for n in nodes:
            if cluster.ours(n):
                cluster.sattr("undrain", n, "--reason", "test cleanup")
        cluster.sattr("breaker", "reset", "--reason", "test end")
