"""Job-level commands: show (the default), analyze, comments."""
from __future__ import annotations

import time
from typing import Any

import click

from .. import drain, jobtext, render
from ..bundleanalysis import run_bundle
from ..bundle import Bundle
from ..errors import SattrError
from . import main
from .options import echo_json, handle_errors, json_option, load_config, use_color


_why_option = click.option("--why", "why", is_flag=True,
                           help="Also say why the cause won: the reasoning's decisions, in order.")


def why_lines(reasoning: list[str]) -> list[str]:
    """The verdict's ``reasoning`` for a person; job text in it made printable."""
    if not reasoning:
        return ["", "Why: no decision was needed (one cause, or none in evidence)."]
    return ["", "Why:"] + [f"  - {jobtext.line(r)}" for r in reasoning]


def admin_comment_line(cfg: Any, view: Any) -> str:
    """What accounting's AdminComment holds now, for a job whose verdict went there: read back
    (one sacct call) rather than taken from the queue, so an admin sees what Slurm shows."""
    entry = next((c for c in view.comments if c.get("field") == "AdminComment"), None)
    if entry is None:
        return ""
    if entry.get("status") == "skipped":
        return f"AdminComment: {jobtext.line(entry.get('last_error') or 'skipped')}"
    from ..slurm import default_backend

    raw = str(entry.get("slurm_job_id") or entry["job_id"])
    try:
        now = default_backend(cfg.paths.slurm_bin, cfg.paths.slurm_conf, timeout=5).job_comment(raw, "AdminComment")
    except SattrError as err:
        return f"AdminComment: not read from accounting ({jobtext.line(str(err))[:120]}); queue: {entry.get('status')}"
    return f"AdminComment (accounting): {jobtext.line(now or '(empty)')}" + \
        ("" if entry.get("status") == "written" else f"  [queue: {entry.get('status')}]")


@main.command()
@click.argument("job_id")
@json_option
@_why_option
@click.pass_context
@handle_errors
def show(ctx: click.Context, job_id: str, as_json: bool, why: bool = False) -> None:
    """Show the verdict for a job (`sattr JOBID` is the same).

    Example:

        sattr show 1234 --json
        sattr 1234 --why
    """
    from .. import access

    from ..errors import NotFound
    from .pending import pending_line

    cfg = load_config(ctx)
    try:
        view = access.job_view(cfg, job_id)
    except NotFound:
        waiting = pending_line(cfg, job_id)  # the durable intake: ended, verdict not stored yet
        if waiting is None:
            from .live import live_lines  # a running job: what its live watcher found so far

            running = live_lines(cfg, job_id)
            if not running:
                raise
            click.echo("\n".join(f"job {job_id}: {line}" for line in running))
            return
        click.echo(f"job {job_id}: {jobtext.line(waiting)}")
        return
    if as_json:
        out = view.verdict.to_dict()
        if view.earlier:  # additive: a requeued job's earlier attempts
            out["earlier_attempts"] = view.earlier
        echo_json(out)
        return
    click.echo(render.verdict_text(view.verdict, view.job, color=use_color(), comment_status=view.comment_status))
    for e in view.earlier:
        nodes = f" on {','.join(e['culprit_nodes'])}" if e["culprit_nodes"] else ""
        click.echo(f"\nEarlier attempt ({jobtext.line(e['bundle_key'])}): {e['cause']}{nodes} - {jobtext.line(e['summary'] or '')}")
    admin = admin_comment_line(cfg, view)
    if admin:
        click.echo(f"\n{admin}")
    if why:
        click.echo("\n".join(why_lines(view.verdict.reasoning)))
    waiting = pending_line(cfg, job_id)
    if waiting:  # a partial verdict, to be replaced by a retry
        click.echo(f"\n{jobtext.line(waiting)}")


@main.command()
@click.argument("bundle_dir", type=click.Path(exists=True, file_okay=False))
@json_option
@_why_option
@click.pass_context
@handle_errors
def analyze(ctx: click.Context, bundle_dir: str, as_json: bool, why: bool = False) -> None:
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
    if why:
        click.echo("\n".join(why_lines(verdict.reasoning)))
    click.echo(f"\n(analysed in {(time.monotonic() - t0) * 1000:.0f} ms)", err=True)


@main.command()
@click.option("--retry", is_flag=True, help="Write every queued comment now.")
@click.option("--verify", is_flag=True,
              help="Check that accounting still shows our part of recently written comments; re-apply it where not.")
@click.option("--since", default="6h", show_default=True,
              help="With --verify: comments written this long ago at most (Nm, Nh, Nd). Keep it above MinJobAge.")
@json_option
@click.pass_context
@handle_errors
def comments(ctx: click.Context, retry: bool, verify: bool, since: str, as_json: bool) -> None:
    """List job comments waiting for accounting, retry them, verify written ones.

    A slurmctld restart resets the Comment of finished jobs still in its memory (within
    MinJobAge) to the user's own text; `--verify`, run by a timer, puts our part back.

    Example:

        sattr comments --retry --verify --since 6h
    """
    from .. import comment as comment_mod  # here, not at the top: `sattr analyze` needs no database
    from ..slurm import from_config
    from ..store import Store
    from .ops import parse_since

    cfg = load_config(ctx)
    store = Store(cfg.paths.database)
    slurm = from_config(cfg) if (retry or verify) else None
    if retry:
        ok, bad = comment_mod.retry_pending(slurm, store, cfg.comment.max_attempts, cfg.comment.max_len)
        click.echo(f"{ok} written, {bad} still pending", err=True)
    if verify:
        start = parse_since(since)
        window = time.time() - start if start is not None else 6 * 3600.0
        got = comment_mod.verify_recent(slurm, store, window, cfg.comment.max_attempts, cfg.comment.max_len)
        click.echo(f"{len(got['ok'])} verified, {len(got['reapplied'])} re-applied, {len(got['failed'])} failed, "
                   f"{len(got['missing'])} not in accounting", err=True)
        for job_id in got["reapplied"]:
            click.echo(f"re-applied {jobtext.line(job_id)}", err=True)
    rows = [dict(r) for r in store.db.query("select * from comments where status != 'written' order by updated_at")]
    if as_json:
        echo_json(rows)
        return
    for r in rows:
        click.echo("\t".join(jobtext.line(r[k]) for k in ("job_id", "status")) + f"\t{r['attempts']} attempts\t"
                   + jobtext.line(r["last_error"]))
    if not rows:
        click.echo("no comments pending")
