"""Both Slurm backends pass the same contract on the real test cluster.

Parametrized over the CLI backend and the pyslurm backend. The pyslurm one is skipped only
where no pyslurm release line exists for the installed Slurm (no vendored branch, e.g. 26.05);
where one exists, `testcluster.sh up` builds and installs it (cluster/pyslurm.sh), so a
missing or unusable pyslurm there fails loudly instead of silently testing the CLI twice.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from slurm_attr import config
from slurm_attr.errors import SlurmError, SlurmUnavailable
from slurm_attr.slurm import pyslurm_backend, select
from slurm_attr.slurm.cli import CliSlurm

pytestmark = pytest.mark.cluster

PYSLURM_SH = Path(__file__).resolve().parents[2] / "cluster" / "pyslurm.sh"


def pyslurm_expected() -> tuple[bool, str]:
    proc = subprocess.run(["bash", str(PYSLURM_SH), "line"], capture_output=True, text=True)
    return proc.returncode == 0, (proc.stdout.strip() or proc.stderr.strip())


@pytest.fixture(params=["cli", "pyslurm"])
def slurm(request, cluster):
    cfg = config.load(str(cluster.config_path))
    if request.param == "pyslurm":
        expected, line = pyslurm_expected()
        if not expected:
            pytest.skip(f"no pyslurm release line for this Slurm ({line}): the CLI backend is the only one")
        mod, why = pyslurm_backend.load(cfg.paths.slurm_conf)
        if mod is None:
            pytest.fail(f"pyslurm {line}.x is expected here (testcluster.sh up builds it with cluster/pyslurm.sh) "
                        f"but cannot be used: {why}")
    got, _why = select.choose(request.param, cfg.paths.slurm_bin, cfg.paths.slurm_conf, timeout=15,
                              comment_tool=cfg.paths.comment_tool)
    assert type(got).__name__ == ("CliSlurm" if request.param == "cli" else "PyslurmSlurm")
    return got


def failed_job(cluster, node: str = "n3") -> str:
    out = cluster.run(["srun", "-N1", "-w", node, "bash", "-c", "echo JOB=$SLURM_JOB_ID; exit 3"], check=False).stdout
    job = next(ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("JOB="))
    assert cluster.wait_state(job) == "FAILED"
    # The state reaches accounting before the derived exit code (the steps' highest), which
    # slurmdbd fills in a moment later: a backend that reads in between sees 0:0 (24.11 under
    # load). So can the partition: beside stress-ng on 22.05 one read gave Partition "" and the
    # next "debug", with the state and exit codes already final. The backends are compared on
    # the settled record.
    cli = CliSlurm(slurm_conf=cluster.env["SLURM_CONF"])
    deadline = time.monotonic() + 60

    def settled() -> bool:
        row = cli.sacct_job(job) or {}
        return row.get("DerivedExitCode") == "3:0" and bool(row.get("Partition"))

    while not settled() and time.monotonic() < deadline:
        time.sleep(0.2)
    return job


def test_job_facts_match_sacct(cluster, slurm):
    job = failed_job(cluster)
    row = slurm.sacct_job(job)
    assert row is not None
    assert row["JobIDRaw"] == job and row["State"] == "FAILED" and row["ExitCode"] == "3:0"
    assert row["NodeList"] == "n3" and row["User"] == "root"
    # the same fields as the CLI reads them from sacct -P
    cli = CliSlurm(slurm_conf=cluster.env["SLURM_CONF"]).sacct_job(job)
    for k in ("JobID", "JobIDRaw", "User", "Partition", "NodeList", "State", "ExitCode", "DerivedExitCode", "Start",
              "End", "Elapsed", "Timelimit"):
        assert row[k] == cli[k], k
    # near miss: a job accounting never had
    assert slurm.sacct_job("987654321") is None


def test_comment_write_keeps_case_and_reads_back(cluster, slurm):
    job = failed_job(cluster)
    ours = cluster.comment(job)  # the analysis wrote its verdict first; ours keeps that part
    part = ours[ours.index("SATTR1:"):]
    text = f"My Run: LR=3e-4 [{type(slurm).__name__}]; {part}"
    slurm.set_job_comment(job, "Comment", text)
    assert slurm.job_comment(job, "Comment") == text
    assert cluster.sacct(job, "Comment%400")["Comment"] == text
    # AdminComment (a site's choice of field) the same way. The test cluster writes the verdict
    # there too ([actions] admin_comment), in the same pass just after the Comment: a write of
    # ours between that pass's read and its write would be replaced (accounting has no
    # compare-and-set), so the test writes only once ours has landed.
    deadline = time.monotonic() + 60
    while "SATTR1:" not in (slurm.job_comment(job, "AdminComment") or "") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "SATTR1:" in (slurm.job_comment(job, "AdminComment") or "")
    admin = f"Admin Note {job} [{type(slurm).__name__}]"
    slurm.set_job_comment(job, "AdminComment", admin)
    assert slurm.job_comments([job, "987654321"], "AdminComment") == {job: admin, "987654321": None}
    # near miss: a job accounting does not know is "not yet", which the comment queue retries
    with pytest.raises(SlurmUnavailable):
        slurm.set_job_comment("987654321", "AdminComment", "x")


def test_node_state(cluster, slurm):
    recs = {r["NodeName"]: r for r in slurm.nodes()}
    assert {"n1", "n2", "n3", "n4"} <= set(recs)
    assert all("debug" in r["Partitions"].split(",") for r in recs.values())
    one = slurm.show_node("n1")
    assert one["NodeName"] == "n1" and one["State"].split("+")[0] in ("IDLE", "MIXED", "ALLOCATED", "COMPLETING")
    # near miss: a node Slurm does not have
    assert slurm.show_node("nosuchnode9") is None


def test_drain_and_resume_our_own_drain(cluster, slurm):
    from slurm_attr.slurmstate import NodeState

    node = "n4"
    cluster.wait_idle([node])
    reason = f"SATTR: contract test job 0 ({type(slurm).__name__})"
    slurm.drain(node, reason)
    try:
        st = NodeState.from_record(slurm.show_node(node))
        assert st.drained and st.ours and st.reason == reason
        assert st.reason_time is not None and abs(st.reason_time - time.time()) < 120
        assert cluster.node_state(node)[1] == reason
    finally:
        slurm.resume(node)  # only the drain this test set
    cluster.wait_idle([node])
    st = NodeState.from_record(slurm.show_node(node))
    assert not st.out_of_service and st.reason == ""
    # near miss: a node Slurm does not have is an error, not a silent success
    with pytest.raises(SlurmError):
        slurm.drain("nosuchnode9", reason)


def test_hooks_venv_uses_pyslurm_where_expected(cluster):
    """The analysis and the epilogs run from the cluster's venv: pyslurm must be chosen there."""
    expected, line = pyslurm_expected()
    if not expected:
        pytest.skip(f"no pyslurm release line for this Slurm ({line})")
    code = ("from slurm_attr import config; from slurm_attr.slurm.select import choose; "
            f"c = config.load({str(cluster.config_path)!r}); "
            "b, why = choose(c.slurm.backend, c.paths.slurm_bin, c.paths.slurm_conf); print(type(b).__name__, why)")
    out = cluster.run([str(cluster.base / "venv" / "bin" / "python"), "-c", code]).stdout.strip()
    assert out.startswith("PyslurmSlurm"), out
