"""The verdict store's own upkeep: `sattr prune` (retention, slurm_attr/storeretention.py)."""
from __future__ import annotations

import time

import click

from . import main
from .options import echo_json, handle_errors, json_option, load_config


@main.command()
@click.option("--days", type=float, default=None,
              help="Keep jobs analysed within this many days (default: [store] keep_days; at least 31).")
@click.option("--dry-run", is_flag=True, help="Count what would go; remove nothing.")
@json_option
@click.pass_context
@handle_errors
def prune(ctx: click.Context, days: float | None, dry_run: bool, as_json: bool) -> None:
    """Remove jobs analysed longer ago than [store] keep_days from the verdict store: their
    verdicts, symptoms, evidence, comments, earlier attempts and fleet rows, and older requeues,
    recoveries, diagnostics and undrains. Each node's newest drain record and the breaker stay.
    The analysis workers do this once a day by themselves. Admins only.

    Example:

        sattr prune --dry-run --days 180
    """
    from ..store import Store
    from ..storeretention import MIN_KEEP_DAYS, prune as prune_store
    from .ops import require_admin

    cfg = load_config(ctx)
    require_admin(cfg, "prune")
    keep = cfg.store.keep_days if days is None else days
    if keep != 0 and keep < MIN_KEEP_DAYS:
        raise click.BadParameter(f"at least {MIN_KEEP_DAYS:g} days (the reasoning reads 30 days back), or 0", param_hint="--days")
    res = prune_store(Store(cfg.paths.database), keep, dry_run=dry_run)
    if as_json:
        echo_json(res.as_dict())
        return
    if keep == 0:
        click.echo("[store] keep_days = 0: everything is kept")
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {res.jobs} jobs analysed before {time.strftime('%Y-%m-%d %H:%M', time.localtime(res.cutoff))}")
    for table, n in sorted(res.rows.items()):
        if n:
            click.echo(f"  {table}: {n} rows")
