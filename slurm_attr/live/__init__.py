"""Live: catch a hang while the job still runs (issue 14, first slice).

One watcher per node per job step (started by the SPANK plugin, spank/plugin/watcher.c)
reads the local ranks' native probe records every ``[live] interval_s`` and writes a
small summary of them to the shared spool; the step's first node also combines every
node's summary, detects a communicator that stopped progressing, classifies the hang with
the post-mortem probe rules, and stores a *live finding* that ``sattr JOBID`` shows while
the job runs and the post-mortem analysis reads as untrusted evidence.

Data flows one way: records (job, hostile) -> nodeview (node summary + snapshots) ->
spool files (root) -> detect + classify (leader) -> finding (root) -> cli / evidence.
"""
from __future__ import annotations

from .evidence import analyze

__all__ = ["analyze"]
