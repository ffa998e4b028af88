"""The fleet view end to end on the real cluster: slurm-attr's metrics (docs/metrics.md) through
node_exporter's textfile collector into the test cluster's Prometheus, and the Grafana dashboard
(contrib/grafana/sattr.json) over them.

The module makes its own data, whatever ran before it: a job with one GPU that fails (GPU-hours
lost), a job whose node gets a fatal Xid in its kernel log (a hardware event, a verdict naming the
node, the node drained), `sattr undrain` of that node, a job in partition live whose plugin-started
watchers find a hang (a live finding in its verdict), and a last job after the undrain (the
controller rewrites the textfile after each verdict). Then, once Prometheus has scraped a textfile
written after the last verdict:

- every metric of docs/metrics.md has a series in Prometheus;
- the values equal the store's, counted here in SQL (not by the code under test) and, for the
  pending queue, by `sattr list --pending --json`;
- every panel target of the dashboard, Grafana's variables substituted, returns data;
- a preview of the dashboard (dashboard_preview.py: the panels drawn from the same queries, not by
  Grafana) is screenshot with headless Chromium and is not blank (copied to $SATTR_SCREENSHOTS/
  dashboard.png when that names a directory).

Needs the cluster's Prometheus (`testcluster.sh env` exports SATTR_PROMETHEUS_URL): skipped where
there is none (the 24.11/26.05 roots of `make test-versions`). Leaves the cluster as it found it:
the node resumed, the kernel line removed, the breaker reset, the config restored.
"""
from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
from pathlib import Path

import pytest

from dashboard_preview import Prometheus, render, substitute
from screenshots import CHROMIUM, png_colours, screenshot
from harness import SHM, run_cmd
from kernel_inject import KernelLines
from slurm_attr import config as config_mod
from slurm_attr.live import findings

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "metrics.md"
DASHBOARD = REPO / "contrib" / "grafana" / "sattr.json"
NODES = ["n1", "n2", "n3", "n4"]
FATAL = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."
UNDRAIN_WHY = "test_fleet_prometheus: dcgmi diag passed"
# Grafana's variables as the panel check substitutes them (instant queries, now).
PANEL_VARS = {"cluster": ".*", "__rate_interval": "1m", "__range": "1h", "__interval": "15s", "datasource": ""}


def documented_metrics() -> list[tuple[str, str]]:
    """(name, type) of every row of docs/metrics.md's metric table."""
    rows = re.findall(r"^\|\s*`(sattr_\w+)`\s*\|\s*(\w+)\s*\|", DOC.read_text(), re.M)
    assert len(rows) >= 10, f"no metric table in {DOC}"
    return rows


# -- Prometheus ---------------------------------------------------------------------------------


class Prom(Prometheus):
    def vector(self, expr: str) -> list[dict]:
        return self.query(expr)

    def value(self, expr: str) -> float | None:
        got = self.query(expr)
        return float(got[0]["value"][1]) if got else None

    def by(self, expr: str, label: str) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(expr)}


def _poll(what: str, fn, timeout: float, interval: float = 1.0):
    """fn() -> (done, detail) until done or the deadline; returns the last detail, asserts done."""
    deadline = time.monotonic() + timeout
    done, detail = False, None
    while True:
        try:
            done, detail = fn()
        except (OSError, ValueError, RuntimeError, sqlite3.Error) as e:  # Prometheus restarting, the db busy
            done, detail = False, f"{type(e).__name__}: {e}"
        if done or time.monotonic() > deadline:
            break
        time.sleep(interval)
    assert done, f"{what} not reached after {timeout:.0f} s: {detail}"
    return detail


# -- the store, counted here ------------------------------------------------------------------------


def _db(cluster) -> sqlite3.Connection:
    con = sqlite3.connect(f"file:{cluster.db_path}?mode=ro", uri=True, timeout=30)
    con.row_factory = sqlite3.Row
    return con


