"""`sattr undrain NODE --diag` on the real cluster: the site's diagnostic decides the resume.

The diagnostic is a test script that passes when a flag file exists and fails otherwise, and
leaves a mark each time it runs. Each test changes the config only inside `cluster.settings`
(restored afterwards) and resumes the node it drained whatever happens.
"""
from __future__ import annotations

import json
import sqlite3
import time
import uuid

import pytest

pytestmark = pytest.mark.cluster

NODE = "n4"


@pytest.fixture
def diag_script(tmp_path):
    """(script, flag, runs): the script passes once ``flag`` exists; each run appends its node to ``runs``."""
    flag, runs = tmp_path / "healthy", tmp_path / "runs.log"
    script = tmp_path / "diag.sh"
    script.write_text(f"#!/bin/sh\necho \"$1\" >> {runs}\necho \"diag on $1: start\"\n"
                      f"if [ -e {flag} ]; then echo 'all tests passed'; exit 0; fi\n"
                      "echo 'GPU 0: memory test FAILED' >&2\nexit 4\n")
    script.chmod(0o755)
    return script, flag, runs


@pytest.fixture
def held(cluster):
    """The test node back in service afterwards, whoever drained it."""
    yield NODE
    state, _reason = cluster.node_state(NODE)
    if "drain" in state or "down" in state:
        cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"], check=False)


def _wait_resumed(cluster, node: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = cluster.node_state(node)[0]
        if "drain" not in state:
            return state
        time.sleep(0.2)
    raise AssertionError(f"{node} still {state}")


def _history(cluster, node: str, since_ts: float) -> list[dict]:
    proc = cluster.sattr("drains", "--since", "1h", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["decisions"]
    return [r for r in rows if r["node"] == node and r["event"] in ("diag", "undrain")
            and time.mktime(time.strptime(r["time"], "%Y-%m-%d %H:%M:%S")) >= since_ts - 1]


def test_failing_diag_keeps_drained_passing_diag_resumes_both_recorded(cluster, diag_script, held):
    script, flag, runs = diag_script
    why = f"diag test {uuid.uuid4().hex[:8]}"
    ours = "SATTR: gpu_hardware xid79 gpu3b:00 job 1"
    start = time.time()
    cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", f"Reason={ours}"])
    with cluster.settings(actions={"diag_command": f"{script} %n", "diag_timeout_s": 60.0}):
        failed = cluster.sattr("undrain", NODE, "--diag", "--reason", why)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert f"{NODE} stays drained: diag failed (rc 4" in failed.stderr
        state, reason = cluster.node_state(NODE)
        assert "drain" in state and reason == ours
        flag.touch()
        passed = cluster.sattr("undrain", NODE, "--diag", "--reason", why)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        assert f"{NODE} resumed (was: {ours})" in passed.stdout and "diag passed (rc 0" in passed.stdout
    _wait_resumed(cluster, NODE)
    assert runs.read_text().split() == [NODE, NODE]

    hist = _history(cluster, NODE, start)
    diags = sorted((r["applied"], r["rc"]) for r in hist if r["event"] == "diag" and str(script) in r["reason"])
    assert diags == [(False, 4), (True, 0)], hist
    passed_tail = [r["output_tail"] for r in hist if r["event"] == "diag" and r["applied"]]
    assert passed_tail == [f"diag on {NODE}: start\nall tests passed\n"]
    undrains = [(r["applied"], r["blocked_by"] or "") for r in hist if r["event"] == "undrain" and r["reason"] == why]
    assert sorted(a for a, _ in undrains) == [False, True]
    assert any(not a and b.startswith("diag failed (rc 4") for a, b in undrains), undrains
    text = cluster.sattr("drains", "--since", "1h").stdout
    assert "passed (rc 0" in text and "failed (rc 4" in text and why in text


def test_admin_drain_is_refused_without_running_the_diag(cluster, diag_script, held):
    script, flag, runs = diag_script
    flag.touch()
    admin = f"admin: diag test hold {uuid.uuid4().hex[:6]}"
    cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", f"Reason={admin}"])
    with cluster.settings(actions={"diag_command": f"{script} %n"}):
        proc = cluster.sattr("undrain", NODE, "--diag", "--reason", "trying")
    assert proc.returncode == 1
    assert "drained by someone else" in proc.stderr and admin in proc.stderr
    assert not runs.exists()  # the diagnostic never ran
    state, reason = cluster.node_state(NODE)
    assert "drain" in state and reason == admin


def test_diag_without_a_command_says_what_to_set(cluster, held):
    ours = "SATTR: gpu_hardware xid79 gpu3b:00 job 1"
    cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", f"Reason={ours}"])
    with cluster.settings(actions={"diag_command": ""}):
        proc = cluster.sattr("undrain", NODE, "--diag", "--reason", "x")
    assert proc.returncode == 3 and "set [actions] diag_command" in proc.stderr
    state, reason = cluster.node_state(NODE)
    assert "drain" in state and reason == ours


def test_auto_undrain_waits_then_resumes_on_a_passed_diag(cluster, diag_script, held):
    """`sattr undrain --auto` with Slurm's own reason time: too early it waits, then resumes.
    Its automatic attempt is removed from the store afterwards: the one automatic chance per
    node (diag.ONE_CHANCE_WINDOW_S) would otherwise hold n4 back on the next run."""
    script, flag, runs = diag_script
    flag.touch()
    job = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -w {NODE}\nexit 1\n", user="sattrtest")
    assert cluster.verdict(job)["cause"] != "gpu_hardware"  # a stored verdict, no recurrence in it
    ours = f"SATTR: gpu_hardware xid79 gpu3b:00 job {job}"
    cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", f"Reason={ours}"])
    con = sqlite3.connect(str(cluster.db_path), timeout=10)
    first = con.execute("select coalesce(max(id), 0) from diags").fetchone()[0]
    try:
        auto = {"diag_command": f"{script} %n", "auto_undrain": True}
        with cluster.settings(actions=dict(auto, auto_undrain_after_s=3600.0)):
            early = cluster.sattr("undrain", "--auto")
        assert early.returncode == 0, early.stderr
        assert f"{NODE}: waits:" in early.stdout and not runs.exists()
        with cluster.settings(actions=dict(auto, auto_undrain_after_s=0.0)):
            due = cluster.sattr("undrain", "--auto")
        assert due.returncode == 0, due.stderr
        if f"{NODE} resumed (was: {ours})" not in due.stdout:
            # A worker's own pass (diag.maybe_start_auto: the same code, started after its batch
            # with the config it re-read) may get there first; then ours finds nothing left to do,
            # or finds that pass still running (its lock) and leaves the node to it.
            assert ("no node is drained by sattr" in due.stderr
                    or "another auto_undrain run is in progress" in due.stderr), due.stdout + due.stderr
        _wait_resumed(cluster, NODE)
        assert runs.read_text().split() == [NODE]
        rows = con.execute("select node, ok, trigger, actor from diags where id > ?", [first]).fetchall()
        assert (NODE, 1, "auto", "sattr auto_undrain") in rows, rows
    finally:
        with con:
            con.execute("delete from diags where id > ? and node = ? and trigger = 'auto'", [first, NODE])
        con.close()
