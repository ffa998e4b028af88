"""Commands for the drains: their history (`drains`), `undrain` (by hand, after a diagnostic, or
automatically) and the circuit breaker over automatic drains. Admins only.
"""
from __future__ import annotations

from typing import Any

import click

from .. import diag, drain, jobtext
from ..breaker import Breaker
from ..errors import SattrError
from ..slurm import default_backend
from ..store import Store
from . import main
from .ops import caller_name, cells, colored, iso, open_store, parse_since, require_admin, since_option, text_table
from .options import echo_json, handle_errors, json_option, load_config

# `drains --json` shows this much of a diagnostic's stored output tail (the store keeps more).
DIAG_OUTPUT_SHOWN = 4000

# -- drains -----------------------------------------------------------------------------


def drain_history(store: Store, since: float | None) -> list[dict[str, Any]]:
    """Every drain decision (applied, blocked, dry-run), every undrain and every diagnostic
    run before one (passed or failed), newest first."""
    out: list[dict[str, Any]] = []
    for a in store.actions(since=since, limit=5000):
        out.append({"time": a["decided_at"], "event": a["kind"], "node": a["node"], "job_id": a["job_id"],
                    "applied": bool(a["applied"]), "blocked_by": a["blocked_by"], "path": a["path"],
                    "actor": a["actor"], "reason": a["reason"]})
    for u in store.undrains(since=since, limit=5000):
        out.append({"time": u["at"], "event": "undrain", "node": u["node"], "job_id": u["job_id"] or None,
                    "applied": bool(u["ok"]), "blocked_by": None if u["ok"] else u["detail"],
                    "path": "auto" if u["actor"] == diag.AUTO_ACTOR else "manual",
                    "actor": u["actor"], "reason": u["why"], "drain_reason": u["drain_reason"]})
    for d in store.diags(since=since):
        result = diag.describe(bool(d["ok"]), d["rc"], d["took_s"], d["output"])
        out.append({"time": d["at"], "event": "diag", "node": d["node"], "job_id": None, "applied": bool(d["ok"]),
                    "blocked_by": None if d["ok"] else result, "path": d["trigger"], "actor": d["actor"],
                    "reason": d["command"], "result": result, "rc": d["rc"], "took_s": d["took_s"],
                    "output_tail": (d["output"] or "")[-DIAG_OUTPUT_SHOWN:]})
    out.sort(key=lambda r: r["time"] or 0, reverse=True)
    return out


@main.command()
@since_option("7d")
@json_option
@click.pass_context
@handle_errors
def drains(ctx: click.Context, since: str, as_json: bool) -> None:
    """Drain history: every decision (applied, blocked, dry-run) and who undrained what, and why.

    Admins only.

    Example:

        sattr drains --since 1d
    """
    cfg = load_config(ctx)
    require_admin(cfg, "drains")
    store = open_store(cfg)
    hist = drain_history(store, parse_since(since))
    brk = store.breaker()
    if as_json:
        echo_json({"decisions": [dict(h, time=iso(h["time"])) for h in hist],
                   "breaker": {"tripped": bool(brk["tripped"]), "why": brk["why"], "tripped_at": iso(brk["tripped_at"]),
                               "reset_at": iso(brk["reset_at"]), "reset_by": brk["reset_by"]}})
        return
    if brk["tripped"]:
        click.echo(colored(f"circuit breaker TRIPPED since {iso(brk['tripped_at'])}: {brk['why']}", "hardware"))
        click.echo("  automatic drains are alert-only until `sattr breaker reset`\n")
    if not hist:
        click.echo("no drain decisions in that period", err=True)
        return
    rows = []
    for h in hist:
        result = ("applied" if h["applied"] else f"blocked: {h['blocked_by']}") if h["event"] != "undrain" else \
            ("resumed" if h["applied"] else f"refused: {h['blocked_by']}")
        if h["event"] == "diag":
            result = h["result"]
        rows.append(cells(iso(h["time"]), h["node"] or "-", h["event"], result, h["job_id"] or "-", h["path"] or "-",
                           h["actor"] or "-", h["reason"] or ""))
    click.echo(text_table(rows, ["TIME", "NODE", "ACTION", "RESULT", "JOB", "PATH", "BY", "REASON / WHY"]))


# -- undrain ----------------------------------------------------------------------------


@main.command()
@click.argument("node_names", metavar="[NODE]...", nargs=-1)
@click.option("--reason", help="Why the node may go back into service (recorded with your name).")
@click.option("--diag", "with_diag", is_flag=True,
              help="Run [actions] diag_command for each node first; resume only the nodes that pass.")
@click.option("--auto", "auto", is_flag=True,
              help="One auto_undrain pass (for a timer or cron): every node we drained that is due for it "
                   "is resumed when its diagnostic passes ([actions] auto_undrain).")