def store_expectations(cluster) -> dict:
    """What the metrics must say, counted in SQL over the store (docs/metrics.md's definitions)."""
    con = _db(cluster)
    try:
        q = lambda sql, *a: con.execute(sql, a).fetchall()  # noqa: E731
        lost = {r[0]: float(r[1]) for r in q(
            "select v.cause, sum(j.gpus * j.elapsed_s) from verdicts v join jobs j on j.job_id = v.job_id "
            "where coalesce(j.state, '') != 'COMPLETED' and j.gpus > 0 and j.elapsed_s > 0 group by v.cause")}
        return {
            "verdicts": q("select count(*) from verdicts")[0][0],
            "last_verdict_at": float(q("select coalesce(max(analyzed_at), 0) from verdicts")[0][0]),
            "lost_gpu_seconds_by_cause": {c: v for c, v in lost.items() if v > 0},
            "drains_applied": q("select count(*) from drain_ledger where status = 'applied'")[0][0],
            "undrains": {("ok" if r[0] else "failed"): r[1] for r in q("select ok, count(*) from undrains group by 1")},
        }
    finally:
        con.close()


def pending_entries(cluster) -> list[dict]:
    proc = cluster.sattr("list", "--pending", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout or "[]")


def pending_listed(cluster) -> int:
    return len(pending_entries(cluster))


def prometheus_view(prom: Prom) -> dict:
    lost = prom.by("sum by (cause) (sattr_lost_gpu_seconds_total)", "cause")
    return {
        "verdicts": int(prom.value("sum(sattr_verdicts_total)") or 0),
        "last_verdict_at": prom.value("max(sattr_last_verdict_timestamp_seconds)") or 0.0,
        "lost_gpu_seconds_by_cause": {c: v for c, v in lost.items() if v > 0},
        "drains_applied": int(prom.value('sum(sattr_drains_total{outcome="applied"})') or 0),
        "undrains": {k: int(v) for k, v in prom.by("sum by (outcome) (sattr_undrains_total)", "outcome").items() if v},
        "pending": int(prom.value("sum(sattr_pending_jobs)") or 0),
    }


def _differences(seen: dict, want: dict) -> list[str]:
    out = []
    for k, w in want.items():
        s = seen.get(k)
        if k == "lost_gpu_seconds_by_cause":  # the exposition rounds to milliseconds
            if set(s) != set(w) or any(not math.isclose(s[c], w[c], rel_tol=1e-9, abs_tol=2e-3) for c in w):
                out.append(f"{k}: Prometheus {s} != store {w}")
        elif k == "last_verdict_at":
            if not math.isclose(s, w, abs_tol=1e-3):
                out.append(f"{k}: Prometheus {s!r} != store {w!r}")
        elif s != w:
            out.append(f"{k}: Prometheus {s!r} != store {w!r}")
    return out


# -- the scenario -----------------------------------------------------------------------------------


def _wait_ours(cluster, node: str, drained: bool, timeout: float = 90) -> None:
    _poll(f"{node} {'drained' if drained else 'resumed'} by sattr",
          lambda: (("drain" in cluster.node_state(node)[0] and cluster.ours(node)) == drained,
                   cluster.node_state(node)), timeout, 0.3)


def _wait_collected(cluster, job: str, node: str, timeout: float = 90) -> None:
    path = cluster.bundle(job) / "nodes" / node / "collect.json"
    _poll(f"{node}'s collection of job {job}", lambda: (path.exists(), str(path)), timeout, 0.2)


def _live_job(cluster) -> str:
    """2 nodes in partition live: the plugin starts the watchers; rank 3 never launches AllReduce
    #300 (H1), the harness holds the hang 60 s unless cancelled first."""
    script = f"""#!/bin/bash
#SBATCH -N2 -p live -t 4
rm -f {SHM}
srun -N2 --ntasks-per-node=1 bash -c 'exec {run_cmd()} --shm {SHM} --node-index $SLURM_NODEID --scenario nonentry --ops 400 --inject 300 --per-node 4 --hang-ms 60000'
rc=$?
rm -f {SHM}
exit $rc
"""
    return cluster.sbatch(script)


