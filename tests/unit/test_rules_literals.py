"""literals.required_any: literals a regex cannot match without, never a line it could match."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from slurm_attr.rules import load_catalog
from slurm_attr.rules.literals import required_any

FIXTURE_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

# The shape of a real mlx5 health line (kernel, net.mlx5_fatal-like): keyword mlx5_core, the
# failure named by one of several phrases.
MLX = r"mlx[45]_core (?P<device>[0-9a-f:.]+):? .*?(?P<text>Fatal error \d+ detected|health compromised|PCI channel offline)"


def test_rules_literals_alternatives_of_a_required_group():
    assert required_any(MLX, keywords=["mlx5_core"]) == {"fatal error ", "health compromised", "pci channel offline"}


def test_rules_literals_a_literal_the_keyword_already_holds_is_no_filter():
    # "_core " is in every line the keyword mlx5_core selects: useless, so nothing is returned.
    assert required_any(r"mlx[45]_core (?P<device>\S+)", keywords=["mlx5_core"]) is None


def test_rules_literals_optional_parts_are_not_required():
    assert required_any(r"NCCL WARN (?:Call to ibv_\w+ failed)?", keywords=["nccl"]) == {"nccl warn "}
    assert required_any(r"(?:Call to ibv_reg_mr failed)?\d+", keywords=["x"]) is None


def test_rules_literals_a_branch_with_an_unanchored_alternative_proves_nothing():
    # "Fatal error" is not required (the other alternative has no literal); " on host " is.
    assert required_any(r"(?:Fatal error|\d+) on host (?P<node>\S+)") == {" on host "}
    assert required_any(r"(?:Fatal error|Cable error \d+) on (?P<node>\S+)") == {"fatal error", "cable error "}


def test_rules_literals_case_insensitive_patterns_are_left_alone():
    # (?i) folds non-ASCII letters (the Kelvin sign matches k): a lowered byte search could miss.
    assert required_any(r"(?i)kernel panic - not syncing") is None
    assert required_any(r"kernel panic - not syncing") == {"kernel panic - not syncing"}


def test_rules_literals_short_literals_are_not_worth_a_check():
    assert required_any(r"Xid(?P<xid>\d+)") is None  # "xid": 3 characters
    assert required_any(r"ab\d+cd") is None
    assert required_any(r"Xid \((?P<pci>\S+)\)") == {"xid ("}


def _rules_with_literals():
    return [r for r in load_catalog().rules if r.required]


def test_rules_literals_hold_for_every_inline_match_case():
    # Every real-format example a rule must match holds one of its required literals.
    rules = _rules_with_literals()
    assert len(rules) >= 20  # the catalog's rules do have them: the test is not vacuous
    for rule in rules:
        for case in rule.cases:
            if case.kind == "match" and rule.regex.search(case.text):
                assert any(lit in case.text.lower() for lit in rule.required), (rule.id, case.text)


def test_rules_literals_hold_on_every_line_of_the_fixture_logs():
    lines = []
    for root, _dirs, files in os.walk(FIXTURE_LOGS):
        for name in files:
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                lines.extend(line.rstrip("\n") for line in f if not line.startswith("#@"))
    assert len(lines) > 100
    matched = 0
    for rule in _rules_with_literals():
        for line in lines:
            if rule.regex.search(line):
                matched += 1
                assert any(lit in line.lower() for lit in rule.required), (rule.id, line)
    assert matched > 20


@pytest.mark.parametrize("pattern", [r"a(?P<x>[bc])+d", r"(?<=foo)bar\b", r"(x)?\1yz", r"[^\n]{3}"])
def test_rules_literals_never_claim_more_than_the_regex(pattern):
    lits = required_any(pattern)
    for text in ("abd", "acbd", "foobar", "xxyz", "yz", "qqq"):
        if re.search(pattern, text) and lits:
            assert any(lit in text.lower() for lit in lits), (pattern, text)
