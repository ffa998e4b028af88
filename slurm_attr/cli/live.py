"""`sattr live JOBID`: the live findings of a running (or ended) job."""
from __future__ import annotations

import os

import click

from .. import jobtext
from . import main
from .options import echo_json, handle_errors, json_option, load_config


def live_lines(cfg, job_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The live lines for `sattr JOBID`, [] when none or not the caller's to see (the file
    is readable by root and the job's group only; the OS enforces it)."""
    from ..live import findings, livespool

    if not livespool.valid_job(job_id):
        return []
    doc = findings.load(cfg.paths.spool, job_id)
    return findings.lines(doc) if doc else []


@main.command()
@click.argument("job_id")
@json_option
@click.pass_context
@handle_errors
def live(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Hangs detected while the job ran (or runs): class, ranks, nodes.

    Example:

        sattr live 1234
    """
    from ..live import findings, livespool

    cfg = load_config(ctx)
    doc = findings.load(cfg.paths.spool, job_id) if livespool.valid_job(job_id) else None
    if as_json:
        echo_json(doc or {"job": job_id, "findings": []})
        return
    if doc is None:
        hint = "" if os.geteuid() == 0 else " (or not readable by you)"
        click.echo(f"job {jobtext.line(job_id)}: no live findings{hint}")
        return
    for line in findings.lines(doc) or ["no hang detected"]:  # lines() makes the job's text printable
        click.echo(f"job {job_id}: {line}")