@pytest.fixture(scope="module")
def fleet(cluster):
    url = cluster.env.get("SATTR_PROMETHEUS_URL") or os.environ.get("SATTR_PROMETHEUS_URL")
    if not url:
        pytest.skip("no Prometheus beside this test cluster (`testcluster.sh env` exports no SATTR_PROMETHEUS_URL: "
                    "prometheus/prometheus-node-exporter not installed, or a versions root)")
    prom = Prom(url)
    _poll(f"Prometheus at {url} answering", lambda: (prom.query("vector(1)") != [], url), 60)
    assert not any(cluster.ours(n) for n in NODES), "a node is still drained by sattr"
    cluster.sattr("breaker", "reset", "--reason", "test_fleet_prometheus start", check=True)
    lines = KernelLines(cluster)
    started = time.time()
    jobs: dict[str, str] = {}
    bad_node = "n4"
    spool = config_mod.load(str(cluster.config_path)).paths.spool
    try:
        # A drain of one node in four: allowed whatever the other suites' drains in the window.
        with cluster.settings(drain=dict(max_partition_percent=50.0)):
            # 1. A job with one GPU that fails after a few seconds: GPU-hours lost.
            jobs["gpu"] = cluster.sbatch("#!/bin/bash\n#SBATCH -N1 --gres=gpu:1\nsleep 3\n"
                                         "echo 'ValueError: bad learning rate' >&2\nexit 3\n", user="sattrtest")
            # 2. A hang the plugin's watchers find while the job runs; cancelled once found.
            jobs["live"] = _live_job(cluster)
            try:
                cluster.job_nodes(jobs["live"], timeout=180)
                _poll(f"a live finding for job {jobs['live']}",
                      lambda: (bool((findings.load(spool, jobs["live"]) or {}).get("findings")), jobs["live"]), 150, 0.5)
            finally:
                cluster.run(["scancel", jobs["live"]], check=False)
            # 3. A fatal Xid on bad_node while its job runs: drained by the epilog's fast path.
            gate = cluster.gate()
            jobs["fatal"] = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -w {bad_node} --exclusive\n{gate.wait}\n"
                                           "sleep 0.5\nexit 1\n", user="sattrtest")
            cluster.wait_running(jobs["fatal"], timeout=240)
            lines.add(bad_node, FATAL)
            gate.open()
            fatal_verdict = cluster.verdict(jobs["fatal"], timeout=180)
            _wait_ours(cluster, bad_node, drained=True)
            _wait_collected(cluster, jobs["fatal"], bad_node)
            lines.remove(bad_node)
            # 4. The admin resumes it.
            proc = cluster.sattr("undrain", bad_node, "--reason", UNDRAIN_WHY)
            assert proc.returncode == 0, (proc.stdout, proc.stderr)
            _wait_ours(cluster, bad_node, drained=False)
            verdicts = {k: cluster.verdict(j, timeout=240) for k, j in jobs.items()}
            verdicts["fatal"] = fatal_verdict
            # 5. A last job after the undrain: its verdict rewrites the textfile with the undrain in it.
            jobs["last"] = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\necho done\n", user="sattrtest")
            verdicts["last"] = cluster.verdict(jobs["last"], timeout=240)
    finally:
        lines.remove()
        for j in jobs.values():
            cluster.run(["scancel", j], check=False)
        if "live" in jobs:  # the harness's ring state, left behind by the cancel
            Path(SHM.replace("$SLURM_JOB_ID", jobs["live"])).unlink(missing_ok=True)
        if cluster.ours(bad_node):
            cluster.sattr("undrain", bad_node, "--reason", "test_fleet_prometheus cleanup")
        cluster.sattr("breaker", "reset", "--reason", "test_fleet_prometheus end")

    # Prometheus has scraped a textfile written after the last verdict: its newest verdict time
    # and every count equal the store's now (the store no longer changes: the jobs are done).
    def settled():
        want = store_expectations(cluster)
        pending = pending_entries(cluster)
        want["pending"] = len(pending)
        seen = prometheus_view(prom)
        diff = _differences(seen, want)
        # why jobs stay pending (an analysis that crashes), to read in the failure
        diff += [f"pending job {p['job_id']}: {p['last_error']}" for p in pending[:5] if diff]
        return not diff, diff or want

    store = _poll("Prometheus equal to the store", settled, 240, 2)
    return {"prom": prom, "jobs": jobs, "verdicts": verdicts, "store": store, "started": started,
            "bad_node": bad_node}