@click.pass_context
@handle_errors
def undrain(ctx: click.Context, node_names: tuple[str, ...], reason: str | None, with_diag: bool, auto: bool) -> None:
    """Resume nodes that sattr drained (reason starting SATTR:), one at a time.

    A node drained or down for any other reason is refused: it is someone else's.
    Each node's state is re-read after the resume. Who and why go to the store.
    With --diag the site's diagnostic runs first and a node that fails it stays
    drained; every run is in `sattr drains`. Exits non-zero when any node was
    refused or did not resume. Admins only.

    Example:

        sattr undrain n2 --reason "dcgmi diag -r 3 passed, GPU reseated"

        sattr undrain n2 --diag --reason "GPU reseated"

        sattr undrain --auto
    """
    cfg = load_config(ctx)
    require_admin(cfg, "undrain")
    if auto:
        if node_names or with_diag:
            raise click.UsageError("--auto takes no NODE and no --diag: it looks at every node sattr drained")
        _auto(cfg)
        return
    if not node_names:
        raise click.UsageError("give the NODE(s) to resume, or --auto")
    if reason is None:
        raise click.UsageError("Missing option '--reason': say why the node may go back into service")
    if not reason.strip():
        raise click.BadParameter("give a reason", param_hint="--reason")
    if with_diag:
        diag.require_command(cfg)  # before anything runs: the message says what to set
    from ..slurm.hostlist import expand

    names: list[str] = []
    for n in node_names:
        names.extend(x for x in expand(n) if x not in names)
    store = Store(cfg.paths.database)
    slurm = default_backend(cfg.paths.slurm_bin, cfg.paths.slurm_conf, backend=cfg.slurm.backend)
    if with_diag:
        results = diag.undrain_with_diag(cfg, slurm, store, names, reason.strip(), caller_name(), runner=_announced)
    else:
        results = drain.undrain(slurm, store, names, reason.strip(), caller_name())
    failed = 0
    for r in results:
        click.echo(jobtext.line(r.message), err=not r.ok)
        failed += not r.ok
    if failed:
        raise SattrError(f"{failed} of {len(results)} node(s) not resumed")


def _announced(template: str, node: str, timeout_s: float) -> diag.DiagResult:
    """The diagnostic, said first: it can take a long time."""
    click.echo(f"{node}: running its diagnostic (at most {timeout_s:g} s)...", err=True)
    return diag.run_diag(template, node, timeout_s)


def _auto(cfg: Any) -> None:
    store = Store(cfg.paths.database)
    slurm = default_backend(cfg.paths.slurm_bin, cfg.paths.slurm_conf, backend=cfg.slurm.backend)
    out = diag.run_locked(cfg, lambda: diag.auto_undrain(cfg, slurm, store))
    if out is None:
        click.echo("another auto_undrain run is in progress: nothing done", err=True)
        return
    if not out:
        click.echo("no node is drained by sattr", err=True)
    for dec, res in out:
        click.echo(jobtext.line(res.message if res is not None else f"{dec.node}: {dec.why}"),
                   err=res is not None and not res.ok)


# -- breaker ----------------------------------------------------------------------------


@main.group()
def breaker() -> None:
    """The drain circuit breaker: status, and reset after a person has looked.

    Example:

        sattr breaker status

        sattr breaker reset --reason "bad driver rolled back"
    """


@breaker.command("status")
@json_option
@click.pass_context
@handle_errors
def breaker_status(ctx: click.Context, as_json: bool) -> None:
    """Whether the breaker is tripped, why, and how close the limits are. Admins only.

    Example:

        sattr breaker status --json
    """
    cfg = load_config(ctx)
    require_admin(cfg, "breaker status")
    store = Store(cfg.paths.database)
    try:
        slurm = default_backend(cfg.paths.slurm_bin, cfg.paths.slurm_conf, backend=cfg.slurm.backend)
    except SattrError:
        slurm = None
    st = Breaker(store, cfg.drain).status(slurm)
    if as_json:
        echo_json(st)
        return
    if st["tripped"]:
        click.echo(colored("TRIPPED", "hardware") + f" since {iso(st['tripped_at'])}: {jobtext.line(st['why'])}")
        click.echo("  automatic drains are recorded as blocked (alert-only) until `sattr breaker reset`")
    else:
        by = jobtext.line(st["reset_by"])
        click.echo(colored("closed", "none") + (f" (last reset {iso(st['reset_at'])} by {by})" if st["reset_at"] else ""))
    mode = "disabled" if not st["enabled"] else ("dry-run (records, drains nothing)" if st["dry_run"] else "enforcing")
    click.echo(f"  mode: {mode}")
    click.echo(f"  drains in window: {st['drains_in_window']} of {st['max_drains']} per {st['window_s']}s")
    for p in st["partitions"]:
        held = jobtext.line(", ".join(p["drained_by_us"]) or "none")
        click.echo(f"  partition {jobtext.line(p['partition'])}: {len(p['drained_by_us'])} of {p['total']} nodes "
                   "drained by us "
                   f"(max {p['allowed']} at {st['max_partition_percent']:g}%): {held}")
    if st.get("partitions_error"):
        click.echo(f"  (partition shares unknown: {jobtext.line(st['partitions_error'])})", err=True)


@breaker.command("reset")
@click.option("--reason", default="", help="Why it is safe to drain automatically again (recorded).")
@click.pass_context
@handle_errors
def breaker_reset(ctx: click.Context, reason: str) -> None:
    """Close the breaker: automatic drains resume; earlier drains stop counting. Admins only.

    Example:

        sattr breaker reset --reason "checked n1-n3, real hardware faults"
    """
    cfg = load_config(ctx)
    require_admin(cfg, "breaker reset")
    store = Store(cfg.paths.database)
    was = store.breaker()
    store.reset_breaker(caller_name(), reason)
    if was["tripped"]:
        click.echo(f"breaker reset (was tripped since {iso(was['tripped_at'])}: {jobtext.line(was['why'])})")
    else:
        click.echo("breaker was not tripped; the drain window starts afresh")
