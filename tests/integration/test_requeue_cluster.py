"""Requeue around the broken node on the real cluster (issue 24 item 1; slurm_attr/requeue.py).

A requeue-enabled batch job that ends on a fresh Xid 79 gets its node drained, is requeued by
slurm-attr (same job id, Restarts=1) with the drained node in its ExcNodeList, and its second
run (which succeeds: the script fails only when SLURM_RESTART_COUNT is unset) completes on healthy
nodes; each attempt has its own bundle and verdict. A user-error job with the same settings is
not requeued, and the cap ([actions] max_requeues) holds when the second run breaks too.

Config is changed per test (cluster.settings) and restored; drains are undone and injected
kernel lines removed by the ``kernel_lines`` fixture.
"""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

USER = "sattrtest"
FATAL = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."
SETTINGS = dict(actions=dict(requeue_on=["hardware"], max_requeues=1),
                drain=dict(max_partition_percent=100.0))
# 22.05 holds a requeued job back until its old credential expires (BeginTime, ~2 min), then it
# has to be scheduled on a loaded 2-core machine.
REQUEUE_RUN_S = 420


def _job_rec(cluster, job: str) -> dict[str, str]:
    from slurm_attr.slurm.cli import parse_oneliner

    out = cluster.run(["scontrol", "-o", "show", "job", job], check=False).stdout.strip()
    return parse_oneliner(out.splitlines()[0]) if out else {}


def _attempt_verdict(cluster, job: str, attempt: int, timeout: float = 120) -> dict:
    """The stored verdict of the job's ``attempt`` (1: bundle JOB, 2: bundle JOB.r1), read while
    it is the stored one (a later attempt's verdict replaces it under the same job id)."""
    key = job if attempt == 1 else f"{job}.r{attempt - 1}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            con = sqlite3.connect(f"file:{cluster.db_path}?mode=ro", uri=True, timeout=5)
            row = con.execute("select v.verdict_json from verdicts v join jobs j on j.job_id = v.job_id "
                              "where j.job_id = ? and j.bundle_key = ?", [job, key]).fetchone()
            con.close()
        except sqlite3.Error:
            row = None
        if row:
            return json.loads(row[0])
        time.sleep(0.3)
    raise AssertionError(f"no verdict for attempt {attempt} of job {job} (bundle {key}) after {timeout}s")


def _requeues(cluster, job: str) -> list[dict]:
    con = sqlite3.connect(f"file:{cluster.db_path}?mode=ro", uri=True, timeout=5)
    con.row_factory = sqlite3.Row
    rows = [dict(r) for r in con.execute("select * from requeues where slurm_job_id = ? order by id", [job])]
    con.close()
    return rows


def _wait_collected(cluster, key: str, node: str, timeout: float = 90) -> None:
    path = cluster.bundle(key) / "nodes" / node / "collect.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.2)
    assert path.exists(), f"{node} never collected {key}"


def _marker(cluster, gate) -> Path:
    # Written by the script's first line (in the user's own work dir: the gates' dir is root's):
    # the node's Prolog (the prolog gate reads the kernel log) is over by then, so a line injected
    # after it is the run's, not "failed while idle" before it.
    return Path(cluster.workdir(USER)) / f"{gate.path.name}.started"


def _script(cluster, gates: list, nodes: int, second_ok: bool, requeue: str = "--requeue") -> str:
    first = f"touch {_marker(cluster, gates[0])}\n{gates[0].wait}\nsleep 0.5\nexit 1"
    later = "echo \"attempt $((SLURM_RESTART_COUNT + 1)) on $SLURM_JOB_NODELIST\"\nsleep 1\nexit 0" if second_ok \
        else f"touch {_marker(cluster, gates[1])}\n{gates[1].wait}\nsleep 0.5\nexit 1"
    return (f"#!/bin/bash\n#SBATCH -N{nodes} --exclusive {requeue}\n"
            f"if [ \"${{SLURM_RESTART_COUNT:-0}}\" = 0 ]; then\n{first}\nelse\n{later}\nfi\n")


