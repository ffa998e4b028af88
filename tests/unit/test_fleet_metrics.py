"""The fleet's aggregates (fleet/queries.py) as metrics (fleet/metrics.py) and as the fleet
report's data (fleet/facts.py): each number checked against what was put into the store, with
the near misses beside it (a completed job costs nothing, a re-read event is one event, an
untrusted line is no hardware event, a node already drained is not a blocked drain)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from slurm_attr import access
from slurm_attr.cli import main
from slurm_attr.collect.jobstate import elapsed_seconds, refresh_state, tres_gpus
from slurm_attr.config import Config, from_dict
from slurm_attr.errors import ConfigError
from slurm_attr.fleet import facts, metrics, queries
from slurm_attr.model import Action, Symptom, Verdict
from slurm_attr.store import Store

NOW = 1_900_000_000.0
PCI = "0000:3b:00.0"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def _save(st: Store, job: str, cause: str, *, state: str = "FAILED", gpus: int | None = 8, elapsed: float = 3600.0,
          nodes=("n1", "n2"), culprits=(), symptoms=(), user: str = "alice", partition: str = "gpu",
          end: float | None = None) -> None:
    j = {"job_id": job, "user": user, "partition": partition, "nodes": list(nodes), "state": state,
         "gpus": gpus, "elapsed_s": elapsed, "end_time": _iso(end if end is not None else time.time() - 20)}
    st.save(j, Verdict(job_id=job, cause=cause, summary=f"{cause} of {job}", culprit_nodes=list(culprits),
                       symptoms=list(symptoms)))


def _xid(node: str, at: str, trusted: bool = True, cause: str = "gpu_hardware") -> Symptom:
    return Symptom(id="gpu.xid_79", cause=cause, trusted=trusted, node=node, gpu=PCI, time=at,
                   summary="Xid 79: GPU has fallen off the bus")


@pytest.fixture
def st() -> Store:
    s = Store(memory=True)
    # 1: hardware on n1, 8 GPUs x 1 h lost. 2: the same Xid line read again by the next job
    # on n1 (one event), 3: a second, later Xid (a second event). 4: a user error, 2 GPUs x
    # 30 min. 5: completed: no GPU-hours whatever it held. 6: an untrusted claim of an Xid.
    _save(s, "1", "gpu_hardware", culprits=["n1"], symptoms=[_xid("n1", "2026-12-01T10:00:00+00:00")])
    _save(s, "2", "gpu_hardware", culprits=["n1"], nodes=("n1",), gpus=4, elapsed=1800,
          symptoms=[_xid("n1", "2026-12-01T10:00:00+00:00")])
    _save(s, "3", "gpu_hardware", culprits=["n1", "n3"], nodes=("n1", "n3"), gpus=2, elapsed=7200,
          symptoms=[_xid("n1", "2026-12-02T10:00:00+00:00")])
    _save(s, "4", "user_error", gpus=2, elapsed=1800, nodes=("n2",), user="bob", partition="debug")
    _save(s, "5", "none", state="COMPLETED", gpus=8, elapsed=36000, nodes=("n2",))
    _save(s, "6", "user_error", gpus=None, nodes=("n4",), symptoms=[_xid("n4", "2026-12-03T10:00:00+00:00", trusted=False)])
    s.record_actions("1", [Action(kind="drain", node="n1", reason="xid 79", applied=True)], path="central")
    s.ledger_record("n1", "1", "drain", "central", "SATTR: xid 79", at=time.time())
    s.record_actions("2", [Action(kind="drain", node="n1", reason="xid 79", applied=False, blocked_by="already drained")],
                     path="central")
    s.record_actions("3", [Action(kind="drain", node="n3", reason="xid", applied=False, blocked_by="circuit breaker")],
                     path="central")
    # the same decision recorded again by a re-analysis: one blocked drain, not two
    s.record_actions("3", [Action(kind="drain", node="n3", reason="xid", applied=False, blocked_by="circuit breaker")],
                     path="reanalyze")
    s.record_undrain("n1", "1", "SATTR: xid 79", "reseated", "root", True)
    return s


def _families(text: bytes) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text.decode()):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def _value(fams, name, sample=None, **labels) -> float:
    got = [s.value for s in fams[name] if s.name == (sample or name) and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, f"{name} {labels}: {got}"
    return got[0]


def test_metrics_equal_what_went_into_the_store(st):
    fams = _families(metrics.render_text(st, "c1", pending=(3, NOW - 700), now=NOW))
    assert _value(fams, "sattr_verdicts", "sattr_verdicts_total", cause="gpu_hardware", partition="gpu") == 3
    assert _value(fams, "sattr_verdicts", "sattr_verdicts_total", cause="user_error", partition="debug") == 1
    assert sum(s.value for s in fams["sattr_verdicts"] if s.name == "sattr_verdicts_total") == 6
    # 8x1 + 4x0.5 + 2x2 GPU-hours; the completed job's 80 GPU-hours are not lost
    assert _value(fams, "sattr_lost_gpu_seconds", "sattr_lost_gpu_seconds_total", cause="gpu_hardware") == 14.0 * 3600
    assert _value(fams, "sattr_lost_gpu_seconds", "sattr_lost_gpu_seconds_total", cause="none") == 0.0
    # GPUs unknown (a job stored before accounting had them): 0, not a guess
    assert _value(fams, "sattr_lost_gpu_seconds", "sattr_lost_gpu_seconds_total", cause="user_error", partition="gpu") == 0.0
    # two distinct Xid events on n1 although three jobs read Xid lines; n4's untrusted one is none
    assert _value(fams, "sattr_hardware_events", "sattr_hardware_events_total", node="n1", gpu=PCI) == 2
    assert not [s for s in fams["sattr_hardware_events"] if s.labels["node"] == "n4"]
    assert _value(fams, "sattr_node_verdicts", "sattr_node_verdicts_total", node="n1", domain="hardware") == 3
    assert _value(fams, "sattr_node_verdicts", "sattr_node_verdicts_total", node="n3", domain="hardware") == 1
    assert _value(fams, "sattr_drains", "sattr_drains_total", outcome="applied") == 1
    assert _value(fams, "sattr_drains", "sattr_drains_total", outcome="blocked_breaker") == 1
    assert _value(fams, "sattr_drains", "sattr_drains_total", outcome="blocked_other") == 0  # "already drained"
    assert _value(fams, "sattr_undrains", "sattr_undrains_total", outcome="ok") == 1
    assert _value(fams, "sattr_breaker_tripped", breaker="drain") == 0
    assert _value(fams, "sattr_pending_jobs") == 3
    assert _value(fams, "sattr_pending_oldest_age_seconds") == 700
    assert _value(fams, "sattr_analysis_latency_seconds", "sattr_analysis_latency_seconds_count") == 6
    assert _value(fams, "sattr_analysis_latency_seconds", "sattr_analysis_latency_seconds_bucket", le="+Inf") == 6
    # no job or user label anywhere (bounded cardinality)
    for samples in fams.values():
        for s in samples:
            assert not {"job", "job_id", "user", "uid"} & set(s.labels), s


def test_derived_hardware_symptoms_are_not_events_of_their_own():
    """The fast path's drain reason read back and the history's recurrence stand beside the
    kernel line they come from: one event, not three. Near miss: a second, later Xid is two."""
    s = Store(memory=True)
    derived = [Symptom(id=i, cause="gpu_hardware", trusted=True, node="n1", gpu=PCI, time="2026-12-02T10:00:00+00:00")
               for i in ("sattr.fast_path_drain", "gpu.xid_recurrent")]
    _save(s, "7", "gpu_hardware", culprits=["n1"], symptoms=[_xid("n1", "2026-12-02T10:00:00+00:00"), *derived])
    fams = _families(metrics.render_text(s, "c"))
    assert [x.value for x in fams["sattr_hardware_events"]] == [1]
    _save(s, "8", "gpu_hardware", culprits=["n1"], symptoms=[_xid("n1", "2026-12-02T11:00:00+00:00"), *derived])
    assert [x.value for x in _families(metrics.render_text(s, "c"))["sattr_hardware_events"]] == [2]


def test_lemon_gauge_counts_only_the_window(st):
    week = 7 * 86400
    now = time.time()
    fams = _families(metrics.render_text(st, "c", now=now))
    assert _value(fams, "sattr_node_hardware_verdicts_7d", node="n1") == 3
    # eight days on, the series stays at zero (an alert resolves instead of vanishing)
    later = _families(metrics.render_text(st, "c", now=now + week + 86400))
    assert _value(later, "sattr_node_hardware_verdicts_7d", node="n1") == 0
    # a user-caused verdict never makes a lemon
    assert not [s for s in fams["sattr_node_hardware_verdicts_7d"] if s.labels["node"] in ("n2", "n4")]


def test_breaker_and_comment_queue(st):
    with st.transaction():
        st.trip_breaker("6 drains in 3600s")
    st.queue_comment("1", "1", "Comment", "SATTR1: x")
    st.queue_comment("2", "2", "Comment", "SATTR1: y")
    st.comment_result("2", "Comment", ok=True)
    fams = _families(metrics.render_text(st, "c"))
    assert _value(fams, "sattr_breaker_tripped", breaker="drain") == 1
    assert _value(fams, "sattr_comments", "sattr_comments_total", status="pending") == 1
    assert _value(fams, "sattr_comments", "sattr_comments_total", status="written") == 1
    assert "sattr_pending_jobs" not in fams  # no queue given: not a made-up zero


def test_reanalysis_keeps_the_first_latency(st):
    before = st.db.execute("select latency_s from fleet where job_id = '1'").fetchone()[0]
    assert 10 <= before <= 300
    st.db.execute("update fleet set latency_s = 12.5 where job_id = '1'")
    _save(st, "1", "nvlink", culprits=["n1"], end=time.time() - 86400)  # re-analysed a day later
    assert st.db.execute("select latency_s, cause from fleet where job_id = '1'").fetchone() == (12.5, "nvlink")


def test_gpu_time_spared_by_live_cancels_is_summed():
    """A hang the watcher cancelled spared its GPUs' time left (prekill/exchange.py's gpu_minutes_saved):
    summed per node and in the metrics. Near misses: a cancel that was withheld or refused,
    and a hostile number, spare nothing."""
    from slurm_attr.live.evidence import saved_gpu_minutes as saved_of

    assert saved_of({"cancel": {"done": True, "gpu_minutes_saved": 80.0}}) == 80.0
    assert saved_of({"cancel": {"done": False, "gpu_minutes_saved": 80.0}}) is None
    assert saved_of({"cancel": {"done": True, "gpu_minutes_saved": "1e99"}}) is None
    assert saved_of({"cancel": {"done": True, "gpu_minutes_saved": True}}) is None
    assert saved_of({}) is None
    s = Store(memory=True)
    hang = Symptom(id="live.hang", cause="rank_stuck", node="n2", fields={"class": "H1", "gpu_minutes_saved": 90.0})
    other = Symptom(id="live.hang", cause="rank_stuck", node="n3", fields={"class": "H2", "gpu_minutes_saved": None})
    _save(s, "11", "rank_stuck", symptoms=[hang, other])
    fams = _families(metrics.render_text(s, "c"))
    assert _value(fams, "sattr_live_saved_gpu_seconds", "sattr_live_saved_gpu_seconds_total") == 90.0 * 60
    assert queries.live_saved_by_node(s) == {"n2": 1.5}
    assert facts.fleet_report(s, None, cluster="c")["totals"]["gpu_hours_saved"] == 1.5
    empty = _families(metrics.render_text(Store(memory=True), "c"))
    assert _value(empty, "sattr_live_saved_gpu_seconds", "sattr_live_saved_gpu_seconds_total") == 0


def test_live_findings_and_detection_latency():
    s = Store(memory=True)
    hang = Symptom(id="live.hang", cause="rank_stuck", node="n1", time="2026-12-01T10:01:30+00:00",
                   fields={"class": "H1", "waiting_since": "2026-12-01T10:00:00+00:00"})
    slow = Symptom(id="live.slow", cause="none", role="context", fields={"class": "S1"})
    odd = Symptom(id="live.hang", cause="comm_hang", fields={"class": "<script>" * 50})
    _save(s, "9", "rank_stuck", symptoms=[hang, slow, odd])
    fams = _families(metrics.render_text(s, "c"))
    assert _value(fams, "sattr_live_findings", "sattr_live_findings_total", **{"class": "H1"}) == 1
    assert _value(fams, "sattr_live_findings", "sattr_live_findings_total", **{"class": "S1"}) == 1
    assert _value(fams, "sattr_live_findings", "sattr_live_findings_total", **{"class": "other"}) == 1
    name = "sattr_live_detection_latency_seconds"
    assert _value(fams, name, name + "_count") == 1 and _value(fams, name, name + "_sum") == 90
    assert _value(fams, name, name + "_bucket", le="60.0") == 0 and _value(fams, name, name + "_bucket", le="120.0") == 1


def test_textfile_is_replaced_whole_and_readable(tmp_path, st):
    path = tmp_path / "tf" / "sattr.prom"
    path.parent.mkdir()
    path.write_text("stale-content\n")
    metrics.write_textfile(str(path), st, "c", (0, None))
    text = path.read_text()
    assert text.startswith("# HELP") and "stale-content" not in text and "sattr_pending_jobs" in text
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["sattr.prom"]  # no temporary file left
    if shutil.which("promtool"):
        res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr


def test_publish_never_raises(tmp_path, spool_cfg, st):
    spool_cfg.metrics.textfile = str(tmp_path / "no" / "such" / "dir" / "sattr.prom")
    assert metrics.publish(spool_cfg, st) is False
    spool_cfg.metrics.textfile = ""
    assert metrics.publish(spool_cfg, st) is False  # not configured: nothing written
    spool_cfg.metrics.textfile = str(tmp_path / "sattr.prom")
    assert metrics.publish(spool_cfg, st) is True and (tmp_path / "sattr.prom").exists()


def test_metrics_config():
    cfg = from_dict({"metrics": {"textfile": "/var/lib/node/sattr.prom", "cluster": "big", "lemon_verdicts": 2}})
    assert (cfg.metrics.textfile, cfg.metrics.cluster, cfg.metrics.lemon_verdicts) == ("/var/lib/node/sattr.prom", "big", 2)
    with pytest.raises(ConfigError):
        from_dict({"metrics": {"textfile": "/var/lib/node/sattr.txt"}})  # node_exporter reads *.prom only
    with pytest.raises(ConfigError):
        from_dict({"metrics": {"lemon_verdicts": 0}})


def test_cluster_label_from_slurm_conf(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("# ClusterName=commented\nclustername=prod-a\nSlurmctldHost=x\n")
    cfg = Config()
    cfg.paths.slurm_conf = str(conf)
    assert metrics.cluster_name(cfg) == "prod-a"
    cfg.metrics.cluster = "override"
    assert metrics.cluster_name(cfg) == "override"


@pytest.mark.parametrize("tres,want", [
    ("billing=16,cpu=16,gres/gpu=8,mem=64G,node=2", 8),
    ("cpu=4,gres/gpu:a100=2,gres/gpu=2,node=1", 2),
    ("cpu=4,mem=1000M,node=1", 0),                 # near miss: TRES without GPUs
    ("cpu=4,gres/gpumem=40G,node=1", 0),           # near miss: GPU memory is not GPUs
    ("", None), ("Unknown", None),
])
def test_tres_gpus(tres, want):
    assert tres_gpus(tres) == want


@pytest.mark.parametrize("value,want", [("00:00:07", 7.0), ("01:02:03", 3723.0), ("2-00:00:01", 172801.0),
                                        ("INVALID", None), ("", None), ("12:3", None)])
def test_elapsed_seconds(value, want):
    assert elapsed_seconds(value) == want


def test_refresh_state_takes_gpus_and_elapsed_with_the_final_state():
    row = {"State": "FAILED", "ExitCode": "1:0", "AllocTRES": "cpu=2,gres/gpu=4,node=1", "Elapsed": "00:10:00"}
    job = refresh_state({"job_id": "5"}, row)
    assert (job["gpus"], job["elapsed_s"]) == (4, 600.0)
    running = refresh_state({"job_id": "6"}, dict(row, State="RUNNING"))
    assert "gpus" not in running  # not final yet: settled later


def test_schema_3_store_is_migrated(tmp_path):
    """A store of the last release: jobs without gpus/elapsed_s, no fleet table. The
    migration fills the fleet table from the verdicts already stored (GPUs unknown: 0 lost)."""
    path = str(tmp_path / "s3.db")
    s = Store(path)
    _save(s, "1", "user_error", culprits=["n2"])
    for col in ("gpus", "elapsed_s"):
        s.db.conn.execute(f"alter table jobs drop column {col}")
    for table in ("fleet", "attempts"):
        s.db.conn.execute(f"drop table {table}")
    s.db.conn.execute("update meta set value = '3' where key = 'schema_version'")
    s.db.conn.commit()
    s.db.conn.close()
    again = Store(path)
    assert again.schema_version == 4
    assert again.db.execute("select gpus, elapsed_s from jobs where job_id = '1'").fetchone() == (None, None)
    row = again.db.execute("select cause, failed, lost_gpu_h, culprit_nodes from fleet where job_id = '1'").fetchone()
    assert row == ("user_error", 1, 0.0, '["n2"]')  # unknown GPUs: nothing counted, not a guess
    assert again.verdict("1").cause == "user_error"
    fams = _families(metrics.render_text(again, "c"))
    assert _value(fams, "sattr_verdicts", "sattr_verdicts_total", cause="user_error") == 1


def test_fleet_report_data(st):
    data = facts.fleet_report(st, None, cluster="c1", pending=(2, time.time() - 30))
    assert data["totals"] == {"jobs": 6, "failed_jobs": 5, "gpu_hours_lost": 15.0, "hardware_events": 2,
                              "drains_applied": 1, "drains_blocked": 1, "undrains": 1, "gpu_hours_saved": 0.0}
    top = data["causes"][0]
    assert (top["cause"], top["jobs"], top["gpu_hours_lost"]) == ("gpu_hardware", 3, 14.0)
    assert [e["job_id"] for e in top["examples"]] == ["1", "3", "2"]  # costliest first
    n1 = next(n for n in data["nodes"] if n["node"] == "n1")
    assert n1["culprit_of"] == {"gpu_hardware": 3} and n1["hardware_verdicts_7d"] == 3 and n1["lemon"] is True
    # job 3 named n1 and n3: its 4 GPU-hours are shared
    assert n1["gpu_hours_lost"] == 8.0 + 2.0 + 2.0
    kinds = [t["kind"] for t in n1["timeline"]]
    assert kinds.count("verdict") == 3 and "drain" in kinds and "undrain" in kinds
    assert n1["gpus"][0]["gpu"] == PCI and len(n1["gpus"][0]["events"]) == 2
    first = next(e for e in n1["gpus"][0]["events"] if e["time"].startswith("2026-12-01"))
    assert first["jobs"] == ["1", "2"]
    assert data["nodes"][0]["node"] == "n1"  # the lemon first
    assert {u["user"] for u in data["users"]} == {"alice", "bob"}
    assert data["pending"]["jobs"] == 2 and 25 <= data["pending"]["oldest_age_s"] <= 120
    shared = facts.fleet_report(st, None, cluster="c1", admin=False)
    assert "users" not in shared and all(e["user"] is None for c in shared["causes"] for e in c["examples"])
    json.dumps(data)  # the --json output is plain JSON


def test_fleet_report_window_and_bounds(st):
    for i in range(facts.EXAMPLES + 3):
        _save(st, f"x{i}", "nvlink", culprits=["n9"])
    data = facts.fleet_report(st, time.time() + 3600, cluster="c")  # a window after every verdict
    assert data["totals"]["jobs"] == 0 and data["causes"] == []
    data = facts.fleet_report(st, None, cluster="c")
    nv = next(c for c in data["causes"] if c["cause"] == "nvlink")
    assert nv["jobs"] == facts.EXAMPLES + 3 and len(nv["examples"]) == facts.EXAMPLES


@pytest.fixture
def cli_env(tmp_path, monkeypatch, st):
    db = tmp_path / "attr" / "sattr.db"
    db.parent.mkdir()
    st.db.conn.execute(f"vacuum into '{db}'")
    conf = tmp_path / "slurm_attr.toml"
    conf.write_text(f'[paths]\ndatabase = "{db}"\nspool = "{tmp_path / "spool"}"\nslurm_conf = "{tmp_path / "none.conf"}"\n'
                    f'[intake]\nqueue_dir = "{tmp_path / "q"}"\n[metrics]\ncluster = "test"\n')
    monkeypatch.setattr(access, "caller", lambda: (0, "root"))
    return conf


def test_sattr_metrics_prints_and_writes(cli_env, tmp_path):
    res = CliRunner().invoke(main, ["--config", str(cli_env), "metrics"], catch_exceptions=False)
    assert res.exit_code == 0
    fams = _families(res.output.encode())
    assert _value(fams, "sattr_verdicts", "sattr_verdicts_total", cause="none", cluster="test") == 1
    out = tmp_path / "m.prom"
    res = CliRunner().invoke(main, ["--config", str(cli_env), "metrics", "--textfile", str(out)], catch_exceptions=False)
    assert res.exit_code == 0 and "sattr_lost_gpu_seconds_total" in out.read_text()


def test_sattr_metrics_is_for_admins(cli_env, monkeypatch):
    monkeypatch.setattr(access, "caller", lambda: (1234, "mallory"))
    res = CliRunner().invoke(main, ["--config", str(cli_env), "metrics"])
    assert res.exit_code != 0 and "admins" in res.output


def test_sattr_report_fleet_json(cli_env, monkeypatch):
    from slurm_attr.cli import fleet

    monkeypatch.setattr(fleet, "_slurm_nodes", lambda cfg: ([], None))
    res = CliRunner().invoke(main, ["--config", str(cli_env), "report", "--fleet", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["cluster"] == "test" and data["totals"]["gpu_hours_lost"] == 15.0
    res = CliRunner().invoke(main, ["--config", str(cli_env), "report", "--fleet"])
    assert res.exit_code != 0 and "--html" in res.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_listen_serves_a_scrape(cli_env):
    port = _free_port()
    env = dict(os.environ, SLURM_ATTR_CONFIG=str(cli_env))
    proc = subprocess.Popen([sys.executable, "-c", "from slurm_attr.cli import main; main()", "metrics", "--listen", f"127.0.0.1:{port}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "sattr metrics --listen did not answer"
                time.sleep(0.2)
        fams = _families(body)
        assert _value(fams, "sattr_drains", "sattr_drains_total", outcome="applied") == 1
        assert _value(fams, "sattr_pending_jobs") == 0
    finally:
        proc.terminate()
        proc.wait(10)
