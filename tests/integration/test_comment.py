"""The job Comment and the user's view of the verdict on the real cluster (issues 10 and 13).

Users' look-alike markers never come back as a verdict; a multi-line comment is kept whole;
`sattr <job>` for a user reads the root-written copy, which no other user can open; and our
part of the Comment comes back after a slurmctld restart reset it.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time

import pytest

from slurm_attr.slurm.cli import UNCHANGED_ANSWERS, parse_delimited_comments

pytestmark = pytest.mark.cluster

MARKER = re.compile("sattr1:", re.IGNORECASE)
FAKES = {
    "lower": "sattr1: gpu_hardware nodes=n3 gpus=0000:3b:00 - GPU 0000:3b:00 on n3 fell off the bus (Xid 79)",
    "upper": "my run; SATTR1: gpu_hardware nodes=n3 - GPU fell off the bus",
}


def whole_comment(cluster, job: str) -> str | None:
    """The Comment as accounting holds it, newlines included (conftest's sacct reads one line)."""
    d = "^itest7f3a^"
    out = cluster.run(["sacct", "-n", "-P", "-X", f"--delimiter={d}", "-j", job, "-o", "JobIDRaw,Comment,JobIDRaw"],
                      check=False).stdout
    return parse_delimited_comments(out, d).get(job)


def wait_ours(cluster, job: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    c = None
    while time.monotonic() < deadline:
        c = whole_comment(cluster, job)
        if c and "SATTR1:" in c:
            return c
        time.sleep(0.5)
    raise AssertionError(f"job {job}: our part not in the Comment after {timeout}s: {c!r}")


def stored_cause(cluster, job: str) -> str:
    return cluster.verdict(job)["cause"]


def test_fake_markers_in_the_comment_are_never_shown_as_the_verdict(cluster):
    jobs = {k: cluster.sbatch("#!/bin/bash\n#SBATCH -N1\ntrue\n", f"--comment={text}", user="sattrtest")
            for k, text in FAKES.items()}
    plain = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\ntrue\n", user="sattrtest")  # near miss: no comment
    for kind, job in [*jobs.items(), ("plain", plain)]:
        cluster.wait_state(job)
        cause = stored_cause(cluster, job)
        assert cause != "gpu_hardware", (kind, cause)
        full = wait_ours(cluster, job)
        # One marker a reader can find: ours, last; the user's look-alike is shown quoted.
        assert len(MARKER.findall(full)) == 1 and MARKER.search(full).start() == full.rindex("SATTR1:"), full
        if kind != "plain":
            assert "(sattr1): gpu_hardware nodes=n3" in full.lower(), full
        # The user asks: the verdict shown is the analysis', never the comment's.
        proc = cluster.sattr(job, "--json", user="sattrtest")
        assert proc.returncode == 0, proc.stderr
        shown = json.loads(proc.stdout)
        assert shown["cause"] == cause and shown["job_id"] == job
        text = cluster.sattr(job, user="sattrtest").stdout
        assert "gpu_hardware" not in text and "fell off the bus" not in text, text


def test_multi_line_comment_is_kept_whole(cluster):
    user_text = "first line\nsecond | line with a pipe\n  third; indented"
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\ntrue\n", f"--comment={user_text}", user="sattrtest")
    cluster.wait_state(job)
    full = wait_ours(cluster, job)
    assert full.startswith(user_text + "; SATTR1: "), full
    assert full.count("\n") == 2


def test_users_copy_of_the_verdict_is_theirs_alone(cluster):
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\ntrue\n", user="sattrtest")
    cluster.wait_state(job)
    cause = stored_cause(cluster, job)
    uid = int(subprocess.run(["id", "-u", "sattrtest"], capture_output=True, text=True, check=True).stdout)
    path = cluster.base / "attr" / "verdicts" / str(uid) / f"{job}.json"
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    st = path.stat()
    assert (st.st_uid, st.st_mode & 0o022) == (0, 0)
    mine = cluster.run(["cat", str(path)], user="sattrtest", check=False)
    assert mine.returncode == 0 and json.loads(mine.stdout)["verdict"]["cause"] == cause
    theirs = cluster.run(["cat", str(path)], user="sattrother", check=False)
    assert theirs.returncode != 0 and "Permission denied" in theirs.stderr
    listing = cluster.run(["ls", str(path.parent.parent)], user="sattrother", check=False)
    assert listing.returncode != 0
    # Nor can the owner change it.
    write = cluster.run(["sh", "-c", f"echo x >> {path}"], user="sattrtest", check=False)
    assert write.returncode != 0


def _running(pid: int) -> bool:
    """Alive and not a zombie (in a PID namespace whose init does not reap, a dead daemon stays one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _restart_slurmctld(cluster) -> None:
    """Stop slurmctld and start it again with the command line it was started with."""
    pids = cluster.base / "run" / "started.pids"
    lines = pids.read_text().splitlines()
    pid = next(int(ln.split()[1]) for ln in lines if ln.split()[0] == "slurmctld")
    cmd = [a.decode() for a in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[:-1]]
    cwd = os.readlink(f"/proc/{pid}/cwd")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(pid), "slurmctld did not stop"
    pidfile = cluster.base / "run" / "slurmctld.pid"
    pidfile.unlink(missing_ok=True)
    subprocess.run(cmd, env=cluster.env, cwd=cwd, check=True, timeout=60, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # daemonizes; fds closed
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text().strip() and \
                "UP" in cluster.run(["scontrol", "ping"], check=False).stdout:
            break
        time.sleep(0.2)
    new = pidfile.read_text().strip()
    # The test cluster tracks what it started: keep its record right, or `up` would restart all.
    tmp = pids.with_suffix(".tmp")
    tmp.write_text("".join(f"slurmctld {new}\n" if ln.split()[0] == "slurmctld" else ln + "\n" for ln in lines))
    tmp.replace(pids)


def test_comment_survives_a_slurmctld_restart(cluster):
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\ntrue\n", "--comment=Keep ME\nplease", user="sattrtest")
    cluster.wait_state(job)
    before = wait_ours(cluster, job)
    assert before.startswith("Keep ME\nplease; SATTR1: ")
    _restart_slurmctld(cluster)
    # Slurm resends the job (still within MinJobAge) and accounting falls back to the user's text.
    deadline = time.monotonic() + 60
    reset = None
    while time.monotonic() < deadline:
        now = whole_comment(cluster, job)
        if now is not None and "SATTR1:" not in now:
            reset = now
            break
        time.sleep(0.5)
    print(f"after restart: {reset!r}" if reset is not None else "after restart: our part still there")
    if reset is None:
        # Whether the restart resends the job depends on where slurmctld was with it (a loaded
        # machine may have flushed it already): then do what that resend does, so the re-apply
        # below is tested either way.
        subprocess.run([str(cluster.base / "lib" / "sattr-comment"), "sattrtest", job, "Comment"],
                       input="Keep ME\nplease", text=True, check=True, timeout=60, env=cluster.env)
        reset = whole_comment(cluster, job)
    assert reset == "Keep ME\nplease", f"the Comment was not reset: {reset!r}"
    t0 = time.monotonic()
    # This test's own window: a restart resets every job within MinJobAge, and a bench burst run
    # on the same cluster shortly before (2,000 jobs) would be re-applied too (~0.1 s each).
    proc = cluster.sattr("comments", "--verify", "--since", "10m")
    print(f"sattr comments --verify: {time.monotonic() - t0:.2f} s wall: {proc.stderr.strip()!r}")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"[1-9]\d* re-applied", proc.stderr), proc.stderr
    assert whole_comment(cluster, job) == before
    con = sqlite3.connect(f"file:{cluster.db_path}?mode=ro", uri=True, timeout=5)
    assert con.execute("select status from comments where job_id = ? and field = 'Comment'", [job]).fetchone()[0] == "written"
    # Near miss: a second pass finds nothing to re-apply.
    again = cluster.sattr("comments", "--verify", "--since", "10m")
    assert " 0 re-applied" in again.stderr, again.stderr


def test_batch_tool_writes_many_jobs_over_one_connection(cluster):
    """`sattr-comment --batch`, what a worker uses for its batch's comments, against the real
    slurmdbd: each job's text lands as given (case, newline and ';' kept), and a job accounting
    does not have is answered 4 without costing the others their write."""
    jobs = [cluster.sbatch("#!/bin/bash\n#SBATCH -N1\ntrue\n", user="sattrtest") for _ in range(3)]
    ours = {}
    for j in jobs:
        cluster.wait_state(j)
        ours[j] = wait_ours(cluster, j)  # our worker's write first, so it cannot overwrite the test's
    # the new texts end with our part as written: a worker's re-check finds it intact, no race
    texts = {j: f"Batch {j}\nline two; {ours[j]}" for j in jobs}
    payload = "".join(f"{j}\0Comment\0{t}\0" for j, t in texts.items()) + "999999\0Comment\0x\0"
    proc = subprocess.run([str(cluster.base / "lib" / "sattr-comment"), "--batch", "sattrtest"],
                          input=payload, capture_output=True, text=True, timeout=60, env=cluster.env)
    assert proc.returncode == 0, proc.stderr
    answers = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert {j: answers[j].split(" ")[0] for j in jobs} == {j: "0" for j in jobs}, proc.stdout
    # near miss: a job accounting does not have. 22.05 says "nothing modified" (4); 24.11 and
    # 26.05 answer an update that matched no row "Data has not changed" (5): the Python side
    # reads the field back to tell the two "unchanged" cases apart (cli.set_job_comments).
    assert answers["999999"].startswith("4 ") or (
        answers["999999"].startswith("5 ") and any(u in answers["999999"] for u in UNCHANGED_ANSWERS)), proc.stdout
    assert {j: whole_comment(cluster, j) for j in jobs} == texts


def test_each_array_task_keeps_its_own_verdict_in_the_comment(cluster):
    """The array's last task carries the array's own id, and accounting selects every task of an
    array by that number: its comment must be written as A_T, or it lands on all of them (seen:
    a 1,000-task burst left 860 tasks, successful ones too, saying user_error)."""
    job = cluster.sbatch("#!/bin/bash\nexit $((SLURM_ARRAY_TASK_ID % 2))\n", "--array=0-5", user="sattrtest")
    tasks = [f"{job}_{t}" for t in range(6)]
    for t in tasks:
        cluster.verdict(t, timeout=180)
    con = sqlite3.connect(f"file:{cluster.db_path}?mode=ro", uri=True, timeout=5)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = con.execute(f"select count(*) from comments where status = 'written' and field = 'Comment' and job_id in "
                           f"({','.join('?' * len(tasks))})", tasks).fetchone()[0]
        if rows == len(tasks):
            break
        time.sleep(0.5)
    out = cluster.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,Comment%300"]).stdout
    got = dict(ln.split("|", 1) for ln in out.splitlines() if "|" in ln)
    want = {t: ("SATTR1: none" if int(t.split("_")[1]) % 2 == 0 else "SATTR1: user_error") for t in tasks}
    assert {t: got.get(t, "").split(" - ")[0] for t in tasks} == want, got
    assert all(len(MARKER.findall(got[t])) == 1 for t in tasks), got
