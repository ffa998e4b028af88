"""Commands for the durable intake and the spool: retry, gc (and the pending lines others show).

A timer runs `sattr retry` (README: "Nothing lost"), so a job whose analysis failed for a
passing reason (database locked, accounting down, a timeout) gets its verdict without a person.
"""
from __future__ import annotations

from typing import Any

import click

from .. import gc as gc_mod, storeretention
from ..pipeline import intake
from . import main
from .options import echo_json, handle_errors, json_option, load_config


def pending_line(cfg: Any, job_id: str) -> str | None:
    """``pending since ..., last error ...`` for a job, or None (not pending, or not readable to the caller)."""
    try:
        doc = intake.for_job(cfg, job_id)
    except OSError:
        return None
    return intake.describe(doc) if doc else None


@main.command()
@click.option("--all", "everything", is_flag=True, help="Every pending job now, ignoring its backoff.")
@click.option("--limit", default=1000, show_default=True, help="At most this many jobs in this run.")
@json_option
@click.pass_context
@handle_errors
def retry(ctx: click.Context, everything: bool, limit: int, as_json: bool) -> None:
    """Analyse pending jobs again (those whose backoff has passed), then prune the spool.

    Each job gets one attempt; a failure stays pending with its error and a longer
    backoff. Meant for a timer (README: cron or systemd timer, every minute). Admins only.

    Example:

        sattr retry --all
    """
    from .. import diag, gaterecord
    from ..pipeline import batch, catchup, reconcile
    from ..slurm import from_config
    from .ops import require_admin

    cfg = load_config(ctx)
    require_admin(cfg, "retry")
    slurm = from_config(cfg, timeout=10)
    # Jobs accounting saw end that the intake never got (a crash, a hook that never ran): first,
    # so that this run analyses them too (pipeline/catchup.py).
    caught = catchup.run(cfg, slurm)
    out = batch.retry_due(cfg, slurm=slurm, limit=limit, everything=everything)
    added = 0
    try:
        from ..store import Store

        store = Store(cfg.paths.database)
        # the Prolog gates' decisions first: their applied drains are in the ledger before the sweep
        gaterecord.record_all(store, cfg.paths.spool)
        added = reconcile.reconcile_all(store, slurm)
    except Exception as err:  # noqa: BLE001 - the store may be locked right now; the next run does it
        click.echo(f"(drains not reconciled from Slurm: {err})", err=True)
    gc_mod.maybe_collect(cfg)
    storeretention.maybe_prune(cfg)  # [store] keep_days, once a day
    diag.maybe_start_auto(cfg)  # [actions] auto_undrain: a detached run, its diagnostics take their time
    left = intake.entries(cfg)
    if as_json:
        echo_json({"attempted": out, "reconciled_drains": added, "pending": len(left),
                   "caught_up": caught.recorded, "catchup_error": caught.error})
        return
    for key, outcome in sorted(out.items()):
        click.echo(f"{key}\t{outcome}")
    click.echo(caught.line(), err=True)
    click.echo(f"{len(out)} attempted, {len(left)} still pending, {added} drains reconciled from Slurm", err=True)


@main.command()
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@json_option
@click.pass_context
@handle_errors
def gc(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Prune the spool by job: first a job over its live budget ([live] job_cap_bytes), then
    jobs older than [spool] keep_days; over [spool] max_bytes, the live dumps (what jobs' own
    ranks answered) largest first, then the oldest jobs until the spool fits.

    Never a pending job's data, nor a running job's live dir; a job with no verdict stored
    yet is not removed for space. Each line says why. Admins only.

    Example:

        sattr gc --dry-run
    """
    from .ops import require_admin

    cfg = load_config(ctx)
    require_admin(cfg, "gc")
    res = gc_mod.collect(cfg, dry_run=dry_run)
    if as_json:
        echo_json({"removed": res.removed, "kept_pending": res.kept_pending,
                   "kept_unverdicted": res.kept_unverdicted, "bytes_before": res.bytes_before,
                   "bytes_after": res.bytes_after, "errors": res.errors, "dry_run": dry_run})
        return
    verb = "would remove" if dry_run else "removed"
    for r in res.removed:
        click.echo(f"{verb} {r['key']} ({r['bytes']} bytes, {r['why']})")
    for k in res.kept_pending:
        click.echo(f"kept {k}: its job is pending", err=True)
    for k in res.kept_unverdicted:
        click.echo(f"kept {k}: no verdict stored for its job yet", err=True)
    for e in res.errors:
        click.echo(f"error: {e}", err=True)
    click.echo(f"spool bundles: {res.bytes_before} -> {res.bytes_after} bytes", err=True)
