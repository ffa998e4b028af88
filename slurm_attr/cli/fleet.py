"""The fleet view's commands: `sattr nodes` (per node and GPU), `sattr metrics` (Prometheus),
and the fleet half of `sattr report --fleet` (fleet_report_command, called by cli/fr.py).
Admins only: the store is root's."""
from __future__ import annotations

import json
import time
from typing import Any

import click

from .. import jobtext
from ..atomicfile import write_atomic
from ..errors import SattrError, SlurmError
from ..slurm import default_backend
from ..slurmstate import NodeState
from ..store import Store
from . import main
from .ops import cells, open_store, parse_since, require_admin, since_option, text_table
from .options import echo_json, handle_errors, json_option, load_config


def node_report(store: Store, since: float | None, slurm_nodes: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Per node and GPU: verdicts it was the culprit of, GPU-hours those jobs lost, trusted
    hardware symptoms, recurrence, current drain state. Worst first."""
    from ..fleet import queries

    since = since or 0.0
    nodes: dict[str, dict[str, Any]] = {}
    hardware = set(queries.hardware_causes())

    def entry(n: str) -> dict[str, Any]:
        return nodes.setdefault(n, {"node": n, "jobs": 0, "culprit_of": {}, "gpu_hours_lost": 0.0, "hardware_symptoms": 0,
                                    "hardware_jobs": set(), "gpus": {}, "state": None, "reason": None})

    for node, c in queries.node_culprits(store, since).items():
        entry(node).update(c)
    for r in store.db.query("select node, gpu, rule_id, cause, job_id from symptoms where trusted = 1 and node is not null "
                            "and seen_at >= ?", [since]):
        if r["cause"] not in hardware:
            continue
        e = entry(r["node"])
        e["hardware_symptoms"] += 1
        e["hardware_jobs"].add(r["job_id"])
        g = e["gpus"].setdefault(r["gpu"] or "-", {})
        g.setdefault(r["rule_id"], set()).add(r["job_id"])
    saved = queries.live_saved_by_node(store, since)
    for node, h in saved.items():
        if node != "-":
            entry(node)
    for rec in slurm_nodes or []:
        st = NodeState.from_record(rec)
        if not st.name:
            continue
        e = entry(st.name)
        e["state"] = "+".join(sorted(w.lower() for w in st.words)) or None
        e["reason"] = st.reason or None
        e["drained_by_us"] = st.out_of_service and st.ours
    out = []
    for e in nodes.values():
        gpus = []
        for gpu, rules in sorted(e["gpus"].items()):
            rec = {rule: len(jobs) for rule, jobs in sorted(rules.items())}
            gpus.append({"gpu": gpu, "symptoms": rec, "recurring": sorted(r for r, n in rec.items() if n > 1)})
        out.append({
            "node": e["node"], "jobs": e["jobs"], "culprit_of": dict(sorted(e["culprit_of"].items())),
            "gpu_hours_lost": round(e["gpu_hours_lost"], 3),
            # GPU-hours the live watcher's cancels of hung jobs on the node spared (issue 26)
            "gpu_hours_saved": round(saved.get(e["node"], 0.0), 3),
            "hardware_symptoms": e["hardware_symptoms"], "hardware_jobs": len(e["hardware_jobs"]), "gpus": gpus,
            "recurring": any(g["recurring"] for g in gpus) or len(e["hardware_jobs"]) > 1,
            "state": e["state"], "reason": e["reason"], "drained_by_us": bool(e.get("drained_by_us")),
        })
    out.sort(key=lambda e: (-e["hardware_jobs"], -sum(e["culprit_of"].values()), -e["gpu_hours_lost"],
                            not e["drained_by_us"], -e["jobs"], e["node"]))
    return out


def _gpu_hours(v: float) -> str:
    return "-" if not v else f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def _slurm_nodes(cfg: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    try:
        return default_backend(cfg.paths.slurm_bin, cfg.paths.slurm_conf, backend=cfg.slurm.backend).nodes(), None
    except SlurmError as err:
        return None, str(err)


@main.command()
@since_option("30d")
@json_option
@click.pass_context
@handle_errors
def nodes(ctx: click.Context, since: str, as_json: bool) -> None:
    """Per node and GPU: verdicts, GPU-hours lost (and spared by live cancels), hardware
    symptoms, recurrence and drain state, worst first.

    A GPU whose symptom recurs across jobs is a lemon candidate. GPU-hours lost: allocated
    GPUs x elapsed hours of the failed jobs that named the node as culprit (shared among a
    job's culprits). Admins only.

    Example:

        sattr nodes --since 7d
    """
    cfg = load_config(ctx)
    require_admin(cfg, "nodes")
    store = open_store(cfg)
    slurm_nodes, err = _slurm_nodes(cfg)
    report = node_report(store, parse_since(since), slurm_nodes)
    if as_json:
        echo_json(report)
        return
    if err:
        click.echo(f"(Slurm not reachable, drain state unknown: {jobtext.line(err)})", err=True)
    if not report:
        click.echo("no nodes seen yet", err=True)
        return
    rows = []
    for e in report:
        culprit = ", ".join(f"{c} {n}" for c, n in e["culprit_of"].items()) or "-"
        state = e["state"] or "?"
        if e["reason"]:
            state += f" ({e['reason']})"
        rows.append(cells(e["node"], e["jobs"], culprit, _gpu_hours(e["gpu_hours_lost"]), _gpu_hours(e["gpu_hours_saved"]),
                          f"{e['hardware_symptoms']} in {e['hardware_jobs']} jobs" if e["hardware_symptoms"] else "-",
                          "yes" if e["recurring"] else "-", state))
        for g in e["gpus"]:
            syms = ", ".join(f"{r} x{n}" for r, n in g["symptoms"].items())
            rows.append(cells(f"  gpu {g['gpu']}", "", "", "", "", syms, ", ".join(g["recurring"]) or "-", ""))
    click.echo(text_table(rows, ["NODE", "JOBS", "CULPRIT OF", "GPU-H LOST", "GPU-H SAVED", "HARDWARE SYMPTOMS", "RECURRING",
                                 "STATE"]))


@main.command()
@click.option("--listen", metavar="ADDR", help="Serve /metrics on HOST:PORT (e.g. 127.0.0.1:9817) until stopped.")
@click.option("--textfile", "textfile", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write a node_exporter textfile (atomically, it should end in .prom) and exit.")
@click.pass_context
@handle_errors
def metrics(ctx: click.Context, listen: str | None, textfile: str | None) -> None:
    """The fleet's metrics in Prometheus' exposition format (docs/metrics.md).

    Without options: printed. --textfile: for node_exporter's textfile collector (a timer
    every minute keeps the pending queue's age fresh between verdicts; the analysis workers
    rewrite [metrics] textfile after their verdicts, at most every 5 s). --listen: a direct scrape,
    each one read from the store. Admins only.

    Example:

        sattr metrics --listen 127.0.0.1:9817
    """
    from ..configcheck import host_port
    from ..fleet import metrics as fm

    cfg = load_config(ctx)
    require_admin(cfg, "metrics")
    store = open_store(cfg)
    cluster = fm.cluster_name(cfg)
    if listen:
        try:
            host, port = host_port(listen)
        except ValueError as err:
            raise click.BadParameter(f"{listen!r}: {err}", param_hint="--listen") from err
        fm.serve(host, port, cfg, store, cluster)
        return
    if textfile:
        fm.write_textfile(textfile, store, cluster, fm.pending_of(cfg))
        click.echo(f"wrote {textfile}")
        return
    click.echo(fm.render_text(store, cluster, fm.pending_of(cfg)).decode(), nl=False)


def fleet_report_command(ctx: click.Context, since: str, html_path: str | None, as_json: bool, public: bool) -> None:
    """`sattr report --fleet` (registered on cli/fr.py's report command)."""
    from ..fleet import facts
    from ..fleet import metrics as fm

    cfg = load_config(ctx)
    require_admin(cfg, "report --fleet")
    if not html_path and not as_json:
        raise click.UsageError("sattr report --fleet needs --html FILE or --json")
    store = open_store(cfg)
    slurm_nodes, err = _slurm_nodes(cfg)
    if err:
        click.echo(f"(Slurm not reachable, node states unknown: {jobtext.line(err)})", err=True)
    data = facts.fleet_report(store, parse_since(since), cluster=fm.cluster_name(cfg), pending=fm.pending_of(cfg),
                              slurm_nodes=slurm_nodes, admin=not public, now=time.time(),
                              lemon_verdicts=cfg.metrics.lemon_verdicts)
    if html_path:
        from ..fleet.html import render_fleet_html

        page = render_fleet_html(data)
        try:
            # Readable by the web server that shows it, as open() under the usual umask made it.
            write_atomic(html_path, page.encode("utf-8"), mode=0o644, durable=False)
        except OSError as err:
            raise SattrError(f"cannot write {html_path}: {err}") from err
        click.echo(f"wrote {html_path}", err=as_json)
    if as_json:
        click.echo(json.dumps(data, indent=1))
