"""Commands for operators: list, nodes, reanalyze (drains, undrain and the breaker: drains.py),
and the helpers the operators' commands share (admin check, time spans, tables).

Admins (root, SlurmUser, members of [access] admin_group) see everything. Other
users may only `sattr list` their own jobs, and only where the verdict database
is readable to them; `sattr JOBID` always works for their own jobs.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from datetime import datetime, timezone
from typing import Any

import click

from .. import access, jobtext
from ..errors import NotFound, PermissionDenied, SattrError
from ..render import in_domain_color
from ..slurm import default_backend
from ..store import Store
from . import main
from .options import echo_json, handle_errors, json_option, load_config, use_color

_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(value: str | None, now: float | None = None) -> float | None:
    """``1d``, ``12h``, ``30m``, ``2w`` (ago) or an ISO date/time -> epoch seconds."""
    if value is None or value == "":
        return None
    now = time.time() if now is None else now
    m = _SPAN.match(value)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        dt = datetime.fromisoformat(value.strip())
    except ValueError as err:
        raise click.BadParameter(f"{value!r}: use a span such as 1d, 12h, 30m, 2w, or an ISO date/time") from err
    if dt.tzinfo is None:
        dt = dt.astimezone()  # local time, as Slurm prints it
    return dt.timestamp()


def since_option(default: str) -> Any:
    return click.option("--since", default=default, show_default=True,
                        help="How far back: a span (1d, 12h, 30m, 2w) or an ISO date/time.")


def iso(ts: Any) -> str:
    if ts in (None, ""):
        return "-"
    return datetime.fromtimestamp(float(ts), timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def colored(text: str, domain: str) -> str:
    """Our colour around ``text``, which is made printable first: the colour is the only escape."""
    return in_domain_color(jobtext.line(text), domain, use_color())


def cells(*values: Any) -> list[str]:
    """A table row from stored fields, each printable: summaries, reasons and errors quote
    what jobs wrote, and the store keeps them as written."""
    return [jobtext.line(v) for v in values]


def caller_name() -> str:
    uid, name = access.caller()
    sudo = os.environ.get("SUDO_USER")
    return f"{name} (sudo from {sudo})" if uid == 0 and sudo and sudo != name else name


def require_admin(cfg: Any, command: str) -> None:
    uid, name = access.caller()
    if not access.is_admin(cfg, uid, name):
        group = f", members of {cfg.access.admin_group}" if cfg.access.admin_group else ""
        raise PermissionDenied(f"`sattr {command}` is for admins (root, SlurmUser{group}); "
                               "see your own job's verdict with `sattr JOBID`")


def open_store(cfg: Any) -> Store:
    if not os.path.exists(cfg.paths.database):
        raise NotFound(f"no verdict database at {cfg.paths.database} yet: no job has been analysed")
    return Store(cfg.paths.database)


def text_table(rows: list[list[str]], headers: list[str]) -> str:
    """Plain aligned columns, two spaces apart, no rule under the header; the last column is
    never padded (summaries, reasons). Cells are text as they are: no number alignment, their
    spaces kept (a GPU row's indent), our colours not counted in a width. The header goes in
    as the first row: tabulate pads a header row two wider than its widest cell."""
    if not rows:
        return ""
    from tabulate import tabulate  # here: 30-100 ms to import, and --json prints no table

    text = tabulate([headers, *rows], tablefmt="plain", disable_numparse=True, stralign="left",
                    preserve_whitespace=True)
    return "\n".join(line.rstrip() for line in text.split("\n"))


# -- list -------------------------------------------------------------------------------


@main.command("list")
@since_option("7d")
@click.option("--user", "user", help="Only this user's jobs.")
@click.option("--cause", help="Only this cause word (gpu_hardware, user_error, ...).")
@click.option("--node", help="Only jobs that ran on this node.")
@click.option("--limit", default=200, show_default=True, help="At most this many jobs, newest first.")
@click.option("--pending", is_flag=True, help="Ended jobs still waiting for a stored verdict (admins).")
@json_option
@click.pass_context
@handle_errors
def list_jobs(ctx: click.Context, since: str, user: str | None, cause: str | None, node: str | None, limit: int,
              pending: bool, as_json: bool) -> None:
    """List analysed jobs, newest first, with their verdicts.

    Users who are not admins see only their own jobs (where the verdict database
    is readable to them).

    Example:

        sattr list --since 1d --cause gpu_hardware

        sattr list --node n2 --json

        sattr list --pending
    """
    cfg = load_config(ctx)
    if pending:
        _list_pending(cfg, as_json)
        return
    uid, name = access.caller()
    if not access.is_admin(cfg, uid, name):
        if user and user != name:
            raise PermissionDenied(f"you can list only your own jobs (you are {name})")
        if not access.can_read_database(cfg.paths.database):
            raise PermissionDenied("the verdict database is readable only by admins here: "
                                   "use `sattr JOBID` for one of your jobs (it reads your copy of its verdict)")
        user = name
    store = open_store(cfg)
    rows = store.jobs(since=parse_since(since), user=user, cause=cause, node=node, limit=limit)
    out = []
    for r in rows:
        out.append({
            "job_id": r["job_id"], "user": r.get("user"), "partition": r.get("partition"), "state": r.get("state"),
            "nodes": json.loads(r.get("nodes") or "[]"), "cause": r.get("cause"), "domain": r.get("domain"),
            "culprit_nodes": json.loads(r.get("culprit_nodes") or "[]"), "summary": r.get("summary") or "",
            "analyzed_at": iso(r.get("analyzed_at")) if r.get("analyzed_at") else None,
        })
    if as_json:
        echo_json(out)
        return
    if not out:
        click.echo("no analysed jobs match", err=True)
        return
    table = [[*cells(o["job_id"], o["user"] or "-", o["state"] or "-"),
              colored(o["cause"] or "?", o["domain"] or "unknown"),
              *cells(",".join(map(str, o["culprit_nodes"])) or "-", o["analyzed_at"] or "-", o["summary"][:90])]
             for o in out]
    click.echo(text_table(table, ["JOB", "USER", "STATE", "CAUSE", "CULPRIT", "ANALYSED", "SUMMARY"]))


def _list_pending(cfg: Any, as_json: bool) -> None:
    from ..pipeline import intake

    require_admin(cfg, "list --pending")
    rows = intake.entries(cfg)
    if as_json:
        echo_json([{"job_id": d.get("job_id"), "key": d["key"], "since": iso(d.get("since")),
                    "attempts": int(d.get("attempts") or 0), "next_try": iso(d.get("next_try")),
                    "last_error": d.get("last_error") or "", "partial_stored": bool(d.get("partial_stored")),
                    "note": d.get("note") or ""} for d in rows])
        return
    if not rows:
        click.echo("no pending jobs", err=True)
        return
    table = [cells(d.get("job_id") or d["key"], iso(d.get("since")), int(d.get("attempts") or 0),
                    iso(d.get("next_try")), "partial" if d.get("partial_stored") else "-",
                    (d.get("last_error") or "-")[:120]) for d in rows]
    click.echo(text_table(table, ["JOB", "PENDING SINCE", "ATTEMPTS", "NEXT TRY", "STORED", "LAST ERROR"]))


# -- reanalyze --------------------------------------------------------------------------


@main.command()
@click.argument("job_ids", metavar="[JOBID]...", nargs=-1)
@click.option("--since", help="Every job analysed since then: a span (1d, 12h) or an ISO date/time.")
@json_option
@click.pass_context
@handle_errors
def reanalyze(ctx: click.Context, job_ids: tuple[str, ...], since: str | None, as_json: bool) -> None:
    """Analyse stored bundles again (after a rule update), replacing their verdicts.

    Runs the whole after-the-job flow: verdict, store, drain policy, job comment.
    A node already drained for a job is not drained again. Admins only.

    Example:

        sattr reanalyze 1234

        sattr reanalyze --since 2d
    """
    from ..pipeline.finish import finish_job

    cfg = load_config(ctx)
    require_admin(cfg, "reanalyze")
    if not job_ids and not since:
        raise click.UsageError("give job ids or --since")
    store = open_store(cfg)
    wanted = list(job_ids)
    if since:
        wanted += [r["job_id"] for r in store.jobs(since=parse_since(since), limit=100_000) if r["job_id"] not in wanted]
    todo: list[tuple[str, str, str]] = []
    for jid in wanted:
        job = store.job(jid)
        path = job.get("bundle_path") or ""
        if not path or not os.path.isdir(path):
            raise NotFound(f"job {jid}: its bundle {path or '(none recorded)'} is gone; nothing to re-analyse")
        try:
            before = store.verdict(jid).cause
        except NotFound:
            before = "-"
        todo.append((jid, path, before))
    # Every node part that will ever arrive is there already.
    run_cfg = dataclasses.replace(cfg, analysis=dataclasses.replace(cfg.analysis, node_wait_s=0.0))
    slurm = default_backend(cfg.paths.slurm_bin, cfg.paths.slurm_conf, timeout=10, comment_tool=cfg.paths.comment_tool,
                            backend=cfg.slurm.backend)
    results = []

    def one(item: tuple[str, str, str]) -> None:
        jid, path, before = item
        try:
            v = finish_job(run_cfg, slurm, store, path)
            results.append({"job_id": jid, "before": before, "cause": v.cause, "summary": v.summary, "error": None})
        except (SattrError, OSError) as err:
            results.append({"job_id": jid, "before": before, "cause": None, "summary": "", "error": str(err)})

    if len(todo) > 1 and not as_json:
        with click.progressbar(todo, label="re-analysing", file=click.get_text_stream("stderr")) as bar:
            for item in bar:
                one(item)
    else:
        for item in todo:
            one(item)
    if as_json:
        echo_json(results)
    else:
        for r in results:
            if r["error"]:
                click.echo(f"{r['job_id']}: failed: {jobtext.line(r['error'])}", err=True)
            else:
                change = "" if r["before"] == r["cause"] else f" (was {r['before']})"
                click.echo(jobtext.line(f"{r['job_id']}: {r['cause']}{change}  {r['summary']}"))
    if any(r["error"] for r in results):
        raise SattrError(f"{sum(1 for r in results if r['error'])} job(s) could not be re-analysed")