# -- the checks -------------------------------------------------------------------------------------


def test_the_scenario_made_the_data_every_panel_shows(cluster, fleet):
    jobs, v = fleet["jobs"], fleet["verdicts"]
    con = _db(cluster)
    try:
        gpus, elapsed, state = con.execute("select gpus, elapsed_s, state from jobs where job_id = ?",
                                           [jobs["gpu"]]).fetchone()
        ledger = con.execute("select count(*) from drain_ledger where job_id = ? and node = ? and status = 'applied'",
                             [jobs["fatal"], fleet["bad_node"]]).fetchone()[0]
        undrain = con.execute("select count(*) from undrains where node = ? and why = ? and ok = 1 and at >= ?",
                              [fleet["bad_node"], UNDRAIN_WHY, fleet["started"]]).fetchone()[0]
        live = con.execute("select count(*) from symptoms where job_id = ? and rule_id like 'live.%'",
                           [jobs["live"]]).fetchone()[0]
    finally:
        con.close()
    # accounting's AllocTRES gres/gpu and Elapsed, stored with the job
    assert (gpus, state) == (1, "FAILED") and elapsed and elapsed >= 3, (gpus, elapsed, state)
    assert v["fatal"]["cause"] == "gpu_hardware" and fleet["bad_node"] in v["fatal"]["culprit"]["nodes"], v["fatal"]
    assert ledger == 1 and undrain == 1, (ledger, undrain)
    assert live >= 1, f"no live finding in the verdict of job {jobs['live']}: {v['live']['symptoms']}"
    prom, node = fleet["prom"], fleet["bad_node"]
    assert (prom.value(f'sum(sattr_node_hardware_verdicts_7d{{node="{node}"}})') or 0) >= 1
    assert prom.vector(f'sattr_hardware_events_total{{node="{node}", gpu=~".*3b:00.*"}}'), "no hardware event series"
    assert (prom.value(f'sum(sattr_node_verdicts_total{{node="{node}", domain="hardware"}})') or 0) >= 1
    assert (prom.value(f'sum(sattr_lost_gpu_seconds_total{{cause="{v["gpu"]["cause"]}"}})') or 0) >= elapsed - 2e-3


def test_every_documented_metric_has_a_series(fleet):
    prom = fleet["prom"]
    missing = []
    for name, kind in documented_metrics():
        names = [f"{name}_bucket", f"{name}_count", f"{name}_sum"] if kind == "histogram" else [name]
        missing += [n for n in names if not prom.vector(n)]
    assert not missing, f"no series in Prometheus for {missing}"


def test_metrics_equal_the_store(cluster, fleet):
    want = store_expectations(cluster)
    want["pending"] = pending_listed(cluster)
    seen = prometheus_view(fleet["prom"])
    assert not _differences(seen, want), _differences(seen, want)
    # the histogram counts every verdict with a latency; the breaker reads untripped after the reset
    prom = fleet["prom"]
    assert (prom.value("sum(sattr_analysis_latency_seconds_count)") or 0) >= 4
    assert prom.value('max(sattr_breaker_tripped{breaker="drain"})') == 0


def panel_targets() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", []) if t.get("expr")]
    assert len(out) >= 15, "the dashboard lost its panels"
    return out


