"""--json output: one record per line, the same JSON values as json.dumps(default=str) writes."""
from __future__ import annotations

import enum
import json
from pathlib import Path

import pytest

from slurm_attr.cli.options import dumps_records

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "xid79_cascade"


class Color(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


CASES = [
    {},
    [],
    {"a": [], "b": {}, "c": [{}], "d": [[[]]]},
    {"s": "plain", "u": "ünïcode ✓ \u2028", "ctl": "tab\t nl\n nul\x00 quote\" back\\", "empty": ""},
    {"i": 0, "neg": -17, "big": 2**70, "f": 1.5, "tiny": 1e-300, "nan": float("nan"), "inf": float("inf"),
     "ninf": float("-inf"), "t": True, "f2": False, "n": None},
    {1: "int key", 2.5: "float key", None: "none key"},
    {True: "bool key"},
    {"tuple": (1, "two", (3,)), "enum": Color.RED, "intenum": Level.HIGH},
    {"other": {1, 2} and Path("/tmp/x"), "nested": {"deep": [{"x": [1, {"y": None}]}]}},
    "top-level string",
    42,
]


def _same_values(ours: str, data) -> None:
    # through dumps again: NaN != NaN, but its spelling compares
    ref = json.dumps(data, default=str)
    assert json.dumps(json.loads(ours)) == json.dumps(json.loads(ref))


@pytest.mark.parametrize("data", CASES)
def test_json_output_has_the_values_json_dumps_has(data):
    _same_values(dumps_records(data), data)


def test_json_output_of_a_real_verdict_is_a_record_per_line():
    from slurm_attr.bundleanalysis import run_bundle
    from slurm_attr.config import Config

    data = run_bundle(str(FIXTURE), Config()).to_dict()
    assert len(data["symptoms"]) > 1 and data["coverage"]  # a real, nested verdict
    out = dumps_records(data)
    _same_values(out, data)
    lines = out.split("\n")
    # each symptom is one line of its own, which parses to that symptom
    for sym in data["symptoms"]:
        mine = [ln for ln in lines if ln.startswith("    {") and json.loads(ln.strip().rstrip(",")) == sym]
        assert len(mine) == 1, sym["id"]
    assert lines[0] == "{" and lines[-1] == "}"
    assert lines[1].startswith('  "job_id": ')
    # near miss: json.dumps(indent=2) spreads one symptom over many lines
    assert len(json.dumps(data, indent=2).split("\n")) > 3 * len(lines)


def test_json_output_refuses_what_json_refuses():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_records(loop)
    top: dict = {}
    top["self"] = top
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_records(top)
    with pytest.raises(TypeError):
        dumps_records({(1, 2): "tuple key"})
