"""Cases the project already has: its fixture bundles, and every rule's inline cases, each line
alone in a minimal bundle of its rule's source.

Fixture truth: each reason_* bundle's truth.json; the three older bundles' from the assertions
in tests/unit/test_verdict_bundles.py (copied here; update both together). Rule-case truth is
mechanical, from the rule's own declaration (rule, then rules/xid.tsv for gpu.xid, then the
case's expect): a root line alone should give its cause, and drain n1 when it is trusted
(kernel, journal) with a drain/reset/reboot action; a context line should not give its cause; a
nomatch line should not make that rule's symptom a root (another rule may rightly claim it).
Cascade and confirmation lines are scored apart: alone, nothing says what they echo, so
their cause or "unknown" both pass (any third cause fails).
"""
from __future__ import annotations

import glob
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, Iterator

from .scene import Truth

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "bundles")
RULES = os.path.join(REPO, "rules")

# tests/unit/test_verdict_bundles.py: the bundles without a truth.json.
OLD_BUNDLES = {
    "xid79_cascade": Truth("gpu_hardware", ["gpu-003"], [17], ["gpu-003"], "test_verdict_bundle_xid79_on_one_node_of_four"),
    "ib_link_flap": Truth("network", ["gpu-012"], [], [], "test_verdict_bundle_ib_link_flap"),
    "oom_slurm": Truth("host_oom", ["cpu-002"], [5], [], "test_verdict_bundle_slurm_oom_confirmed_by_the_kernel"),
}


@dataclass
class Known:
    """A case to analyse in place (a fixture) or to write first (a rule case)."""

    case_id: str
    truth: Truth
    path: str = ""  # an existing bundle
    files: dict[str, str] = field(default_factory=dict)  # or the files of a minimal bundle
    group: str = ""  # the rule's role, or "fixture"


def fixtures() -> Iterator[Known]:
    for d in sorted(glob.glob(os.path.join(FIXTURES, "*", ""))):
        name = os.path.basename(d.rstrip("/"))
        tp = os.path.join(d, "truth.json")
        if os.path.isfile(tp):
            with open(tp) as f:
                t = json.load(f)
            truth = Truth(t.get("cause", ""), t.get("culprit_nodes", []), t.get("culprit_ranks", []), t.get("drain", []),
                          t.get("why", ""), cause_not=t.get("cause_not"))
        elif name in OLD_BUNDLES:
            truth = OLD_BUNDLES[name]
        else:
            continue
        yield Known(f"fixture/{name}", truth, path=d, group="fixture")


def _xid_table() -> dict[int, tuple[str, str, str]]:
    """rules/xid.tsv: Xid -> (cause, role, action), the data gpu.xid's refiner reads."""
    table = {}
    with open(os.path.join(RULES, "xid.tsv")) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) >= 5 and cols[0].isdigit():
                table[int(cols[0])] = (cols[2], cols[3], cols[4])
    return table


_XID = re.compile(r"Xid \((?:PCI:)?[^)]*\): (\d+)")
_PATHS = {"kernel": "nodes/n1/kernel.log", "journal": "nodes/n1/journal.log", "scheduler": "scheduler/slurm.log",
          "stdout": "output/stdout", "stderr": "output/stderr", "nccl": "nodes/n1/nccl/nccl.n1.4100.log"}
_JOB = {"job_id": "4242", "nodes": ["n1"], "state": "FAILED", "exit_code": 1, "signal": 0, "ranks": {"0": "n1"}}


def _expectation(rule: dict, case: dict, xids: dict[int, tuple[str, str, str]]) -> tuple[Truth, str] | None:
    """(truth, group) of one inline case, from the rule's declaration alone; None: no claim."""
    if "nomatch" in case:
        return Truth("", why="the rule's near-miss line", not_root=rule["id"]), "nomatch"
    cause, role, action = rule["cause"], rule["role"], rule.get("action", "none")
    m = _XID.search(case["match"]) if rule["id"] == "gpu.xid" else None
    if m and int(m.group(1)) in xids:
        cause, role, action = xids[int(m.group(1))]
    exp = case.get("expect", {})
    cause, role, action = exp.get("cause", cause), exp.get("role", role), exp.get("action", action)
    if cause == "unknown":
        return None
    if role == "context":
        return Truth("", why="a context line alone", cause_not=cause), "context"
    source = case.get("source") or rule["sources"][0]
    drain = ["n1"] if role == "root" and action in ("drain", "reset", "reboot") and source in ("kernel", "journal") else []
    echo = role in ("cascade", "confirmation")  # alone, "unknown" is as right as its cause
    return Truth(cause, drain=drain, why=f"a {role} line alone", accept=["unknown"] if echo else []), role


def rule_cases() -> Iterator[Known]:
    """Every TOML rule case (read from the files, not the engine), then the job rules' cases."""
    xids = _xid_table()
    for path in sorted(glob.glob(os.path.join(RULES, "**", "*.toml"), recursive=True)):
        with open(path, "rb") as f:
            rule = tomllib.load(f)
        if "id" not in rule or "sources" not in rule or rule.get("status") == "deprecated":
            continue  # not a line rule (rules/policy.toml is the cause policy table)
        for i, case in enumerate(rule.get("cases", []), 1):
            exp = _expectation(rule, case, xids)
            if exp is None:
                continue
            source = case.get("source") or rule["sources"][0]
            if source not in _PATHS:
                continue
            text = case.get("match", case.get("nomatch", ""))
            files = {"job.json": json.dumps(_JOB), _PATHS[source]: text + "\n"}
            if source in ("kernel", "journal", "nccl"):
                # Only a kernel line comes with a collected kernel log: an empty one beside an NCCL
                # line would read as "the kernel log is clean" and contradict the line's claim.
                status = "ok" if source == "kernel" else "missing"
                files["nodes/n1/collect.json"] = json.dumps({"version": 1, "node": "n1", "sources": {"kernel": {"status": status}}})
            yield Known(f"rule/{rule['id']}/{i}", exp[0], files=files, group=exp[1])
    yield from _job_rule_cases()


def _job_rule_cases() -> Iterator[Known]:
    try:  # the job rules are Python: ask the package's catalog for them
        from slurm_attr.rules.catalog import load_catalog

        rules: list[Any] = load_catalog().job_rules
    except Exception:  # noqa: BLE001 - an engine mid-change must not stop the rest of the report
        return
    for rule in rules:
        for i, case in enumerate(rule.cases, 1):
            job = {"job_id": "4242", **dict(case.job)}
            if case.expect is None:
                truth, group = Truth("", why="job facts that must not match", not_root=rule.id), "nomatch"
            else:
                cause, role = case.expect.get("cause", rule.cause), case.expect.get("role", rule.role)
                if role == "context" or cause == "unknown":
                    continue
                truth, group = Truth(cause, why="job facts alone", accept=["unknown"] if role != "root" else []), role
            yield Known(f"rule/{rule.id}/{i}", truth, files={"job.json": json.dumps(job)}, group=group)


def write(k: Known, root: str) -> str:
    """The case's bundle directory: the fixture itself, or its minimal bundle written under root."""
    if k.path:
        return k.path
    d = os.path.join(root, k.case_id)
    for rel, text in k.files.items():
        os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
        with open(os.path.join(d, rel), "w") as f:
            f.write(text)
    return d
