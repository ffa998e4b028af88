"""Run the analysis on a bundle as `sattr analyze DIR --json` does: in-process (the same calls
cli/jobs.py's analyze makes: analysis.run_bundle, then drain.apply_policy offline), or through
the CLI itself with ``--subprocess`` (slower; a check that the two agree).

Returns the verdict as the JSON contract of DESIGN §4 (a dict), or {"error": ...}.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any, Callable

Analyze = Callable[[str], dict[str, Any]]


def in_process() -> Analyze:
    """The analysis with default configuration (no site config: figures must not depend on
    the machine that runs the benchmark)."""
    from slurm_attr import drain
    from slurm_attr.bundleanalysis import run_bundle
    from slurm_attr.bundle import Bundle
    from slurm_attr.config import Config

    cfg = Config()
    # An analyser that fails is logged with its traceback once per bundle; the figures count
    # those cases instead (score.py: analyser failures), so keep the terminal readable.
    logging.getLogger("slurm_attr").setLevel(logging.CRITICAL)

    def analyze(path: str) -> dict[str, Any]:
        try:
            verdict = run_bundle(path, cfg)
            verdict.actions = drain.apply_policy(cfg, verdict, Bundle(path).job, slurm=None, store=None, path="offline")
            return verdict.to_dict()
        except Exception as err:  # noqa: BLE001 - a crash is a result to report, not a reason to stop
            return {"error": f"{type(err).__name__}: {err}"[:300]}

    return analyze


def via_cli(sattr: str | None = None) -> Analyze:
    """`sattr analyze DIR --json` in a subprocess (about 0.3 s a bundle)."""
    exe = sattr or os.path.join(os.path.dirname(sys.executable), "sattr")

    def analyze(path: str) -> dict[str, Any]:
        try:
            res = subprocess.run([exe, "analyze", path, "--json"], capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "SLURM_ATTR_CONFIG": os.devnull})
        except (OSError, subprocess.TimeoutExpired) as err:
            return {"error": f"{type(err).__name__}: {err}"[:300]}
        if res.returncode != 0:
            return {"error": f"exit {res.returncode}: {res.stderr.strip()[-300:]}"}
        try:
            return json.loads(res.stdout)
        except ValueError as err:
            return {"error": f"not JSON: {err}"}

    return analyze
