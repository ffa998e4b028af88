"""The fleet's numbers in Prometheus' exposition format (docs/metrics.md), with prometheus-client.

A custom collector reads the store at each render (queries.py): a scrape equals what `sattr`
reports, nothing is counted in memory, and a restarted server loses nothing. Served the two
ways sites collect: a node_exporter textfile rewritten atomically after the worker's verdicts
(``publish``) and ``sattr metrics --listen`` (``serve``).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..config import Config
from ..store import Store
from . import queries

log = logging.getLogger("slurm_attr")

ANALYSIS_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
LIVE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
HARDWARE_WINDOW_S = 7 * 86400


def _hist(name: str, doc: str, cluster: str, bounds: tuple[float, ...], cumulative: list[int],
          count: int, total: float) -> HistogramMetricFamily:
    h = HistogramMetricFamily(name, doc, labels=["cluster"])
    buckets = [(repr(float(b)), c) for b, c in zip(bounds, cumulative)] + [("+Inf", count)]
    h.add_metric([cluster], buckets, total)
    return h


class StoreCollector(Collector):
    """Every metric of docs/metrics.md from one store; ``pending`` is the intake queue's
    (count, oldest entry's epoch) or None where the caller has no queue (a copied store)."""

    def __init__(self, store: Store, cluster: str, pending: tuple[int, float | None] | None = None,
                 now: float | None = None):
        self.store, self.cluster, self.pending, self.now = store, cluster, pending, now

    def collect(self) -> Iterator[Metric]:
        now = self.now if self.now is not None else time.time()
        yield from self._verdicts()
        yield from self._nodes(now)
        yield from self._actions()
        yield from self._queue(now)
        yield from self._latencies()

    def _verdicts(self) -> Iterator[Metric]:
        st, c = self.store, self.cluster
        groups = queries.verdict_groups(st)
        verdicts = CounterMetricFamily("sattr_verdicts", "Verdicts stored (one per job attempt).",
                                       labels=["cluster", "partition", "cause", "domain"])
        lost: dict[tuple[str, str], float] = {}
        for g in groups:
            verdicts.add_metric([c, g["partition"], g["cause"], g["domain"]], g["jobs"])
            key = (g["partition"], g["cause"])
            lost[key] = lost.get(key, 0.0) + float(g["gpu_hours"] or 0.0)
        yield verdicts
        # GPU-seconds, Prometheus' base unit (promtool flags "hours"); a dashboard divides by 3600.
        gh = CounterMetricFamily("sattr_lost_gpu_seconds",
                                 "Allocated GPUs x elapsed seconds of analysed jobs that did not complete.",
                                 labels=["cluster", "partition", "cause"])
        for (part, cause), v in sorted(lost.items()):
            gh.add_metric([c, part, cause], round(v * 3600.0, 3))
        yield gh

    def _nodes(self, now: float) -> Iterator[Metric]:
        st, c = self.store, self.cluster
        nv = CounterMetricFamily("sattr_node_verdicts", "Verdicts naming the node as a culprit.",
                                 labels=["cluster", "node", "domain"])
        per_node: dict[tuple[str, str], int] = {}
        for r in queries.node_verdicts(st):
            per_node[(r["node"], r["domain"])] = per_node.get((r["node"], r["domain"]), 0) + int(r["verdicts"])
        for (node, domain), n in sorted(per_node.items()):
            nv.add_metric([c, node, domain], n)
        yield nv
        lemon = GaugeMetricFamily("sattr_node_hardware_verdicts_7d",
                                  "Hardware verdicts naming the node as culprit in the last 7 days.",
                                  labels=["cluster", "node"])
        for node, n in sorted(queries.node_hardware_recent(st, now, HARDWARE_WINDOW_S).items()):
            lemon.add_metric([c, node], n)
        yield lemon
        hw = CounterMetricFamily("sattr_hardware_events",
                                 "Distinct trusted hardware events (kernel-log symptoms) per node, GPU and rule.",
                                 labels=["cluster", "node", "gpu", "event"])
        for r in queries.hardware_events(st):
            hw.add_metric([c, r["node"], r["gpu"], r["event"]], r["events"])
        yield hw

    def _actions(self) -> Iterator[Metric]:
        st, c = self.store, self.cluster
        drains = CounterMetricFamily("sattr_drains", "Automatic drain/reboot decisions by outcome.",
                                     labels=["cluster", "outcome"])
        for outcome, n in queries.drain_outcomes(st).items():
            drains.add_metric([c, outcome], n)
        yield drains
        und = CounterMetricFamily("sattr_undrains", "Nodes resumed by sattr undrain, by outcome.",
                                  labels=["cluster", "outcome"])
        for outcome, n in queries.undrain_outcomes(st).items():
            und.add_metric([c, outcome], n)
        yield und
        br = GaugeMetricFamily("sattr_breaker_tripped", "1 while the circuit breaker is tripped.",
                               labels=["cluster", "breaker"])
        for name, b in sorted(queries.breakers(st).items()):
            br.add_metric([c, name], 1 if b["tripped"] else 0)
        yield br
        cm = CounterMetricFamily("sattr_comments", "Comment/AdminComment queue entries by status.",
                                 labels=["cluster", "field", "status"])
        for r in queries.comment_counts(st):
            cm.add_metric([c, str(r["field"]), str(r["status"])], r["n"])
        yield cm

    def _queue(self, now: float) -> Iterator[Metric]:
        st, c = self.store, self.cluster
        if self.pending is not None:
            count, oldest = self.pending
            jobs = GaugeMetricFamily("sattr_pending_jobs", "Ended jobs waiting for their verdict.", labels=["cluster"])
            jobs.add_metric([c], count)
            yield jobs
            age = GaugeMetricFamily("sattr_pending_oldest_age_seconds", "Age of the oldest pending entry.",
                                    labels=["cluster"])
            age.add_metric([c], max(0.0, now - oldest) if count and oldest else 0.0)
            yield age
        last = GaugeMetricFamily("sattr_last_verdict_timestamp_seconds", "When the newest verdict was stored.",
                                 labels=["cluster"])
        last.add_metric([c], queries.last_verdict_at(st))
        yield last

    def _latencies(self) -> Iterator[Metric]:
        st, c = self.store, self.cluster
        cum, count, total = queries.latency_histogram(st, ANALYSIS_BUCKETS)
        yield _hist("sattr_analysis_latency_seconds", "Job end to its first verdict stored.", c,
                    ANALYSIS_BUCKETS, cum, count, total)
        classes, lat, saved = queries.live_findings(st)
        lf = CounterMetricFamily("sattr_live_findings", "Live-watcher findings in stored verdicts, by class.",
                                 labels=["cluster", "class"])
        for cls, n in sorted(classes.items()):
            lf.add_metric([c, cls], n)
        yield lf
        yield _hist("sattr_live_detection_latency_seconds", "A hang's start to the watcher's finding.", c,
                    LIVE_BUCKETS, [sum(1 for x in lat if x <= b) for b in LIVE_BUCKETS], len(lat), sum(lat))
        sv = CounterMetricFamily("sattr_live_saved_gpu_seconds",
                                 "GPU-seconds the live watcher's cancels of hung jobs spared (GPUs x time left).",
                                 labels=["cluster"])
        sv.add_metric([c], round(saved * 60.0, 3))
        yield sv


def cluster_name(cfg: Config) -> str:
    """The ``cluster`` label: [metrics] cluster, else slurm.conf's ClusterName (read, no RPC)."""
    from ..slurm.conf import conf_value

    return cfg.metrics.cluster or conf_value(cfg.paths.slurm_conf, "ClusterName", "") or "default"


def pending_of(cfg: Config) -> tuple[int, float | None]:
    from ..pipeline import intake

    return intake.backlog(cfg)


def registry(store: Store, cluster: str, pending: tuple[int, float | None] | None = None,
             now: float | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(store, cluster, pending, now))
    return reg


def render_text(store: Store, cluster: str, pending: tuple[int, float | None] | None = None,
                now: float | None = None) -> bytes:
    """The exposition text of every metric (what a scrape returns)."""
    return generate_latest(registry(store, cluster, pending, now))


def write_textfile(path: str, store: Store, cluster: str, pending: tuple[int, float | None] | None) -> None:
    """node_exporter's textfile, replaced atomically (a temporary file in the same directory,
    then a rename): the collector never reads a half-written file."""
    write_to_textfile(path, registry(store, cluster, pending))
    os.chmod(path, 0o644)  # node_exporter runs as its own user


def publish(cfg: Config, store: Store | None = None) -> bool:
    """Rewrite [metrics] textfile when the site set one; never raises (metrics must not cost a
    verdict). True when written."""
    if not cfg.metrics.textfile:
        return False
    try:
        st = store if store is not None else Store(cfg.paths.database)
        write_textfile(cfg.metrics.textfile, st, cluster_name(cfg), pending_of(cfg))
        return True
    except Exception as err:  # noqa: BLE001 - a full disk or a bad path: logged, the verdicts stand
        log.warning("metrics textfile %s not written: %s", cfg.metrics.textfile, err)
        return False


def serve(host: str, port: int, cfg: Config, store: Store, cluster: str) -> None:
    """``sattr metrics --listen``: /metrics until stopped, each scrape read from the store. One
    request at a time, in this thread (the store's SQLite connection is this thread's; a
    scrape every few seconds needs no more)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app

    class Quiet(WSGIRequestHandler):
        timeout = 10  # a client that connects and sends nothing holds the one thread no longer

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug("metrics: " + format, *args)

    class Fresh(StoreCollector):
        def collect(self) -> Iterator[Metric]:
            self.pending = pending_of(cfg)  # the queue as it is at this scrape
            return super().collect()

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Fresh(store, cluster))
    httpd = make_server(host, port, make_wsgi_app(reg), handler_class=Quiet)
    log.info("serving metrics on http://%s:%d/metrics", host, port)
    httpd.serve_forever()
