"""The rule engine: a declarative catalog (``rules/`` at the repository root,
shipped as ``slurm_attr.rulebook``) turned into symptoms.

Public API (others depend on these names):

- ``load_catalog(extra_dir=None) -> Catalog``: validated and cached; every inline
  case runs at load; a broken rule raises RuleError naming its file and reason.
- ``extract_lines(catalog, source, node, path, lines) -> list[Symptom]``: pure,
  over (line number, text) pairs of one file.
- ``analyze(bundle, cfg) -> (symptoms, coverage)``: every source of a bundle.
"""
from __future__ import annotations

from .catalog import Catalog, Case, Rule, build_catalog, load_catalog
from .extract import extract_lines
from .sources import analyze

__all__ = ["Catalog", "Case", "Rule", "analyze", "build_catalog", "extract_lines", "load_catalog"]
