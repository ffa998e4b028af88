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
    # the job's own word for a network fault is what a crashed rank's peers print: below its error
    assert p.rank("network", trusted=False) < p.rank("user_error", trusted=False) < p.rank("network", trusted=True)


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


def test_the_engine_names_no_cause_and_no_rule():
    """verdict.py is the engine: causes and rules are the policy's and the catalog's words."""
    import ast
    from pathlib import Path

    import slurm_attr.verdict as engine
    from slurm_attr.rules import load_catalog

    src = Path(engine.__file__).read_text()
    assert len(src.splitlines()) < 250
    literals = {n.value for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    words = set(policy.load().causes) | set(load_catalog().ids())
    assert not literals & words, literals & words
    assert not [w for w in literals if w.endswith(".") and any(r.startswith(w) for r in load_catalog().ids())]


def test_a_verdict_says_why_its_cause_won(tmp_path):
    """The reasoning names the winner over its rivals, and `--why` prints it (job text printable)."""
    from slurm_attr.cli.jobs import why_lines
    from slurm_attr.model import Evidence, Symptom
    from slurm_attr.verdict import decide

    job = {"job_id": "5", "nodes": ["n1"], "state": "FAILED", "exit_code": 1}
    oom = Symptom(id="host.oom_kill", cause="host_oom", trusted=True, node="n1", priority=80,
                  evidence=[Evidence("kernel", "nodes/n1/kernel.log", 3, "Out of memory: Killed process 9 (python)")])
    net = Symptom(id="nccl.remote_error", cause="network", rank=0, priority=60,
                  evidence=[Evidence("stderr", "output/stderr", 9, "NCCL WARN \x1b[2Kremote process exited")])
    v = decide(job, [oom, net], [])
    assert v.cause == "host_oom"
    assert v.reasoning == [f"host_oom: host.oom_kill on n1 over network, trusted evidence; {policy.load().causes['host_oom'].why}"]
    assert v.to_dict()["reasoning"] == v.reasoning
    lines = why_lines(["rank 3's \x1b]0;title\x07 line"])
    assert lines[1] == "Why:" and "\\x1b" in lines[2] and "\x1b" not in lines[2]
    assert why_lines([])[1].startswith("Why: no decision")
