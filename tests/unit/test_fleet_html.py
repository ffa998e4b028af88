"""The fleet report's HTML page (fleet/html.py): escaped, bounded, its numbers machine-readable,
and, in headless Chromium, a page that renders from a real store's report."""
from __future__ import annotations

import time
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from slurm_attr.fleet.html import MAX_EXAMPLES, MAX_TIMELINE_NODES, MAX_TIMELINE_ROWS, render_fleet_html
from slurm_attr.fleet.htmltext import hours
from slurm_attr.jobtext import block
from screenshots import CHROMIUM, png_colours, screenshot
HOSTILE = "<script>alert(1)</script>\u202eevil\x1b[2K\x07 & \"q\" 'a'"
LONG = "x" * 10_000


class Attrs(HTMLParser):
    """Every element's data-* attributes, in page order, and the text of each data-metric."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[dict[str, str]] = []
        self.metrics: dict[str, str] = {}
        self._metric: str | None = None
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        d = {k: v or "" for k, v in attrs if k.startswith("data-")}
        if d:
            self.rows.append(d)
        self._metric = d.get("data-metric")

    def handle_data(self, data: str) -> None:
        if self._metric and data.strip():
            self.metrics[self._metric] = data.strip()
            self._metric = None

    def where(self, key: str) -> list[dict[str, str]]:
        return [r for r in self.rows if key in r]


def parse(page: str) -> Attrs:
    p = Attrs()
    p.feed(page)
    p.close()
    return p


def example(i: int, summary: str = "rank 3 died") -> dict[str, Any]:
    return {"job_id": f"{1000 + i}", "user": "alice", "summary": summary, "nodes": [f"n{k}" for k in range(12)],
            "gpus": 8, "gpu_hours_lost": 16.0 - i, "end_time": "2026-12-01T10:00:00+00:00"}


def report(admin: bool = True, nodes: int = 3, timeline: int = 3) -> dict[str, Any]:
    r: dict[str, Any] = {
        "cluster": "sattrtest", "generated_at": "2026-12-06T18:00:00+00:00", "since": "2026-11-06T18:00:00+00:00",
        "until": "2026-12-06T18:00:00+00:00", "admin": admin,
        "totals": {"jobs": 120, "failed_jobs": 40, "gpu_hours_lost": 123.45, "hardware_events": 4, "drains_applied": 3,
                   "drains_blocked": 2, "undrains": 1},
        "causes": [
            {"cause": "gpu_hardware", "domain": "hardware", "jobs": 7, "gpu_hours_lost": 100.04,
             "examples": [example(i, HOSTILE if i == 0 else LONG) for i in range(8)]},
            {"cause": "user_error", "domain": "user", "jobs": 30, "gpu_hours_lost": 23.41, "examples": [example(9)]},
            {"cause": HOSTILE, "domain": "unknown", "jobs": 3, "gpu_hours_lost": 0, "examples": []},
        ],
        "daily": [{"day": f"2026-12-0{d}", "cause": c, "jobs": d, "gpu_hours_lost": 2.5 * d}
                  for d in range(1, 6) for c in ("gpu_hardware", "user_error")],
        "nodes": [{"node": f"n{i}", "jobs": 10 + i, "culprit_of": {"gpu_hardware": 3, "network": 1}, "hardware_verdicts_7d": 3 - i,
                   "hardware_events": 2, "gpu_hours_lost": 50.25, "lemon": i == 0, "state": "DRAIN",
                   "reason": "SATTR: gpu_hardware xid79 job 1000" if i else HOSTILE, "drained_by_us": i == 0,
                   "timeline": [{"at": f"2026-12-01T10:{k % 60:02d}:00+00:00", "kind": "verdict", "job_id": "1000",
                                 "cause": "gpu_hardware", "detail": HOSTILE if k == 0 else LONG} for k in range(timeline)],
                   "gpus": [{"gpu": "0000:3b:00", "events": [{"event": "gpu.xid_79", "time": "2026-12-01T09:59:00+00:00",
                                                              "summary": HOSTILE, "jobs": ["1000", "1001"]}]}]}
                  for i in range(nodes)],
        "drains": {"applied": 3, "blocked": {"circuit breaker": 2, HOSTILE: 1}, "undrains": 1,
                   "breaker": {"tripped": True, "why": HOSTILE, "tripped_at": "2026-12-02T00:00:00+00:00"}},
        "pending": {"jobs": 2, "oldest_age_s": 7300.0},
        "latency": {"count": 118, "p50_s": 4.25, "p95_s": 31.0},
    }
    if admin:
        r["users"] = [{"user": "alice", "jobs": 100, "failed": 30, "gpu_hours_lost": 120.0, "classes": {"user_error": 20}},
                      {"user": HOSTILE, "jobs": 20, "failed": 10, "gpu_hours_lost": 3.45, "classes": {"gpu_hardware": 7}}]
    return r


def test_hostile_strings_are_escaped_and_made_visible() -> None:
    page = render_fleet_html(report())
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\u202e" not in page and "\\u202e" in page  # the bidi override shown, not obeyed
    assert "\x1b" not in page and "\\x1b[2K" in page and "\x07" not in page and "\\x07" in page
    assert all(ch in "\n" or ch >= " " for ch in page)  # no control character but newlines
    parsed = parse(page)
    assert {"script"} & set(parsed.tags) == set()
    page.encode("utf-8")  # a lone surrogate would raise here


def test_lone_surrogate_in_a_summary_still_encodes() -> None:
    r = report()
    r["causes"][0]["examples"][0]["summary"] = "bad \udcff byte"
    page = render_fleet_html(r)
    assert "\\udcff" in page
    page.encode("utf-8")


def test_long_text_and_examples_are_bounded() -> None:
    page = render_fleet_html(report())
    assert LONG not in page and "x" * 400 + "…" in page and "x" * 401 not in page
    parsed = parse(page)
    assert len(parsed.where("data-example")) == MAX_EXAMPLES + 1  # 5 of gpu_hardware's 8, 1 of user_error
    assert "and 4 more" in page  # 12 nodes of an example job, 8 named


def test_numbers_in_data_attributes_equal_the_report() -> None:
    r = report()
    parsed = parse(render_fleet_html(r))
    t = r["totals"]
    assert parsed.metrics == {
        "jobs": "120", "failed_jobs": "40", "gpu_hours_lost": "123.5", "hardware_events": "4", "drains_applied": "3",
        "drains_blocked": "2", "undrains": "1", "pending_jobs": "2", "pending_oldest_age_s": "2.0 h", "latency_count": "118",
        "latency_p50_s": "4.25", "latency_p95_s": "31.0", "gpu_hours_saved": "-"}
    assert float(parsed.metrics["gpu_hours_lost"]) == round(t["gpu_hours_lost"], 1)
    causes = {c["data-cause"]: c for c in parsed.where("data-cause")}
    # the report's order; a hostile name comes back with its control characters made visible
    assert list(causes) == [block(c["cause"]) for c in r["causes"]]
    for c in r["causes"]:
        row = causes[block(c["cause"])]
        assert int(row["data-jobs"]) == c["jobs"] and row["data-gpu-hours"] == hours(c["gpu_hours_lost"])
    nodes = parsed.where("data-node")
    assert [(n["data-node"], int(n["data-jobs"]), int(n["data-hw7d"])) for n in nodes] == \
        [(n["node"], n["jobs"], n["hardware_verdicts_7d"]) for n in r["nodes"]]
    assert [d["data-lemon"] for d in parsed.where("data-lemon")] == ["n0"]
    assert {(b["data-blocked"], b["data-count"]) for b in parsed.where("data-blocked")} == \
        {(block(k), str(v)) for k, v in r["drains"]["blocked"].items()}
    assert [b["data-breaker"] for b in parsed.where("data-breaker")] == ["tripped"]
    gpus = parsed.where("data-gpu")
    assert len(gpus) == 3 and {(g["data-gpu"], g["data-event"], g["data-ended"]) for g in gpus} == {("0000:3b:00", "gpu.xid_79", "2")}


def test_sections_and_charts_present() -> None:
    page = render_fleet_html(report())
    for h in ("GPU-hours lost by cause", "Causes over time", "Nodes", "GPUs with hardware events", "Drains",
              "Pending queue and latency", "Users"):
        assert f"<h2>{h}</h2>" in page
    assert page.count("<svg") == 2 and page.count("<details>") == 3
    assert "TRIPPED" in page and "sattrtest" in page
    # no network: nothing the browser would fetch
    for ref in ("http://", "https://", "src=", "@import", "url("):
        assert ref not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_users_only_for_admins() -> None:
    assert "<h2>Users</h2>" not in render_fleet_html(report(admin=False))
    r = report(admin=False)
    r["users"] = report(admin=True)["users"]  # a report that is not an admin's never shows them
    page = render_fleet_html(r)
    assert "<h2>Users</h2>" not in page and "data-user" not in page and "a shared view" in page
    users = parse(render_fleet_html(report(admin=True))).where("data-user")
    assert [(u["data-user"], u["data-gpu-hours"]) for u in users] == [("alice", "120.0"), (block(HOSTILE), "3.45")]


def test_gpu_hours_keep_the_digits_that_matter() -> None:
    # a short test job's loss is not "0.0"; a big one is not printed to the millihour
    assert [hours(x) for x in (0, 0.0056, 0.25, 3.456, 123.456, None)] == ["0.0", "0.0056", "0.25", "3.46", "123.5", "-"]


def test_empty_report_renders() -> None:
    page = render_fleet_html({"cluster": "c", "admin": False, "until": "2026-12-06T18:00:00+00:00"})
    assert "No verdicts in this period." in page and "No lemon node." in page and page.endswith("</html>\n")
    assert parse(page).metrics["jobs"] == "-"


def test_timelines_are_bounded() -> None:
    r = report(nodes=MAX_TIMELINE_NODES + 50, timeline=MAX_TIMELINE_ROWS + 20)
    page = render_fleet_html(r)
    parsed = parse(page)
    assert len(parsed.where("data-node")) == MAX_TIMELINE_NODES + 50  # every node listed
    shown = page.count("<details>")
    assert 0 < shown <= MAX_TIMELINE_NODES and f"{MAX_TIMELINE_NODES + 50 - shown} more listed have one" in page
    assert len(parsed.where("data-kind")) == shown * MAX_TIMELINE_ROWS
    assert len(page.encode()) < 5_000_000


def test_page_stays_under_5_mb_when_everything_is_long_and_hostile() -> None:
    """Every string as long as the report allows and made of characters that escape longest
    (a bidi override becomes 6 characters, a quote 6): the sections' rooms still hold."""
    evil = ("\u202e\"" * 2000)
    r = report(nodes=600, timeline=MAX_TIMELINE_ROWS)
    for n in r["nodes"]:
        n["node"] = n["node"] + evil
        n["reason"] = evil
        n["culprit_of"] = {f"{evil}{k}": k for k in range(30)}
        n["timeline"] = [dict(t, detail=evil, job_id=evil, kind=evil) for t in n["timeline"]]
        n["gpus"] = [{"gpu": evil, "events": [{"event": evil, "time": evil, "summary": evil, "jobs": [evil] * 20}] * 5}]
    r["causes"] = [dict(c, cause=f"{evil}{i}", examples=[dict(example(k, evil), nodes=[evil] * 20, job_id=evil, user=evil)
                                                           for k in range(5)]) for i, c in enumerate(r["causes"] * 30)]
    r["daily"] = [{"day": f"2026-{1 + d // 28:02d}-{1 + d % 28:02d}", "cause": f"{evil}{c}", "jobs": 1, "gpu_hours_lost": 1.0}
                  for d in range(365) for c in range(20)]
    r["users"] = [{"user": f"{evil}{i}", "jobs": 1, "failed": 1, "gpu_hours_lost": 1.0, "classes": {f"{evil}{k}": 1 for k in range(20)}}
                  for i in range(5000)]
    page = render_fleet_html(r)
    assert len(page.encode()) < 5_000_000, len(page.encode())
    for note in ("more nodes not listed", "more events not listed", "more users not listed", "more causes not listed",
                 "oldest days are left out"):
        assert note in page
    assert "\u202e" not in page