def test_every_panel_query_returns_data(fleet):
    prom = fleet["prom"]
    documented = {n for n, _ in documented_metrics()}
    empty = []
    for title, expr in panel_targets():
        query = substitute(expr, PANEL_VARS)
        assert "$" not in query, f"panel {title!r}: a variable left in {query!r}"
        used = set(re.findall(r"\b(sattr_\w+?)(?:_bucket|_count|_sum)?\b", query))
        assert used and used <= documented, f"panel {title!r} uses {used - documented}, not in docs/metrics.md"
        # a series born at the last scrapes needs two samples for increase(): a few scrapes more
        deadline = time.monotonic() + 30
        while not (got := prom.query(query)) and time.monotonic() < deadline:
            time.sleep(2)
        if not got:
            empty.append(f"{title!r}: {query}")
    assert not empty, "panels with no data:\n" + "\n".join(empty)


def test_dashboard_preview_screenshot(fleet, tmp_path):
    if CHROMIUM is None:
        pytest.fail("chromium is not installed (cluster/deps.sh apt): cannot screenshot the dashboard preview")
    end = time.time()
    start = min(fleet["started"] - 120, end - 600)  # from before the scenario's jobs
    step = max((end - start) / 240, 2.0)
    page, drawn = render(json.loads(DASHBOARD.read_text()), fleet["prom"], start, end, step, "1m")
    assert not [d for d in drawn if d.errors], [(d.title, d.errors) for d in drawn if d.errors]
    assert not [d.title for d in drawn if not d.series], "panels drawn empty"
    assert "rendered from Prometheus by the test suite (not Grafana)" in page
    html_path, png = tmp_path / "dashboard.html", tmp_path / "dashboard.png"
    html_path.write_text(page)
    screenshot(html_path, png, "1400,1600", keep_as="dashboard.png")
    colours = len(png_colours(png.read_bytes(), sample=4))
    assert colours > 20, f"the screenshot is (nearly) blank: {colours} colours"
    print(f"\ndashboard preview: {len(drawn)} panels, {colours} colours in {png}")


def test_fleet_report_of_the_clusters_store(cluster, fleet, tmp_path):
    """`sattr report --fleet` as an admin runs it on the cluster (the site install's sattr, the
    cluster's own store): the page renders in Chromium, and its totals and per-cause counts are
    the store's, counted here in SQL over the same window."""
    if CHROMIUM is None:
        pytest.fail("chromium is not installed (cluster/deps.sh apt): cannot screenshot the fleet report")
    out = tmp_path / "fleet.html"
    t0 = time.time()
    res = cluster.sattr("report", "--fleet", "--since", "1d", "--html", str(out), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    since = t0 - 86400
    with _db(cluster) as con:
        jobs, failed = con.execute("select count(*), sum(failed) from fleet where analyzed_at >= ?", [since]).fetchone()
        by_cause = dict(con.execute("select cause, count(*) from fleet where analyzed_at >= ? group by 1", [since]))
    # a verdict stored between the report and this count (another test's job) may add one
    assert 0 <= jobs - data["totals"]["jobs"] <= 1 and 0 <= failed - data["totals"]["failed_jobs"] <= 1
    assert {c["cause"]: c["jobs"] for c in data["causes"]}.keys() <= by_cause.keys()
    page = out.read_text()
    assert f'data-metric="jobs">{data["totals"]["jobs"]}<' in page
    assert data["totals"]["gpu_hours_lost"] > 0 and data["totals"]["hardware_events"] >= 1, data["totals"]
    node = next(n for n in data["nodes"] if n["node"] == fleet["bad_node"])
    assert {t["kind"] for t in node["timeline"]} >= {"verdict", "drain", "undrain"}, node["timeline"]
    png = tmp_path / "fleet.png"
    screenshot(out, png, "1280,2200", keep_as="fleet-report.png")
    colours = len(png_colours(png.read_bytes(), sample=4))
    assert colours > 20, f"the screenshot is (nearly) blank: {colours} colours"
