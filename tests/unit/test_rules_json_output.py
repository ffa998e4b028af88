"""--json output: the fast indenting encoder writes exactly what json.dumps(indent=2) writes."""
from __future__ import annotations

import enum
import json
from pathlib import Path

import pytest

from slurm_attr.cli.options import dumps_indented

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
    {1: "int key", 2.5: "float key", True: "bool key", None: "none key"},
    {"tuple": (1, "two", (3,)), "enum": Color.RED, "intenum": Level.HIGH},
    {"other": {1, 2} and Path("/tmp/x"), "nested": {"deep": [{"x": [1, {"y": None}]}]}},
    "top-level string",
    42,
]


@pytest.mark.parametrize("data", CASES)
def test_rules_json_output_is_byte_identical(data):
    assert dumps_indented(data) == json.dumps(data, indent=2, sort_keys=False, default=str)


def test_rules_json_output_of_a_real_verdict():
    from slurm_attr.analysis import run_bundle
    from slurm_attr.config import Config

    data = run_bundle(str(FIXTURE), Config()).to_dict()
    assert data["symptoms"]  # a real, nested verdict
    assert dumps_indented(data) == json.dumps(data, indent=2, sort_keys=False, default=str)


def test_rules_json_output_falls_back_for_what_json_refuses():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_indented(loop)  # the library's own error, not a RecursionError
    with pytest.raises(TypeError):
        dumps_indented({(1, 2): "tuple key"})