def _break_running(cluster, lines, job: str, gate, restarts: int) -> tuple[str, float]:
    """Inject a fatal Xid on a node of the job's current run, let it fail; (node, end time)."""
    _host, nodes = cluster.job_nodes(job, timeout=REQUEUE_RUN_S)
    marker = _marker(cluster, gate)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.1)
    assert marker.exists(), f"job {job}'s script never started"
    marker.unlink()
    bad = nodes[-1]
    lines.add(bad, FATAL)
    gate.open()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rec = _job_rec(cluster, job)
        if rec.get("JobState") != "RUNNING" or rec.get("Restarts") != str(restarts):
            return bad, time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"job {job} did not end after its gate opened")


def _wait_rerun(cluster, job: str, restarts: int) -> tuple[dict[str, str], float]:
    """The job's record once its next run is RUNNING, and when that was seen."""
    deadline = time.monotonic() + REQUEUE_RUN_S
    rec: dict[str, str] = {}
    while time.monotonic() < deadline:
        rec = _job_rec(cluster, job)
        if rec.get("JobState") == "RUNNING" and rec.get("Restarts") == str(restarts):
            return rec, time.monotonic()
        time.sleep(0.2)
    raise AssertionError(f"job {job} not running again after {REQUEUE_RUN_S}s: {rec.get('JobState')} "
                         f"Restarts={rec.get('Restarts')} Reason={rec.get('Reason')}")


def test_hardware_failure_is_requeued_around_the_drained_node(cluster, kernel_lines):
    gate = cluster.gate()
    with cluster.settings(**SETTINGS):
        job = cluster.sbatch(_script(cluster, [gate], nodes=2, second_ok=True), user=USER)
        try:
            _requeued_and_completed(cluster, kernel_lines, job, gate)
        except BaseException:
            cluster.run(["scancel", job], check=False)
            raise


def _requeued_and_completed(cluster, kernel_lines, job: str, gate) -> None:
    from slurm_attr.slurm.hostlist import expand

    cluster.wait_running(job)
    bad, ended = _break_running(cluster, kernel_lines, job, gate, restarts=0)
    _wait_collected(cluster, job, bad)
    kernel_lines.remove(bad)
    v1 = _attempt_verdict(cluster, job, 1)
    shown1 = cluster.sattr(job).stdout
    rec, running = _wait_rerun(cluster, job, restarts=1)
    print(f"\nrequeue: job {job} attempt 1 ended -> attempt 2 RUNNING on {rec.get('NodeList')} after "
          f"{running - ended:.1f} s (22.05, plain requeue; {bad} drained and excluded)")
    (cluster.base / "log" / "requeue-latency.log").open("a").write(
        f"{job} end_to_running_s={running - ended:.1f} excluded={bad} nodes={rec.get('NodeList')}\n")

    # attempt 1: the hardware verdict, the drain, the requeue
    assert v1["cause"] == "gpu_hardware" and v1["culprit"]["nodes"] == [bad], v1["summary"]
    assert v1["requeue"]["requeued"] is True and v1["requeue"]["attempt"] == 1, v1["requeue"]
    assert v1["requeue"]["next_attempt"] == 2 and v1["requeue"]["excluded"] == [bad], v1["requeue"]
    assert f"Requeue: requeued as attempt 2; {bad} excluded" in shown1, shown1
    state, reason = cluster.node_state(bad)
    assert "drain" in state and reason.startswith("SATTR: gpu_hardware xid79"), (state, reason)
    # attempt 2 runs elsewhere, with the drained node excluded by Slurm as well
    assert bad not in expand(rec["NodeList"]) and bad in expand(rec["ExcNodeList"]), rec
    assert cluster.wait_state(job, timeout=180) == "COMPLETED"
    [row] = _requeues(cluster, job)
    assert row["ok"] == 1 and row["attempt"] == 1 and row["excluded"] == bad and row["expedite"] == 0, row

    # attempt 2: its own bundle and verdict; attempt 1's Xid is not its evidence
    v2 = _attempt_verdict(cluster, job, 2)
    assert v2["cause"] == "none", v2["summary"]
    assert not [s for s in v2["symptoms"] if s["id"].startswith("gpu.") and s["role"] == "root"], v2["symptoms"]
    assert v2["requeue"]["attempt"] == 2 and v2["requeue"]["after"] == [
        {"attempt": 1, "cause": "gpu_hardware", "excluded": [bad]}], v2["requeue"]
    assert sorted(p.name for p in (cluster.bundle(f"{job}.r1") / "nodes").iterdir()) == sorted(expand(rec["NodeList"]))
    shown = cluster.sattr(job).stdout
    assert f"Requeue: attempt 2: slurm-attr requeued the job after attempt 1 (gpu_hardware; {bad} excluded)" in shown
    # both attempts' verdicts stay readable: attempt 1's beside the stored attempt 2's
    assert f"Earlier attempt ({job}): gpu_hardware on {bad}" in shown, shown
    earlier = json.loads(cluster.sattr(job, "--json").stdout)["earlier_attempts"]
    assert [(e["bundle_key"], e["cause"], e["culprit_nodes"]) for e in earlier] == [(job, "gpu_hardware", [bad])]


