"""Job-level commands: show (the default), analyze, comments."""
from __future__ import annotations

import time

import click

from .. import comment as comment_mod
from .. import drain, render
from ..analysis import run_bundle
from ..bundle import Bundle
from ..slurm import from_config
from ..store import Store
from . import main
from .options import echo_json, handle_errors, json_option, load_config, use_color


@main.command()
@click.argument("job_id")
@json_option
@click.pass_context
@handle_errors
def show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show the verdict for a job (`sattr JOBID` is the same).

    Example:

        sattr show 1234 --json
    """
    from .. import access

    cfg = load_config(ctx)
    view = access.job_view(cfg, job_id)
    if as_json:
        echo_json(view.verdict.to_dict())
        return
    click.echo(render.verdict_text(view.verdict, view.job, color=use_color(), comment_status=view.comment_status))


@main.command()
@click.argument("bundle_dir", type=click.Path(exists=True, file_okay=False))
@json_option
@click.pass_context
@handle_errors
def analyze(ctx: click.Context, bundle_dir: str, as_json: bool) -> None:
    """Analyse an evidence bundle anywhere, offline; nothing is stored or drained.

    The drain policy still runs: its decisions are listed with applied=false.

    Example:

        sattr analyze /var/spool/slurm_attr/bundles/1234 --json
    """
    cfg = load_config(ctx)
    t0 = time.monotonic()
    verdict = run_bundle(bundle_dir, cfg)
    job = Bundle(bundle_dir).job
    verdict.actions = drain.apply_policy(cfg, verdict, job, slurm=None, store=None, path="offline")
    if as_json:
        echo_json(verdict.to_dict())
        return
    click.echo(render.verdict_text(verdict, job, color=use_color()))
    click.echo(f"\n(analysed in {(time.monotonic() - t0) * 1000:.0f} ms)", err=True)


@main.command()
@click.option("--retry", is_flag=True, help="Write every queued comment now.")
@json_option
@click.pass_context
@handle_errors
def comments(ctx: click.Context, retry: bool, as_json: bool) -> None:
    """List job comments waiting for accounting, and retry them.

    Example:

        sattr comments --retry
    """
    cfg = load_config(ctx)
    store = Store(cfg.paths.database)
    if retry:
        slurm = from_config(cfg)
        ok, bad = comment_mod.retry_pending(slurm, store, cfg.comment.max_attempts)
        click.echo(f"{ok} written, {bad} still pending", err=True)
    rows = [dict(r) for r in store.db.query("select * from comments where status != 'written' order by updated_at")]
    if as_json:
        echo_json(rows)
        return
    for r in rows:
        click.echo(f"{r['job_id']}\t{r['status']}\t{r['attempts']} attempts\t{r['last_error']}")
    if not rows:
        click.echo("no comments pending")
