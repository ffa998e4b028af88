"""[analysis] offload = "slurm" on the real cluster (issue 23, item 3): a bundle at or above the
size goes to Slurm as an analysis job, whose findings the worker concludes, stores and comments
as a local analysis; the analysis job cancelled costs a partial verdict, the job stays pending
and the retry analyses it on the controller."""
from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.cluster

FAIL_2N = "#!/bin/bash\n#SBATCH -N2\nsrun -N2 true\necho 'RuntimeError: boom' >&2\nexit 3\n"
# the same, running long enough for the test to see it run and queue the blockers behind it
FAIL_2N_SLOW = FAIL_2N.replace("srun -N2 true", "sleep 5\nsrun -N2 true")


def analysis_jobs(cluster, key: str) -> list[tuple[str, str]]:
    """(job id, state) of the analysis jobs submitted for ``key``, from accounting."""
    out = cluster.run(["sacct", "-n", "-P", "-X", "-a", "--name", f"sattr-analysis-{key}", "-o", "JobIDRaw,State",
                       "-S", "now-1hour"], check=False).stdout
    return [tuple(ln.split("|")[:2]) for ln in out.splitlines() if "|" in ln]  # type: ignore[misc]


def wait_for(what, fn, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{what}: not after {timeout}s")


def test_a_big_bundle_is_analysed_by_a_slurm_job(cluster):
    with cluster.settings(analysis=dict(offload="slurm", offload_min_nodes=2)):
        job = cluster.sbatch(FAIL_2N, user="sattrtest")
        small = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\nexit 3\n", user="sattrtest")  # near miss: 1 node
        cluster.wait_state(job)
        cluster.wait_state(small)
        v = cluster.verdict(job, timeout=180)
        cluster.verdict(small, timeout=120)
    # accounting hears of the analysis job's end a moment after the worker read its result
    jobs = wait_for("the analysis job in accounting",
                    lambda: [j for j in analysis_jobs(cluster, job) if j[1] == "COMPLETED"], timeout=60)
    assert len(analysis_jobs(cluster, job)) == 1, jobs
    assert analysis_jobs(cluster, small) == []  # analysed on the controller
    result = json.loads((cluster.bundle(job) / "offload.json").read_text())
    assert result["job"]["job_id"] == job and result["symptoms"]
    # concluded as a local analysis is: the job's own error, its state, no coverage error
    assert v["job_id"] == job and v["cause"] != "unknown" and "boom" in json.dumps(v)
    assert not [c for c in v["coverage"] if c["source"] == "analysis"], v["coverage"]
    assert "SATTR1:" in cluster.comment(job)


def test_the_analysis_job_cancelled_is_a_partial_verdict_then_a_retry_here(cluster):
    blockers: list[str] = []
    try:
        with cluster.settings(analysis=dict(offload="slurm", offload_min_nodes=2)):
            job = cluster.sbatch(FAIL_2N_SLOW, user="sattrtest")
            cluster.wait_running(job)
            # every job slot taken, so the analysis job waits in the queue and can be cancelled there
            blockers = [cluster.sbatch("#!/bin/bash\n#SBATCH -N1\nsleep 300\n", "--exclusive", user="sattrtest")
                        for _ in range(4)]
            cluster.wait_state(job)
            ajob = wait_for("the analysis job", lambda: analysis_jobs(cluster, job), timeout=120)[0][0]
            cluster.run(["scancel", ajob])
            v = wait_for("the partial verdict", lambda: _verdict_if(cluster, job, partial=True), timeout=120)
            assert any("ended CANCELLED without a result" in c["detail"] for c in v["coverage"]), v["coverage"]
        for b in blockers:
            cluster.run(["scancel", b], check=False)
        time.sleep(6)  # the entry's backoff (5 s) before the retry takes it
        proc = cluster.sattr("retry")
        assert proc.returncode == 0, proc.stderr
        v = wait_for("the full verdict", lambda: _verdict_if(cluster, job, partial=False), timeout=120)
        assert not [c for c in v["coverage"] if c["source"] == "analysis"] and v["cause"] != "unknown"
        assert len(analysis_jobs(cluster, job)) == 1  # the retry did not offload again
    finally:
        for b in blockers:
            cluster.run(["scancel", b], check=False)


def _verdict_if(cluster, job: str, partial: bool) -> dict | None:
    try:
        v = cluster.verdict(job, timeout=1)
    except AssertionError:
        return None
    is_partial = any(c["source"] == "analysis" and "partial" in c["detail"] for c in v["coverage"])
    return v if is_partial == partial else None
