"""End to end on the real cluster: failing jobs -> bundle -> verdict -> SQLite + Comment -> sattr."""
from __future__ import annotations

import json
import os
import sqlite3
import time

import pytest

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def timeout_job(cluster):
    # Submitted first: Slurm enforces time limits only every ~30 s, so this one takes longest.
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N2 -t 0:05\nsrun -l sleep 300\n", "--comment=Keep ME please",
                         user="sattrtest")
    return job


def test_nonzero_exit_multinode_job(cluster):
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N2\nsrun -l sh -c 'echo working; exit 3'\n", user="sattrtest")
    assert cluster.wait_state(job) == "FAILED"
    v = cluster.verdict(job)
    assert v["job_id"] == job
    assert v["cause"] == "user_error"
    assert v["domain"] == "user"
    # The bundle is on the spool with both nodes' parts and the scheduler facts.
    b = cluster.bundle(job)
    facts = json.loads((b / "job.json").read_text())
    assert facts["nodes"] == ["n1", "n2"] or len(facts["nodes"]) == 2
    for n in facts["nodes"]:
        assert (b / "nodes" / n / "collect.json").is_file()
    assert "working" in (b / "output" / "stdout").read_text()
    # The verdict is in SQLite and in accounting's Comment.
    con = sqlite3.connect(str(cluster.db_path))
    assert con.execute("select cause from verdicts where job_id = ?", [job]).fetchone()[0] == "user_error"
    comment = cluster.comment(job)
    assert comment.startswith("SATTR1: user_error")
    # `sattr JOBID` prints it for a person.
    out = cluster.sattr(job).stdout
    assert "user_error" in out and f"Job {job}" in out


def test_time_limit_job_keeps_users_comment(cluster, timeout_job):
    job = timeout_job
    assert cluster.wait_state(job, timeout=240) == "TIMEOUT"
    v = cluster.verdict(job)
    assert v["cause"] == "time_limit", v
    comment = cluster.comment(job)
    assert comment.startswith("Keep ME please"), comment
    assert "SATTR1: time_limit" in comment
    assert comment.count("SATTR1:") == 1
    proc = cluster.sattr(job, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cause"] == "time_limit"


def test_reanalysis_replaces_our_part_only(cluster):
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\nexit 2\n", "--comment=User Text", user="sattrtest")
    cluster.wait_state(job)
    first = cluster.comment(job)
    assert first.startswith("User Text") and first.count("SATTR1:") == 1
    # Analyse the same bundle again through the real hook entry point.
    env = dict(cluster.env, SLURM_JOB_ID=job)
    py = str(cluster.base / "venv" / "bin" / "python")
    cluster.run([py, "-m", "slurm_attr.hooks", "analyze", job], env=env, cwd=str(cluster.base))
    second = cluster.comment(job)
    assert second.startswith("User Text") and second.count("SATTR1:") == 1


def test_cancelled_job(cluster):
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\nsleep 120\n", user="sattrtest")
    deadline = time.monotonic() + 30
    while cluster.sacct(job, "State").get("State") != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.3)
    cluster.run(["scancel", job])
    assert cluster.wait_state(job) == "CANCELLED"
    assert cluster.verdict(job)["cause"] == "cancelled"


def test_successful_job_is_none(cluster):
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N2\nsrun true\n", user="sattrtest")
    assert cluster.wait_state(job) == "COMPLETED"
    v = cluster.verdict(job)
    assert v["cause"] == "none"
    assert cluster.comment(job).startswith("SATTR1: none")


def test_opted_out_job_still_gets_a_verdict_but_no_job_files(cluster):
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1 --attr=off\nexit 5\n", user="sattrtest")
    cluster.wait_state(job)
    v = cluster.verdict(job)
    assert v["cause"] == "user_error"
    collect = json.loads(next((cluster.bundle(job) / "nodes").glob("*/collect.json")).read_text())
    assert collect["opted_out"] is True
    assert "opted out" in collect["sources"]["fr"]["detail"]


