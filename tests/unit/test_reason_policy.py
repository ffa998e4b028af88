"""The cause policy as data (rules/policy.toml, reason/policy.py): it loads, it covers the
contract's cause words with their domains, its cases hold, and a broken table is refused
with what is wrong."""
from __future__ import annotations

import copy
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from slurm_attr.errors import RuleError
from slurm_attr.reason import policy

# DESIGN.md §4: the cause words and their domains (a contract)
CONTRACT = {
    "gpu_hardware": "hardware", "nvlink": "hardware", "host_hardware": "hardware", "network": "network",
    "comm_hang": "network", "collective_mismatch": "user", "rank_stuck": "user", "cuda_oom": "user",
    "host_oom": "user", "user_error": "user", "time_limit": "scheduler", "cancelled": "scheduler",
    "preempted": "scheduler", "node_failure": "infrastructure", "filesystem": "infrastructure",
    "launch_failure": "infrastructure", "none": "none", "unknown": "unknown",
}


def _raw() -> dict:
    return tomllib.loads(policy._policy_bytes().decode())


def test_the_shipped_policy_covers_the_contract_and_its_cases_hold():
    p = policy.load()
    assert {c.name: c.domain for c in p.causes.values()} == CONTRACT
    assert policy.check_cases() == [] and len(p.cases) >= 6
    assert p.group("hardware") == {"gpu_hardware", "nvlink", "host_hardware"}
    assert p.rank("network", trusted=False, unconfirmed_path=True) < p.rank("user_error", trusted=True)
    assert p.rank("network", trusted=False) > p.rank("user_error", trusted=False)


def test_a_case_that_does_not_hold_is_reported():
    data = _raw()
    data["cases"] = [{"name": "wrong on purpose", "roots": [{"cause": "user_error"},
                                                           {"cause": "gpu_hardware", "trusted": True}],
                      "expect": "user_error"}]
    assert policy.check_cases(policy.parse(data)) == [
        "policy case 'wrong on purpose': expected user_error, got gpu_hardware"]


@pytest.mark.parametrize("edit, why", [
    (lambda d: d["causes"]["nvlink"].update(colour="red"), "unknown key 'colour'"),
    (lambda d: d["causes"]["nvlink"]["cascades"].append("gremlins"), "names 'gremlins', which is no cause here"),
    (lambda d: d["causes"]["nvlink"].pop("why"), "why: say why it ranks where it does"),
    (lambda d: d["causes"]["nvlink"].update(groups=["shiny"]), "unknown group 'shiny'"),
    (lambda d: d["causes"]["nvlink"].update(domain="weather"), "domain: one of"),
    (lambda d: d.update(version=2), "version = 1 expected"),
])
def test_a_broken_table_is_refused_with_what_is_wrong(edit, why):
    data = copy.deepcopy(_raw())
    edit(data)
    with pytest.raises(RuleError, match=why):
        policy.parse(data)
