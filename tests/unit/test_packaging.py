"""The installed package is what the checkout runs: every subpackage is listed in pyproject.toml.

The hooks run from a site venv (`make install`), not from the checkout: a subpackage missing
from the list imports fine in the tests and crashes every analysis on a cluster."""
from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "slurm_attr").rglob("__init__.py")
             if "rulebook" not in p.parts and "__pycache__" not in p.parts}
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert "slurm_attr.rulebook" in listed