def test_user_error_with_the_same_settings_is_not_requeued(cluster, kernel_lines):
    script = """#!/bin/bash
#SBATCH -N1 --requeue
echo "Epoch: [3]  [ 200/1251]  lr: 0.000100  loss: 4.1234 (4.2011)"
echo "Loss is nan, stopping training"
exit 1
"""
    with cluster.settings(**SETTINGS):
        job = cluster.sbatch(script, user=USER)
        assert cluster.wait_state(job) == "FAILED"
        v = cluster.verdict(job)
    assert v["domain"] == "user", v["summary"]
    # requeue_on = ["hardware"]: a user cause is not asked for (and [requeue] never_domains would refuse it)
    assert v["requeue"]["requeued"] is False and "not in [actions] requeue_on" in v["requeue"]["why"], v["requeue"]
    rec = _job_rec(cluster, job)
    assert rec.get("Restarts") == "0" and rec.get("JobState") == "FAILED", rec
    assert [r["ok"] for r in _requeues(cluster, job)] == [0]


def test_the_cap_holds_when_the_second_run_breaks_too(cluster, kernel_lines):
    gates = [cluster.gate(), cluster.gate()]
    with cluster.settings(**SETTINGS):
        job = cluster.sbatch(_script(cluster, gates, nodes=1, second_ok=False), user=USER)
        try:
            cluster.wait_running(job)
            bad1, _ = _break_running(cluster, kernel_lines, job, gates[0], restarts=0)
            _wait_collected(cluster, job, bad1)
            kernel_lines.remove(bad1)
            assert _attempt_verdict(cluster, job, 1)["requeue"]["requeued"] is True
            _wait_rerun(cluster, job, restarts=1)
            bad2, _ = _break_running(cluster, kernel_lines, job, gates[1], restarts=1)
            _wait_collected(cluster, f"{job}.r1", bad2)
            kernel_lines.remove(bad2)
            v2 = _attempt_verdict(cluster, job, 2)
        finally:
            cluster.run(["scancel", job], check=False)
    assert bad2 != bad1 and v2["cause"] == "gpu_hardware" and v2["culprit"]["nodes"] == [bad2], v2["summary"]
    assert v2["requeue"]["requeued"] is False, v2["requeue"]
    assert v2["requeue"]["why"] == "[actions] max_requeues (1) reached for this job", v2["requeue"]
    assert "drain" in cluster.node_state(bad2)[0]
    rec = _job_rec(cluster, job)
    assert rec.get("Restarts") == "1" and rec.get("JobState") == "FAILED", rec
    assert [(r["attempt"], r["ok"]) for r in _requeues(cluster, job)] == [(1, 1), (2, 0)]


