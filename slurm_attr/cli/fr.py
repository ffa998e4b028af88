"""`sattr fr` (the divergence matrix in a terminal) and `sattr report --html` (one HTML file)."""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import click

from .. import access, flightrec, jobtext
from ..config import Config
from ..errors import NotFound, PermissionDenied
from ..flightrec.matrixhtml import render_html
from ..flightrec.matrix import build_matrix, render_text
from . import main
from .options import echo_json, handle_errors, json_option, load_config, use_color


# A bundle's name under the spool: the raw job id (an array task's own), ".rN" for a requeue.
_BUNDLE = re.compile(r"(\d{1,12}(?:_\d{1,9})?)(?:\.r\d{1,4})?")


def resolve(ref: str, cfg: Config) -> str:
    """A job's bundle directory: REF itself when it is a directory, else <spool>/bundles/REF.

    A job's bundle (named by its id, or a directory of the spool's) is the caller's only
    as `sattr JOB` allows: another user's job is refused with its message, and a bundle the
    caller cannot read is refused too, never shown as an empty "no divergence"."""
    bundles = os.path.join(cfg.paths.spool, "bundles")
    path = ref if os.path.isdir(ref) else os.path.join(bundles, ref)
    full = os.path.abspath(path)  # not resolved: a link in the spool still names its job
    in_spool = os.path.realpath(os.path.dirname(full)) == os.path.realpath(bundles)
    job = _BUNDLE.fullmatch(os.path.basename(full)) if in_spool else None
    if job is not None:
        access.check_job(cfg, job.group(1))
    if not os.path.isdir(path):
        raise NotFound(f"no bundle for job {ref} (looked in {path}); pass a bundle or dump directory instead")
    _check_readable(path, job.group(1) if job else None)
    return path


def _check_readable(path: str, job: str | None) -> None:
    """A directory whose files this caller cannot open would read as a job with no findings."""
    top = os.path.join(path, "job.json")
    if os.access(path, os.R_OK | os.X_OK) and (not os.path.exists(top) or os.access(top, os.R_OK)):
        return
    if job is None:
        raise PermissionDenied(f"{path}: not readable by you")
    raise PermissionDenied(f"the bundle of job {job} is readable only by admins here ({path}); "
                           f"`sattr {job}` shows your job's verdict")


def _printable(m: flightrec.Matrix) -> flightrec.Matrix:
    """The matrix with the dumps' names (groups, signatures) made printable; our colours go on
    in render_text, after."""
    line = jobtext.line
    panels = [dataclasses.replace(p, pg=line(p.pg), label=line(p.label), title=line(p.title),
                                  rows=[dataclasses.replace(r, note=line(r.note)) for r in p.rows]) for p in m.panels]
    return dataclasses.replace(m, panels=panels, legend={k: line(v) for k, v in m.legend.items()})


def _matrix_dict(m: flightrec.Matrix) -> dict[str, Any]:
    return {
        "legend": m.legend,
        "hidden_groups": m.hidden_groups,
        "panels": [
            {
                "pg": p.pg, "label": p.label, "members": p.members, "role": p.role, "title": p.title,
                "seqs": p.seqs, "divergent_seq": p.divergent_seq,
                "rows": [{"ranks": r.ranks, "culprit": r.culprit, "note": r.note,
                          "cells": ["".join((c.sym, "!" if c.culprit else "")) for c in r.cells]} for r in p.rows],
            }
            for p in m.panels
        ],
    }


