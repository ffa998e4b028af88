"""The site configuration's value checks: what each setting may be, and how settings must
agree with each other. config.py reads the file into its sections and calls ``validate``; a
value outside these is a ConfigError naming the section and key, before anything runs."""
from __future__ import annotations

import re
from typing import Any

from .errors import ConfigError

MiB = 1 << 20

_KERNEL_SOURCES = ("journalctl", "dmesg", "file")
_COMMENT_FIELDS = ("Comment", "AdminComment")
_SLURM_BACKENDS = ("auto", "cli", "pyslurm")
_ON_HANG = ("record", "dump", "cancel")
_RAS = ("auto", "off")


def host_port(addr: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port``, as NCCL_RAS_ADDR is written; ValueError when not."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]{2,45})\]:(\d{1,5})|([A-Za-z0-9._-]{1,253}):(\d{1,5})", addr or "")
    if not m:
        raise ValueError(f"not host:port: {addr!r}")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not 0 < int(port) < 65536:
        raise ValueError(f"port out of range: {addr!r}")
    return host, int(port)


def validate(cfg: Any) -> None:
    """cfg: a config.Config (not imported: config.py imports this module)."""
    if cfg.collect.kernel_source not in _KERNEL_SOURCES:
        raise ConfigError(f"[collect] kernel_source: must be one of {', '.join(_KERNEL_SOURCES)}, got {cfg.collect.kernel_source!r}")
    if cfg.collect.kernel_source == "file" and not cfg.collect.kernel_file:
        raise ConfigError("[collect] kernel_file: required when kernel_source = \"file\"")
    if cfg.comment.field not in _COMMENT_FIELDS:
        raise ConfigError(f"[comment] field: must be Comment or AdminComment, got {cfg.comment.field!r}")
    if cfg.slurm.backend not in _SLURM_BACKENDS:
        raise ConfigError(f"[slurm] backend: must be one of {', '.join(_SLURM_BACKENDS)}, got {cfg.slurm.backend!r}")
    if cfg.collect.time_budget_s <= 0:
        raise ConfigError("[collect] time_budget_s: must be positive")
    if not 0 <= cfg.drain.max_partition_percent <= 100:
        raise ConfigError("[drain] max_partition_percent: must be between 0 and 100")
    if cfg.spool.keep_days < 0 or cfg.spool.max_bytes < 0:
        raise ConfigError("[spool] keep_days and max_bytes must be >= 0")
    if cfg.store.keep_days != 0 and cfg.store.keep_days < 31:
        raise ConfigError("[store] keep_days: 0 (keep all) or at least 31 (the reasoning reads 30 days back)")
    if cfg.collect.job_cap_bytes <= 0:
        raise ConfigError("[collect] job_cap_bytes: must be positive")
    if cfg.analysis.offload not in ("off", "slurm") or cfg.analysis.offload_min_nodes < 1 \
            or cfg.analysis.offload_min_bytes < 1 or cfg.analysis.offload_time_s < 60:
        raise ConfigError("[analysis] offload must be \"off\" or \"slurm\", offload_min_nodes and "
                          "offload_min_bytes >= 1, offload_time_s >= 60")
    if not 0 <= cfg.analysis.yield_pressure <= 100 or cfg.analysis.yield_max_s < 0:
        raise ConfigError("[analysis] yield_pressure must be within 0..100 and yield_max_s >= 0")
    if not 0 <= cfg.analysis.workers <= 64:
        raise ConfigError(f"[analysis] workers: must be within 0..64 (0: a quarter of the cores), got {cfg.analysis.workers!r}")
    if cfg.live.hang_after_s <= 0 or cfg.live.hang_floor_s <= 0 or not 0.05 <= cfg.live.interval_s <= 60:
        raise ConfigError("[live] hang_after_s and hang_floor_s must be > 0 and interval_s within 0.05..60")
    if cfg.live.on_hang not in _ON_HANG or cfg.live.dump_before_end_s < 0:
        raise ConfigError(f"[live] on_hang must be one of {', '.join(_ON_HANG)} and dump_before_end_s >= 0")
    lv = cfg.live
    if lv.ras not in _RAS or not 0 < lv.ras_timeout_s <= 60:
        raise ConfigError(f"[live] ras must be one of {', '.join(_RAS)} and ras_timeout_s within 0..60, "
                          f"got {lv.ras!r}, {lv.ras_timeout_s!r}")
    try:
        host_port(lv.ras_addr)
    except ValueError as err:
        raise ConfigError(f"[live] ras_addr: {err} (NCCL_RAS_ADDR's form, e.g. localhost:28028)") from err
    if (min(lv.slow_window, lv.slow_min_samples, lv.link_min_pairs, lv.link_min_samples, lv.phase_window) < 1
            or not 0 < lv.straggler_share <= 1 or lv.phase_factor <= 1 or lv.link_outlier_ratio <= 1):
        raise ConfigError("[live] slow_*/link_*/phase_* counts must be >= 1, straggler_share within 0..1, "
                          "phase_factor and link_outlier_ratio > 1")
    if (min(lv.job_cap_bytes, lv.node_cap_bytes, lv.max_sockets, lv.max_watchers, lv.steps_per_watcher) < 1
            or not 0 < lv.collect_timeout_s <= 600 or lv.watcher_mem_bytes < 128 * MiB):
        raise ConfigError("[live] job_cap_bytes, node_cap_bytes, max_sockets, max_watchers and steps_per_watcher "
                          "must be >= 1, collect_timeout_s within 0..600, watcher_mem_bytes >= 128 MiB")
    act = cfg.actions
    if act.max_requeues < 0 or act.action_timeout_s <= 0 or act.diag_timeout_s <= 0 or act.auto_undrain_after_s < 0:
        raise ConfigError("[actions] max_requeues and auto_undrain_after_s must be >= 0, "
                          "action_timeout_s and diag_timeout_s > 0")
    if act.auto_undrain and not act.diag_command:
        raise ConfigError("[actions] auto_undrain needs diag_command (a node resumes only on a passed diagnostic)")
    if cfg.metrics.lemon_verdicts < 1 or (cfg.metrics.textfile and not cfg.metrics.textfile.endswith(".prom")):
        raise ConfigError("[metrics] lemon_verdicts must be >= 1; textfile must end in .prom (node_exporter reads only those)")
    if cfg.intake.catchup_window_s < 0 or cfg.intake.catchup_max_jobs < 1 or cfg.intake.catchup_min_age_s < 0:
        raise ConfigError("[intake] catchup_window_s must be >= 0 (0: no catch-up), catchup_max_jobs >= 1 "
                          "and catchup_min_age_s >= 0")
    if cfg.drain.max_drains < 0 or cfg.drain.window_s <= 0:
        raise ConfigError("[drain] max_drains must be >= 0 and window_s > 0")
