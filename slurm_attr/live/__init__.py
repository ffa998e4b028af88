"""Live: catch a hang while the job still runs (issue 14, first slice).

One watcher per node per job step (started by the SPANK plugin, spank/plugin/watcher.c)
reads the local ranks' native probe records every ``[live] interval_s`` and writes a
small summary of them to the shared spool; the step's first node also combines every
node's summary, detects a communicator that stopped progressing, classifies the hang with
the post-mortem probe rules, and stores a *live finding* that ``sattr JOBID`` shows while
the job runs and the post-mortem analysis reads as untrusted evidence.

Data flows one way: records (job, hostile) -> nodeview (node summary + snapshots) ->
spool files (root) -> detect + classify (leader) -> finding (root) -> cli / evidence. The
threshold is learned per communicator (hang/threshold.py), and a stall whose waited-for ranks
are busy rather than stuck (their /proc counters, hang/procstat.py, and stacks, hang/busy.py) is a
note until they stop moving or the ceiling passes.
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from .. import probe
from . import livespool

if TYPE_CHECKING:
    from ..bundle import Bundle
    from ..config import Config
    from ..model import Coverage, Symptom

__all__ = ["analyze"]

# Most jobs leave no live data (no watcher, no probe): `sattr analyze` then needs none of
# evidence's modules (slow/anomalies.py pulls statistics, decimal, fractions). Submodules load on first use.
_SUBMODULES = {"dumps", "evidence", "findings", "hang", "livespool", "nodeview", "prekill", "ras", "slow", "watcher"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spool_job(bundle: Bundle) -> str:
    """The job whose live files the bundle's analysis reads (a requeued run's bundle, .rN, too)."""
    return bundle.job_id.split(".r", 1)[0]


def _nothing_to_read(bundle: Bundle, cfg: Config) -> bool:
    """True only where evidence.analyze surely gives ([], []): live off, no valid job id, or
    no <spool>/live/<job> (no finding, no pre-kill dumps) and no probe directory in the
    bundle (nothing for slowevidence.postmortem). When unsure, False: the full path runs."""
    if not cfg.live.enabled:
        return True
    job = spool_job(bundle)
    if not livespool.valid_job(job):
        return True
    try:
        os.lstat(livespool.job_dir(cfg.paths.spool, job))
    except FileNotFoundError:
        pass
    except Exception:  # noqa: BLE001 - unreadable or odd: the full path says what it is
        return False
    else:
        return False
    return probe.no_probe_dirs(bundle, bundle.nodes())


def analyze(bundle: Bundle, cfg: Config) -> tuple[list[Symptom], list[Coverage]]:
    """The live findings as post-mortem evidence (evidence.analyze, imported only when
    there may be something to read)."""
    if _nothing_to_read(bundle, cfg):
        return [], []
    from .evidence import analyze as full

    return full(bundle, cfg)