@main.command("fr")
@click.argument("ref")
@click.option("--all", "all_groups", is_flag=True, help="Also show process groups without findings.")
@click.option("--before", default=8, show_default=True, help="Columns shown before the first divergence.")
@click.option("--after", default=3, show_default=True, help="Columns shown after it.")
@click.option("--full-history", is_flag=True, help="Compare every entry of every dump, with no time budget (slower on large jobs).")
@json_option
@click.pass_context
@handle_errors
def fr_command(ctx: click.Context, ref: str, all_groups: bool, before: int, after: int, full_history: bool, as_json: bool) -> None:
    """Flight Recorder divergence matrix of a job: which rank broke which collective.

    REF is a job id (its bundle under the spool) or a directory: a bundle, or
    a directory of dumps as torch wrote them. Rows are ranks grouped by
    process group, columns collective sequence numbers, letters signatures
    (see the legend); the first divergent column is marked.

    Example:

        sattr fr 1234

        sattr fr /var/tmp/fr_dumps --all
    """
    cfg = load_config(ctx)
    path = resolve(ref, cfg)
    rep = flightrec.inspect(path, cfg, tail_entries=None if full_history else flightrec.loader.DEFAULT_TAIL_ENTRIES,
                            budget=not full_history)  # asked for every entry: no time budget cuts the read short
    m = build_matrix(rep.dumps, rep.analysis, all_groups=all_groups, before=before, after=after)
    if as_json:
        echo_json({
            "source": path,
            "symptoms": [s.to_dict() for s in rep.symptoms],
            "coverage": [c.to_dict() for c in rep.coverage],
            "matrix": _matrix_dict(m),
            "seconds": round(rep.seconds, 3),
        })
        return
    color = use_color()
    for s in rep.symptoms:
        mark = {"root": "root", "context": "note"}.get(s.role, "downstream")
        line = f"[{mark}] {jobtext.line(s.summary)}"
        click.echo(click.style(line, fg="red", bold=True) if color and s.role == "root" else line)
        fd = s.fields.get("first_differing_frame")
        if s.role == "root" and isinstance(fd, dict):
            click.echo(f"        first differing frame: {jobtext.line(fd.get('culprit'))}  "
                       f"(others: {jobtext.line(fd.get('majority'))})")
    if rep.symptoms:
        click.echo("")
    click.echo(render_text(_printable(m), color=color), nl=False)
    bad = [c for c in rep.coverage if c.status != "ok"]
    for c in bad:
        click.echo(f"coverage: {jobtext.line(c.status)}: {jobtext.line(c.node or '-')}: {jobtext.line(c.detail)}")


def _verdict(path: str, cfg: Config) -> tuple[dict[str, Any] | None, str]:
    """The full verdict when the analysis pipeline is there (slurm_attr.bundleanalysis.run_bundle).

    Returns (verdict dict or None, why not): the FR part of the report stands on
    its own, so a missing or failing pipeline only leaves the verdict out.
    """
    try:
        from ..bundleanalysis import run_bundle
    except ImportError:
        return None, "the analysis pipeline is not installed"
    try:
        verdict = run_bundle(path, cfg)
    except ImportError as err:
        return None, f"the analysis pipeline is incomplete: {err}"
    except Exception as err:  # the report must still show the FR findings
        return None, f"the verdict could not be computed: {type(err).__name__}: {err}"
    if hasattr(verdict, "to_dict"):
        return verdict.to_dict(), ""
    if dataclasses.is_dataclass(verdict):
        return dataclasses.asdict(verdict), ""
    return (verdict, "") if isinstance(verdict, dict) else (None, "the verdict has an unknown form")


@main.command("report")
@click.argument("ref", required=False)
@click.option("--html", "html_path", type=click.Path(dir_okay=False, writable=True), help="Write the report to this file.")
@click.option("--all", "all_groups", is_flag=True, help="Also show process groups without findings.")
@click.option("--fleet", is_flag=True, help="The whole fleet instead of one job (admins): GPU-hours lost by cause, "
              "lemon nodes and GPUs, drains; see docs/fleet.md.")
@click.option("--since", default="30d", show_default=True, help="With --fleet: how far back (30d, 12h, an ISO date).")
@click.option("--json", "as_json", is_flag=True, help="With --fleet: print the report's data as JSON.")
@click.option("--public", is_flag=True, help="With --fleet: leave out user names and the per-user section.")
@click.pass_context
@handle_errors
def report_command(ctx: click.Context, ref: str | None, html_path: str | None, all_groups: bool, fleet: bool,
                   since: str, as_json: bool, public: bool) -> None:
    """Write one self-contained HTML report of a job (verdict, FR findings, divergence matrix),
    or with --fleet of the whole cluster.

    Example:

        sattr report 1234 --html job1234.html

        sattr report --fleet --since 30d --html fleet.html
    """
    if fleet:
        if ref:
            raise click.UsageError("sattr report --fleet takes no job")
        from .fleet import fleet_report_command

        fleet_report_command(ctx, since, html_path, as_json, public)
        return
    if not ref or not html_path:
        raise click.UsageError("sattr report JOB --html FILE (or sattr report --fleet)")
    cfg = load_config(ctx)
    path = resolve(ref, cfg)
    rep = flightrec.inspect(path, cfg)
    m = build_matrix(rep.dumps, rep.analysis, all_groups=all_groups)
    verdict, why = None, "not a bundle (no job.json, no nodes/): Flight Recorder findings only"
    if os.path.isdir(os.path.join(path, "nodes")) or os.path.isfile(os.path.join(path, "job.json")):
        verdict, why = _verdict(path, cfg)
    title = f"slurm-attr report: {verdict['job_id'] if verdict else os.path.basename(os.path.abspath(path))}"
    page = render_html(m, rep.symptoms, rep.coverage, title=title, verdict=verdict, note=why if verdict is None else "")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(page)
    click.echo(f"wrote {html_path}")
