"""[analysis] offload = "slurm" (issue 23, item 3): a big bundle's analysis runs as a Slurm job;
the worker concludes what it found exactly as a local analysis would, and a job that ends
without a result costs a partial verdict and a retry on the controller, never the verdict."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_attr.bundleanalysis import Gathered, conclude, gather, run_bundle
from slurm_attr.config import Config
from slurm_attr.pipeline import attempt, intake, offload
from slurm_attr.store import Store

from test_drain_fakes import XID79
from test_intake_retry import JobSlurm, _job, cfg  # noqa: F401 - cfg is a fixture

BUNDLES = sorted(p for p in (Path(__file__).parents[1] / "fixtures" / "bundles").iterdir() if p.is_dir())


@pytest.mark.parametrize("bundle", BUNDLES, ids=[p.name for p in BUNDLES])
def test_findings_through_json_conclude_to_the_local_verdict(bundle):
    """What the offloaded job writes (Gathered as JSON) decides the same verdict as run_bundle."""
    cfg = Config()
    local = run_bundle(str(bundle), cfg).to_dict()
    back = Gathered.from_dict(json.loads(json.dumps(gather(str(bundle), cfg).to_dict(), default=str)))
    assert conclude(back).to_dict() == local


class OffloadSlurm(JobSlurm):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.submitted: list[tuple[str, list[str]]] = []
        self.analysis_state = "RUNNING"

    def submit_batch(self, command, opts):
        self.submitted.append((command, opts))
        return "9001"

    def sacct_job(self, job_id):
        if job_id == "9001":
            return {"JobID": job_id, "JobIDRaw": job_id, "State": self.analysis_state, "ExitCode": "0:0"}
        return super().sacct_job(job_id)


def _stored(cfg, key):
    return Store(cfg.paths.database).verdict(key)


def _offload_on(cfg, min_nodes=1):
    cfg.analysis.offload = "slurm"
    cfg.analysis.offload_min_nodes = min_nodes
    cfg.analysis.offload_partition = "analysis"


def test_a_big_bundle_is_analysed_by_a_slurm_job_and_concluded_here(cfg):
    _offload_on(cfg)
    _job(cfg, kernel=XID79)
    slurm = OffloadSlurm(sacct_state="FAILED", exit_code="1:0")
    assert attempt.process(cfg, "100", slurm=slurm) == "offloaded"
    (command, opts), = slurm.submitted
    bdir = os.path.join(cfg.paths.spool, "bundles", "100")
    assert command.endswith(f"-m slurm_attr.hooks offloaded {bdir}") and "--partition=analysis" in opts
    assert intake.load(cfg, "100")["offload"]["job_id"] == "9001"
    # still running, no result: nothing stored, not counted as a failure, not submitted again
    assert attempt.process(cfg, "100", slurm=slurm) == "offloaded"
    assert len(slurm.submitted) == 1 and intake.load(cfg, "100")["attempts"] == 0
    assert offload.write_result(bdir, cfg) == 0  # what the analysis job does on its node
    assert attempt.process(cfg, "100", slurm=slurm) == "stored"
    v = _stored(cfg, "100")
    assert v.cause == "gpu_hardware" and "n1" in {a.node for a in v.actions if a.applied}
    assert intake.load(cfg, "100") is None


def test_a_small_bundle_is_analysed_here(cfg):
    # near miss: below offload_min_nodes, nothing submitted
    _offload_on(cfg, min_nodes=2)
    _job(cfg, kernel=XID79)
    slurm = OffloadSlurm(sacct_state="FAILED", exit_code="1:0")
    assert attempt.process(cfg, "100", slurm=slurm) == "stored" and slurm.submitted == []


def test_an_analysis_job_cancelled_costs_a_partial_verdict_then_a_local_retry(cfg):
    _offload_on(cfg)
    _job(cfg, kernel=XID79)
    slurm = OffloadSlurm(sacct_state="FAILED", exit_code="1:0")
    assert attempt.process(cfg, "100", slurm=slurm) == "offloaded"
    slurm.analysis_state = "CANCELLED"
    assert attempt.process(cfg, "100", slurm=slurm) == "partial"
    doc = intake.load(cfg, "100")
    assert doc["offload_failed"] and not doc.get("offload") and doc["partial_stored"]
    assert any("ended CANCELLED without a result" in c.detail for c in _stored(cfg, "100").coverage)
    assert attempt.process(cfg, "100", slurm=slurm) == "stored"  # the retry: here, not offloaded again
    assert len(slurm.submitted) == 1 and intake.load(cfg, "100") is None
    assert not any(c.source == "analysis" for c in _stored(cfg, "100").coverage)


def test_the_analysis_job_refuses_a_path_outside_the_spool(cfg, tmp_path, monkeypatch):
    from slurm_attr import config as config_mod, hooks

    monkeypatch.setattr(config_mod, "load", lambda *a, **k: cfg)
    assert hooks.offloaded_main(str(tmp_path)) == 2
    assert hooks.offloaded_main(os.path.join(cfg.paths.spool, "bundles", "..", "x")) == 2