# -- a report from a real store, rendered in headless Chromium ----------------------------------

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def _store(tmp_path: Path) -> tuple[Any, float]:
    """A small store written the way the pipeline writes it (Store.save and the drain records):
    two jobs ended by one GPU event, a user error, a completed job, a timeout, a network fault."""
    from slurm_attr.drain import reason_for
    from slurm_attr.model import Action, Evidence, Symptom, Verdict
    from slurm_attr.store import Store

    st = Store(str(tmp_path / "db" / "sattr.db"))
    now = time.time()
    event = datetime.fromtimestamp(now - 4000, timezone.utc).isoformat(timespec="seconds")

    def save(jid: str, user: str, nodes: list[str], gpus: int | None, elapsed: float | None, state: str, cause: str,
             symptom: Symptom | None = None, summary: str = "") -> Symptom | None:
        end = datetime.fromtimestamp(now - 3600, timezone.utc).isoformat(timespec="seconds")
        job = {"job_id": jid, "user": user, "partition": "gpu", "nodes": nodes, "state": state, "exit_code": 0 if state == "COMPLETED" else 1,
               "signal": 0, "start_time": end, "end_time": end, "gpus": gpus, "elapsed_s": elapsed}
        v = Verdict(job_id=jid, cause=cause, summary=summary or f"{cause} of job {jid}", symptoms=[symptom] if symptom else [],
                    culprit_nodes=[symptom.node] if symptom and symptom.node else [],
                    culprit_gpus=[symptom.gpu] if symptom and symptom.gpu else [])
        st.save(job, v)
        return symptom

    def xid(node: str) -> Symptom:
        return Symptom(id="gpu.xid_79", cause="gpu_hardware", priority=95, trusted=True, node=node, gpu="0000:3b:00", time=event,
                       action="reboot", summary="Xid 79 on GPU 0000:3b:00", fields={"xid": 79},
                       evidence=[Evidence(source="kernel", path=f"nodes/{node}/kernel.log", line=3, text=XID)])

    s = save("101", "alice", ["n1", "n2"], 16, 7200.0, "FAILED", "gpu_hardware", xid("n1"), summary=HOSTILE)
    save("102", "bob", ["n1"], 8, 3600.0, "FAILED", "gpu_hardware", xid("n1"))  # the same event ended it too
    save("103", "carol", ["n3"], 4, 1800.0, "FAILED", "user_error",
         Symptom(id="python.exception", cause="user_error", node="n3", rank=0, summary="ValueError: bad shape"))
    save("104", "alice", ["n2"], 8, 36000.0, "COMPLETED", "none")
    save("105", "bob", ["n3", "n4"], 2, 600.0, "TIMEOUT", "time_limit")
    save("106", "carol", ["n4"], None, None, "FAILED", "network",  # stored before accounting said: no GPU-hours
         Symptom(id="net.ib_link_down", cause="network", trusted=True, node="n4", summary="mlx5_0 port 1 down"))
    reason = reason_for("gpu_hardware", s, "101")  # type: ignore[arg-type]
    st.record_actions("101", [Action(kind="drain", node="n1", reason=reason, applied=True)], path="central")
    st.ledger_record("n1", "101", "drain", "central", reason)
    st.record_actions("102", [Action(kind="drain", node="n1", reason=reason, blocked_by="circuit breaker")], path="central")
    st.record_diag({"node": "n1", "command": "nodediag", "rc": 0, "ok": 1, "took_s": 12.0, "output": "ok\n", "actor": "sattr",
                    "trigger": "auto_undrain"})
    st.record_undrain("n1", "101", reason, "diagnostic passed", "sattr", ok=True)
    return st, now


