"""Every inline case of every rule, one test each (the catalog's own examples)."""
from __future__ import annotations

import pytest

from slurm_attr.model import Symptom
from slurm_attr.rules import build_catalog
from slurm_attr.rules.pyrule import DictHistory
from slurm_attr.rules.selftest import _differences, run_rule_case

CATALOG = build_catalog(check=False)

TOML_CASES = [pytest.param(rule, case, id=f"{rule.id}-{i}-{case.kind}")
              for rule in CATALOG.rules for i, case in enumerate(rule.cases, 1)]
JOB_CASES = [pytest.param(rule, case, id=f"{rule.id}-{i}") for rule in CATALOG.job_rules
             for i, case in enumerate(rule.cases, 1)]
HISTORY_CASES = [pytest.param(rule, case, id=f"{rule.id}-{i}") for rule in CATALOG.history_rules
                 for i, case in enumerate(rule.cases, 1)]


@pytest.mark.parametrize("rule,case", TOML_CASES)
def test_rules_toml_case(rule, case):
    assert run_rule_case(CATALOG, rule, case) is None


@pytest.mark.parametrize("rule,case", JOB_CASES)
def test_rules_job_case(rule, case):
    sym = rule.run(case.job)
    if case.expect is None:
        assert sym is None
    else:
        assert sym is not None and sym.id == rule.id and sym.trusted
        assert _differences(sym, case.expect) == []


@pytest.mark.parametrize("rule,case", HISTORY_CASES)
def test_rules_history_case(rule, case):
    syms = [Symptom.from_dict(s.to_dict()) for s in case.symptoms]
    got = sorted(s.id for s in rule.run(syms, case.job, DictHistory(case.history)))
    assert got == sorted(case.expect_ids)


def test_rules_every_rule_has_a_match_and_a_nomatch_case():
    for rule in CATALOG.rules:
        kinds = {c.kind for c in rule.cases}
        assert kinds == {"match", "nomatch"}, rule.id