def _release(cluster) -> tuple[int, ...]:
    version = cluster.run(["scontrol", "--version"]).stdout.split()[-1]
    return tuple(int(x) for x in version.split(".")[:2])


EXPEDITE = "--requeue=expedite"


def test_expedited_requeue_job_is_released_around_the_drained_node(cluster, kernel_lines):
    """25.11's expedited requeue: slurmctld requeues a failed ``--requeue=expedite`` job itself and,
    since every epilog passed (ours exits 0 after its drain), holds it in REQUEUE_HOLD with
    ExpeditedRequeue=Yes. On a hardware verdict slurm-attr releases it (that is the requeue), and
    it runs again around the drained node."""
    if _release(cluster) < (25, 11):
        pytest.skip("--requeue=expedite is Slurm 25.11's (this cluster runs %d.%02d)" % _release(cluster)[:2])
    gate = cluster.gate()
    with cluster.settings(**SETTINGS):
        job = cluster.sbatch(_script(cluster, [gate], nodes=2, second_ok=True, requeue=EXPEDITE), user=USER)
        try:
            cluster.wait_running(job)
            bad, ended = _break_running(cluster, kernel_lines, job, gate, restarts=0)
            _wait_collected(cluster, job, bad)
            kernel_lines.remove(bad)
            v1 = _attempt_verdict(cluster, job, 1)
            rec, running = _wait_rerun(cluster, job, restarts=1)
            print(f"\nrequeue: job {job} attempt 1 ended -> attempt 2 RUNNING on {rec.get('NodeList')} after "
                  f"{running - ended:.1f} s (expedited requeue released by slurm-attr; {bad} drained and excluded)")
            final = cluster.wait_state(job, timeout=180)
        except BaseException:
            cluster.run(["scancel", job], check=False)
            raise
    from slurm_attr.slurm.hostlist import expand

    assert v1["cause"] == "gpu_hardware" and v1["culprit"]["nodes"] == [bad], v1["summary"]
    assert v1["requeue"]["requeued"] is True and v1["requeue"]["excluded"] == [bad], v1["requeue"]
    assert rec.get("ExpeditedRequeue") == "Yes", rec
    assert bad not in expand(rec["NodeList"]) and bad in expand(rec["ExcNodeList"]), rec
    assert final == "COMPLETED"
    [row] = _requeues(cluster, job)
    assert row["ok"] == 1 and row["attempt"] == 1 and row["expedite"] == 1 and row["excluded"] == bad, row
    assert "(expedited)" in cluster.sattr(job).stdout


def test_expedited_requeue_job_that_failed_on_its_own_stays_held(cluster, kernel_lines):
    """Near miss of the above: the same kind of job failing on the user's own error is held by
    slurmctld exactly the same way; slurm-attr leaves it held (no hardware cause, no release)."""
    if _release(cluster) < (25, 11):
        pytest.skip("--requeue=expedite is Slurm 25.11's")
    script = f"""#!/bin/bash
#SBATCH -N1 {EXPEDITE}
echo "Epoch: [3]  [ 200/1251]  lr: 0.000100  loss: 4.1234 (4.2011)"
echo "Loss is nan, stopping training"
exit 1
"""
    with cluster.settings(**SETTINGS):
        job = cluster.sbatch(script, user=USER)
        try:
            v = _attempt_verdict(cluster, job, 1, timeout=180)
            rec = _job_rec(cluster, job)
        finally:
            cluster.run(["scancel", job], check=False)
    assert v["domain"] == "user", v["summary"]
    assert v["requeue"]["requeued"] is False and "not in [actions] requeue_on" in v["requeue"]["why"], v["requeue"]
    assert rec.get("JobState") == "REQUEUE_HOLD" and rec.get("ExpeditedRequeue") == "Yes", rec
    assert [(r["ok"], r["expedite"]) for r in _requeues(cluster, job)] == [(0, 0)]