@pytest.mark.parametrize("sabotage", [
    "rm -rf \"$SLURM_ATTR_DIR\"",
    "rm -rf \"$SLURM_ATTR_DIR\"; ln -s /etc \"$SLURM_ATTR_DIR\"",
    "ln -s /etc/shadow \"$SLURM_ATTR_DIR/fr/nccl_trace_rank_0\"; ln -s /etc \"$SLURM_ATTR_DIR/nccl/x\"; "
    "mkfifo \"$SLURM_ATTR_DIR/probe/fifo\"",
    "head -c 3000000 /dev/urandom > \"$SLURM_ATTR_DIR/fr/nccl_trace_rank_0\"; "
    "for i in $(seq 300); do echo junk > \"$SLURM_ATTR_DIR/nccl/f$i\"; done; "
    "printf '\\x80\\x04\\x95garbage' > \"$SLURM_ATTR_DIR/fr/nccl_trace_rank_1\"",
    "chmod 000 \"$SLURM_ATTR_DIR\"",
], ids=["missing", "symlink-dir", "symlinks-and-fifo", "garbage", "unreadable"])
def test_node_epilog_survives_hostile_job_dir(cluster, sabotage):
    before = os.stat("/etc").st_mtime, os.path.exists("/etc/shadow")
    job = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N2\nsrun -l sh -c '{sabotage.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}'\nexit 1\n",
                         user="sattrtest")
    cluster.wait_state(job)
    v = cluster.verdict(job)
    # Nodes are back to idle, not drained with "Epilog error".
    cluster.wait_idle(["n1", "n2", "n3", "n4"])
    for n in ("n1", "n2"):
        state, reason = cluster.node_state(n)
        assert "drain" not in state and "Epilog" not in reason
    times = (cluster.base / "log" / "epilog-times.log").read_text().splitlines()
    mine = [ln.split() for ln in times if ln.split()[0] == job]
    assert len(mine) == 2 and all(row[4] == "0" for row in mine), mine
    # Nothing outside the job dir was read into the bundle or removed.
    assert (os.stat("/etc").st_mtime, os.path.exists("/etc/shadow")) == before
    bundle = cluster.bundle(job)
    for path in bundle.rglob("*"):
        if path.is_file():
            assert b"root:" not in path.read_bytes()[:100000] or path.name == "slurm.log"
    assert not (cluster.base / "evidence" / job).exists()
    assert v["cause"] in ("user_error", "unknown")


def _pid(cluster, name):
    for line in (cluster.base / "run" / "started.pids").read_text().splitlines():
        n, _, pid = line.partition(" ")
        if n == name:
            return int(pid)
    raise AssertionError(f"{name} not started by the test cluster")


def test_accounting_down_verdict_stored_comment_queued_then_written(cluster):
    import signal

    dbd = _pid(cluster, "slurmdbd")
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\nexit 4\n", user="sattrtest")
    cluster.wait_state(job)
    cluster.comment(job)  # the analysis at the job's end is done with accounting
    # ... and has finished: until then it holds the job (a second analysis would find it busy).
    queued = cluster.base / "attr" / "pending" / f"{job}.json"
    deadline = time.monotonic() + 60
    while queued.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not queued.exists(), "the job's analysis never finished"
    os.kill(dbd, signal.SIGSTOP)  # accounting stops answering (not a clean shutdown)
    try:
        env = dict(cluster.env, SLURM_JOB_ID=job)
        py = str(cluster.base / "venv" / "bin" / "python")
        # Re-run the analysis while accounting hangs: the verdict must still be stored.
        con = sqlite3.connect(str(cluster.db_path))
        cluster.verdict(job)
        con.execute("delete from comments where job_id = ?", [job])
        con.commit()
        cluster.run([py, "-m", "slurm_attr.hooks", "analyze", job], env=env, timeout=300, cwd=str(cluster.base))
        row = con.execute("select status, attempts from comments where job_id = ? and field = 'Comment'", [job]).fetchone()
        assert row is not None and row[0] == "pending" and row[1] >= 1, row
        assert cluster.verdict(job)["cause"] == "user_error"
        out = cluster.sattr(job).stdout
        assert "Job comment: pending" in out
    finally:
        os.kill(dbd, signal.SIGCONT)
    proc = cluster.sattr("comments", "--retry")
    assert proc.returncode == 0, proc.stderr
    assert "SATTR1: user_error" in cluster.comment(job)
    assert con.execute("select status from comments where job_id = ? and field = 'Comment'", [job]).fetchone()[0] == "written"
