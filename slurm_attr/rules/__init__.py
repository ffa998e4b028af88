"""The rule engine: a declarative catalog (``rules/`` at the repository root,
shipped as ``slurm_attr.rulebook``) turned into symptoms.

Public API (others depend on these names):

- ``load_catalog(extra_dir=None) -> Catalog``: validated and cached (in memory, and
  on disk keyed by the rule files' hashes); a broken rule raises RuleError naming its
  file and reason. Inline cases are not run: that is ``sattr rules test`` and CI.
- ``build_catalog(extra_dir=None, check=True) -> Catalog``: a fresh load, no cache;
  with ``check`` every inline case runs and the first failure raises RuleError.
- ``extract_lines(catalog, source, node, path, lines) -> list[Symptom]``: pure,
  over (line number, text) pairs of one file.
- ``analyze(bundle, cfg) -> (symptoms, coverage)``: every source of a bundle.

Data flows one way: catalog (rules) <- scan/prefilter (matches) <- extract (symptoms)
<- sources (bundles); selftest sits on top and checks the catalog with extract.
"""
from __future__ import annotations

from typing import Optional

from . import catalog as _catalog
from .catalog import Catalog, Case, Rule, load_catalog
from .extract import extract_lines
from .sources import analyze


def build_catalog(extra_dir: Optional[str] = None, check: bool = True) -> Catalog:
    """Load and validate the catalog afresh; with ``check`` also run every inline case."""
    cat = _catalog.build_catalog(extra_dir)
    if check:
        from .selftest import check_catalog

        check_catalog(cat)
    return cat


__all__ = ["Catalog", "Case", "Rule", "analyze", "build_catalog", "extract_lines", "load_catalog"]
