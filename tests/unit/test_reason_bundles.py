"""Incident bundles for the verdict's reasoning steps (issues 10 and 12), each with its truth
written first (truth.json) and a near-miss beside it: contradiction, first failure, the job's
cause vs the node's health, no evidence, the attempt, network localisation by vote.

Run through the whole analysis (analysis.run_bundle) and the drain policy's candidates, as
`sattr analyze DIR` does."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_attr.bundleanalysis import run_bundle
from slurm_attr.config import Config
from slurm_attr.drain import candidates

BUNDLES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"
CASES = sorted(p.name for p in BUNDLES.glob("reason_*") if (p / "truth.json").is_file())


def _verdict(name):
    return run_bundle(str(BUNDLES / name), Config())


def test_every_class_has_a_positive_case_and_a_near_miss():
    classes: dict[str, int] = {}
    for name in CASES:
        t = json.loads((BUNDLES / name / "truth.json").read_text())
        classes[t["class"]] = classes.get(t["class"], 0) + 1
    assert set(classes) == {"contradiction", "first_failure", "node_health", "no_evidence", "attempt", "network_vote",
                            "missing_dump"}
    assert all(n >= 2 for n in classes.values()), classes


@pytest.mark.parametrize("name", CASES)
def test_reason_bundle(name):
    truth = json.loads((BUNDLES / name / "truth.json").read_text())
    v = _verdict(name)
    why = f"{name}: {truth['why']}\n  got {v.cause} {v.culprit_nodes} {v.culprit_ranks}: {v.summary}"
    if "cause" in truth:
        assert v.cause == truth["cause"], why
    if "cause_not" in truth:
        assert v.cause != truth["cause_not"], why
    if "culprit_nodes" in truth:
        assert v.culprit_nodes == truth["culprit_nodes"], why
    for n in truth.get("culprit_not", []):
        assert n not in v.culprit_nodes, why
    for r in truth.get("culprit_ranks", []):
        assert r in v.culprit_ranks, why
    if "ambiguous" in truth:
        assert v.ambiguous == truth["ambiguous"], why
    assert [c[0] for c in candidates(v)] == truth["drain"], why
    for sid, state in truth.get("claims", {}).items():
        got = {s.status.claim for s in v.symptoms if s.id == sid}
        assert got == {state}, f"{why}\n  claims of {sid}: {got}"
        if state == "contradicted":
            assert all(s.role != "root" for s in v.symptoms if s.id == sid), why
            assert all("not confirmed" in s.summary for s in v.symptoms if s.id == sid), why
    if "kernel_copy" in truth:
        assert all(s.status.kernel_format_copy for s in v.symptoms if s.id == truth["kernel_copy"]), why
    for sid, role in truth.get("roles", {}).items():
        assert {s.role for s in v.symptoms if s.id == sid} == {role}, why
    for text in truth.get("not_in_summary", []):
        assert text not in v.summary, why
    for src in truth.get("coverage_missing", []):
        assert any(c.source == src and c.status != "ok" for c in v.coverage), why
    if "symptom" in truth:
        assert any(s.id == truth["symptom"] and s.role == "root" for s in v.symptoms), why
    assert "?" not in v.summary, why


def test_the_report_lists_the_claims_it_did_not_take_at_their_word():
    from slurm_attr.render import verdict_text
    text = verdict_text(_verdict("reason_claim_xid_clean_kernel"))
    block = text.split("Not taken at their word:")[1].split("\n\n")[0]
    assert "gpu.lost_in_output on n2, rank 6: claimed by the job's output, not confirmed by n2's kernel log" in block
    assert "a copy of a kernel log line" in block
    # near-miss: the confirmed claim is simply evidence
    assert "Not taken at their word" not in verdict_text(_verdict("reason_claim_xid_confirmed"))