def _expected(st: Any) -> dict[str, Any]:
    """The figures the page must show, counted here in SQL from the store's own tables."""
    from slurm_attr.model import domain_of

    def one(sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
        return next(iter(st.db.execute(sql, args)))[0]

    lost = ("case when j.state != 'COMPLETED' and j.gpus is not null and j.elapsed_s is not null "
            "then j.gpus * j.elapsed_s / 3600.0 else 0 end")
    hw = [c for (c,) in st.db.execute("select distinct cause from symptoms") if domain_of(c) == "hardware"]
    return {
        "jobs": one("select count(*) from verdicts"),
        "failed_jobs": one("select count(*) from verdicts v join jobs j using (job_id) where j.state != 'COMPLETED'"),
        "gpu_hours_lost": one(f"select sum({lost}) from verdicts v join jobs j using (job_id)"),
        "hardware_events": one(f"select count(*) from (select distinct node, gpu, rule_id, time from symptoms where trusted = 1 "
                               f"and cause in ({','.join('?' * len(hw))}))", hw),
        "drains_applied": one("select count(*) from drain_ledger where status = 'applied'"),
        "drains_blocked": one("select count(*) from actions where applied = 0"),
        "undrains": one("select count(*) from undrains where ok = 1"),
        "causes": {c: (n, h) for c, n, h in st.db.execute(
            f"select v.cause, count(*), sum({lost}) from verdicts v join jobs j using (job_id) group by 1")},
        "nodes": {n: k for n, k in st.db.execute("select n.value, count(*) from jobs, json_each(jobs.nodes) n group by 1")},
    }


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: cannot render the fleet report headless")
def test_report_of_a_real_store_renders_in_chromium(tmp_path: Path) -> None:
    from slurm_attr.fleet.facts import fleet_report

    st, now = _store(tmp_path)
    rep = fleet_report(st, now - 30 * 86400, cluster="sattrtest", pending=(2, now - 120), admin=True, now=now)
    page = render_fleet_html(rep)
    out = tmp_path / "fleet.html"
    out.write_text(page, encoding="utf-8")
    png = tmp_path / "fleet.png"
    screenshot(out, png, "1280,2000", keep_as="fleet-report-unit.png")
    red = (0xB2, 0x18, 0x2B)  # the gpu_hardware bar (hardware's first shade): the SVG chart was drawn
    colours = png_colours(png.read_bytes(), {(255, 255, 255), red})
    assert len(colours) > 2 and (255, 255, 255) in colours, "the screenshot is blank"
    assert any(max(abs(x - y) for x, y in zip(c, red)) <= 4 for c in colours), "no cause bar in the screenshot"

    want, got = _expected(st), parse(page)
    assert {k: got.metrics[k] for k in ("jobs", "failed_jobs", "hardware_events", "drains_applied", "drains_blocked", "undrains")} == \
        {k: str(want[k]) for k in ("jobs", "failed_jobs", "hardware_events", "drains_applied", "drains_blocked", "undrains")}
    assert (want["jobs"], want["failed_jobs"], want["hardware_events"]) == (6, 5, 1)  # the store is what the test meant
    assert float(got.metrics["gpu_hours_lost"]) == pytest.approx(want["gpu_hours_lost"], abs=0.05)
    causes = {r["data-cause"]: (int(r["data-jobs"]), float(r["data-gpu-hours"])) for r in got.where("data-cause")}
    assert causes.keys() == want["causes"].keys()
    for cause, (n, hours) in want["causes"].items():
        assert causes[cause][0] == n and causes[cause][1] == pytest.approx(hours or 0.0, abs=0.05), cause
    assert {r["data-node"]: int(r["data-jobs"]) for r in got.where("data-node")} == want["nodes"]
    gpu_rows = got.where("data-gpu")
    assert [(g["data-gpu-node"], g["data-gpu"], g["data-event"], g["data-ended"]) for g in gpu_rows] == \
        [("n1", "0000:3b:00", "gpu.xid_79", "2")]  # one event, the two jobs it ended
    assert "&lt;script&gt;" in page and "\\u202e" in page and {"script"} & set(got.tags) == set()
