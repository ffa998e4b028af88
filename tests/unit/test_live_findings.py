"""The live finding after detection: classification from the summaries when no snapshot
explains it, the file's trust checks, `sattr live`, the post-mortem evidence, the
watcher's end with its step."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from click.testing import CliRunner

from slurm_attr.bundle import Bundle
from slurm_attr.cli import main
from slurm_attr.config import Config
from slurm_attr.live import analyze, findings, livespool
from slurm_attr.live.hang import classify
from slurm_attr.live.hang.classify import from_summaries
from slurm_attr.live.hang.detect import Hang
from slurm_attr.live.watcher import Watcher

AR = 4


def _m(cr, node, fs_ar, kern=None, wait=(0,) * 6):
    fs = [0] * 12
    fs[AR] = fs_ar
    return {"cr": cr, "g": 10 + cr, "node": node, "fs": fs, "kern": kern, "wait": list(wait), "api": False,
            "prog": 1, "act": 1}


def test_summary_fallback_names_the_rank_behind():
    members = {cr: _m(cr, f"n{cr // 2}", 9 if cr == 3 else 10, kern=None if cr == 3 else [AR, 9]) for cr in range(6)}
    cls, cause, ranks, what, waiting = from_summaries(Hang("ab", "world ab", 6, 70.0, 60.0, None, members))
    assert (cls, cause, ranks, what) == ("H1", "rank_stuck", [13], "never entered AllReduce #9")
    assert waiting == [10, 11, 12, 14, 15]


def test_summary_fallback_half_behind_is_not_blamed():
    # three of six behind: no telling who waits on whom -> unlocalised
    members = {cr: _m(cr, "n0", 9 if cr < 3 else 10, kern=[AR, 9]) for cr in range(6)}
    cls, cause, ranks, _what, _w = from_summaries(Hang("ab", "w", 6, 70.0, 60.0, None, members))
    assert (cls, cause, ranks) == ("H0", "comm_hang", [])


def _cfg(tmp_path) -> Config:
    cfg = Config()
    cfg.paths.spool = str(tmp_path / "spool")
    os.makedirs(cfg.paths.spool, exist_ok=True)
    return cfg


def _doc(job="77"):
    f = {"job": job, "detected": "2026-12-01T14:02:10+00:00", "class": "H1", "cause": "rank_stuck",
         "comm": "ab", "label": "world ab", "ranks": [37], "nodes": ["n4"], "waiting_ranks": [1, 2],
         "waiting_since": "2026-12-01T14:01:05+00:00", "what": "never entered AllReduce #812",
         "symptoms": [{"id": "probe.non_entry", "fields": {"func": "AllReduce", "seq": 812}}]}
    return {"job": job, "findings": [f], "coverage": "2 of 2 node(s) reporting"}


def test_finding_is_shown_by_sattr_live_and_read_as_untrusted_evidence(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    livespool.ensure_job_dir(cfg.paths.spool, "77")
    findings.save(cfg.paths.spool, "77", "0", _doc(), gid=None)
    toml = tmp_path / "c.toml"
    toml.write_text(f'[paths]\nspool = "{cfg.paths.spool}"\n')
    monkeypatch.setenv("SLURM_ATTR_CONFIG", str(toml))
    out = CliRunner().invoke(main, ["live", "77"])
    assert out.exit_code == 0, out.output
    assert "rank 37 never entered AllReduce #812 [H1, world ab]; ranks waiting since" in out.output
    assert "live watch: step 0: 2 of 2 node(s) reporting" in out.output
    js = json.loads(CliRunner().invoke(main, ["live", "77", "--json"]).output)
    assert js["findings"][0]["ranks"] == [37]
    # near miss: another job has none
    assert "no live findings" in CliRunner().invoke(main, ["live", "78"]).output
    # the post-mortem side: an untrusted symptom pointing at rank and node, never a drain
    bdir = tmp_path / "bundle"
    bdir.mkdir()
    (bdir / "job.json").write_text(json.dumps({"job_id": "77"}))
    (s,), (cov,) = analyze(Bundle(str(bdir)), cfg)
    assert (s.id, s.cause, s.rank, s.node, s.trusted, s.action) == ("live.hang", "rank_stuck", 37, "n4", False, "none")
    assert cov.status == "ok"


def test_a_finding_that_is_not_ours_or_names_another_job_is_ignored(tmp_path):
    cfg = _cfg(tmp_path)
    d = livespool.ensure_job_dir(cfg.paths.spool, "77")
    path = os.path.join(d, findings.name("0"))
    with open(path, "w") as f:  # root's, but names another job
        json.dump(dict(_doc(job="78"), step="0"), f)
    assert findings.load(cfg.paths.spool, "77") is None
    os.unlink(path)
    (tmp_path / "x").write_text(json.dumps(dict(_doc(), step="0")))
    os.symlink(str(tmp_path / "x"), path)
    assert findings.load(cfg.paths.spool, "77") is None
    os.unlink(path)
    findings.save(cfg.paths.spool, "77", "0", _doc(), gid=None)
    os.chown(path, 65534, -1)  # not root's
    assert findings.load(cfg.paths.spool, "77") is None
    os.chown(path, 0, -1)
    # a second step's findings merge in
    findings.save(cfg.paths.spool, "77", "batch", _doc(), gid=None)
    doc = findings.load(cfg.paths.spool, "77")
    assert [f["ranks"] for f in doc["findings"]] == [[37], [37]]
    assert doc["coverage"].startswith("step 0: ") and "step batch: " in doc["coverage"]


def test_watcher_ends_with_its_step_and_leaves_only_the_findings(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.live.interval_s = 0.05
    jobdir = tmp_path / "ev" / "77"
    (jobdir / "probe").mkdir(parents=True)
    w = Watcher(cfg, "77", "n0", str(jobdir), leader=True, nnodes=1)
    w.run(max_cycles=2)
    live = tmp_path / "spool" / "live" / "77"
    assert not (live / "summary" / "0" / "n0.json").exists()
    assert findings.load(cfg.paths.spool, "77")["coverage"].startswith("step 0: 1 of 1 node(s) reporting")
    # the evidence dir gone (the epilog removed it): the loop ends at once
    os.rename(jobdir, tmp_path / "gone")
    w2 = Watcher(cfg, "77", "n0", str(jobdir), leader=False)
    w2.run()
    assert w2.cycles == 0
    # a stepd pid that is not alive (reused pids differ by start time): no cycle either
    os.rename(tmp_path / "gone", jobdir)
    w3 = Watcher(cfg, "77", "n0", str(jobdir), stepd_pid=2 ** 22 + 7)
    w3.run()
    assert w3.cycles == 0


STEPD = """import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(1)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def fake_stepd(tmp_path):
    """A process listening where slurmstepd does, ``<spool dir>/<node>_<job>.<step>``: the
    batch step of job 91 on gpu09 (a short dir: sun_path is 108 bytes)."""
    import tempfile

    d = tempfile.mkdtemp(prefix="sattr-sd-", dir="/tmp")
    proc = subprocess.Popen([sys.executable, "-c", STEPD, f"{d}/gpu09_91.4294967291"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc.pid
    proc.kill()
    proc.wait()
    subprocess.run(["rm", "-rf", d], check=False)


def test_entry_point_takes_the_node_from_slurmstepd_not_the_job(tmp_path, monkeypatch, fake_stepd):
    """What the plugin execs: the node is the one slurmstepd's own socket names; a node list
    from the job's environment (a user may export SLURM_STEP_NODELIST) is not read. Disabled in
    the config, it does nothing at all."""
    from slurm_attr.live.__main__ import main as live_main

    spool = tmp_path / "spool"
    spool.mkdir()
    jobdir = tmp_path / "ev" / "91"
    (jobdir / "probe").mkdir(parents=True)
    conf = tmp_path / "c.toml"
    conf.write_text(f'[paths]\nspool = "{spool}"\nnode_state = "{tmp_path}/state"\n[live]\ninterval_s = 0.05\n')
    args = ["watch", "--job", "91", "--step", "batch", "--nodelist", "n3", "--nodeid", "0",
            "--nnodes", "1", "--jobdir", str(jobdir), "--config", str(conf), "--cycles", "1",
            "--stepd-pid", str(fake_stepd)]
    monkeypatch.setattr(Watcher, "leave", lambda self: None)  # keep the summary to look at
    # The leader reads EndTime with scontrol in a thread: not here (no Slurm; and a child left
    # running would be reaped by whichever later test waits for any child).
    monkeypatch.setattr("slurm_attr.live.prekill.exchange.show_job", lambda cfg, job: None)
    # The watcher drops to SCHED_IDLE + nice 19 and caps its memory for good: in this process
    # that would starve the rest of the suite beside any CPU-heavy neighbour (it did, under
    # stress-ng). Recorded here, checked for real in a child below.
    quiet: list[bool] = []
    monkeypatch.setattr("slurm_attr.live.__main__._quiet_priority", lambda: quiet.append(True))
    monkeypatch.setattr("slurm_attr.live.__main__._memory_cap", lambda limit: quiet.append(limit > 0))
    assert live_main(args + ["--leader"]) == 0
    assert quiet == [True, True]
    assert findings.load(str(spool), "91")["coverage"] == "step batch: 1 of 1 node(s) reporting"
    assert sorted(os.listdir(spool / "live" / "91" / "summary" / "batch")) == ["gpu09.json"]  # not n3
    summary = json.loads((spool / "live" / "91" / "summary" / "batch" / "gpu09.json").read_text())
    assert (summary["node"], summary["step"], summary["comms"]) == ("gpu09", "batch", [])
    # near miss: a step slurmstepd does not serve (its socket names step 4294967291) is not watched
    with pytest.raises(SystemExit) as exc:
        live_main([a if a != "batch" else "3" for a in args])
    assert exc.value.code == 1 and not (spool / "live" / "91" / "summary" / "3").exists()
    conf.write_text(f'[paths]\nspool = "{spool}"\n[live]\nenabled = false\n')
    assert live_main(args) == 0
    args[2] = "92"
    assert live_main(args) == 0
    assert not (spool / "live" / "92").exists()


def test_sattr_jobid_shows_the_live_finding_until_a_verdict_exists(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    toml = tmp_path / "c.toml"
    # slurm_bin: no sacct here (accounting "down"), so the near miss answers at once
    toml.write_text(f'[paths]\nspool = "{cfg.paths.spool}"\ndatabase = "{tmp_path}/db/sattr.db"\n'
                    f'slurm_bin = "{tmp_path}/no-slurm"\n'
                    f'[intake]\nqueue_dir = "{tmp_path}/pending"\n')
    monkeypatch.setenv("SLURM_ATTR_CONFIG", str(toml))
    livespool.ensure_job_dir(cfg.paths.spool, "77")
    findings.save(cfg.paths.spool, "77", "0", _doc(), gid=None)
    out = CliRunner().invoke(main, ["77"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("job 77: hang detected ") and "rank 37 never entered AllReduce #812" in out.output
    # near miss: a job without a verdict and without a live finding is still "no verdict"
    out = CliRunner().invoke(main, ["78"])
    assert out.exit_code != 0 and "no verdict for job 78" in out.output


# ---- one stuck rank, several communicators: the cascade behind the localised finding ----------
def _hang(cls, comm, label, nranks, ranks, waiting, step="0"):
    return {"job": "77", "step": step, "class": cls, "comm": comm, "label": label, "nranks": nranks,
            "ranks": ranks, "nodes": [], "waiting_ranks": waiting, "detected": "2026-12-01T14:02:10+00:00",
            "what": "every rank entered and none completes" if cls == "H0" else "issued another count",
            "symptoms": []}


def test_a_side_communicator_waiting_on_the_culprit_is_its_cascade():
    """The probe harness's count scenario: rank 5 issues another count on the world ring; the
    odd half ring (1,3,5,7) then shows only everyone waiting (H0), in the same cycle. The
    localised finding leads; the H0 is marked behind it. Near miss: the even half ring
    (0,2,4,6) also stalled, without the culprit among its ranks: not linked."""
    odd = _hang("H0", "od", "odd od", 4, [], [1, 3, 5, 7])
    even = _hang("H0", "ev", "even ev", 4, [], [0, 2, 4, 6])
    world = _hang("H2", "wo", "world wo", 8, [5], [0, 1, 2, 3, 4, 6, 7])
    new = [odd, even, world]
    assert classify.link_cascades(new, []) is False  # nothing standing changed
    assert new[0] is world
    assert odd["behind"] == {"comm": "wo", "label": "world wo", "class": "H2", "ranks": [5]}
    assert "behind" not in even and "behind" not in world
    line = findings.headline(odd)
    assert line.startswith("hang detected ") and ", behind H2 on world wo (rank 5) [H0, odd od]" in line


def test_an_earlier_unlocalised_finding_is_relinked_when_the_cause_is_found():
    odd = _hang("H0", "od", "odd od", 4, [], [1, 3, 5, 7])
    assert classify.link_cascades([odd], []) is False and "behind" not in odd  # nothing to link yet
    world = _hang("H1", "wo", "world wo", 8, [5], [0, 1, 2, 3, 4, 6, 7])
    assert classify.link_cascades([world], [odd]) is True  # the standing one changed: save
    assert odd["behind"]["ranks"] == [5]
    # near miss: another step's localised finding is another launch of the program
    other = _hang("H0", "od", "odd od", 4, [], [1, 3, 5, 7], step="1")
    assert classify.link_cascades([], [world, other]) is False and "behind" not in other


def test_the_post_mortem_reads_a_cascade_as_a_cascade(tmp_path):
    cfg = _cfg(tmp_path)
    livespool.ensure_job_dir(cfg.paths.spool, "77")
    odd = _hang("H0", "od", "odd od", 4, [], [1, 3, 5, 7])
    world = _hang("H2", "wo", "world wo", 8, [5], [0, 1, 2, 3, 4, 6, 7])
    world["cause"] = "collective_mismatch"
    classify.link_cascades([odd, world], [])
    findings.save(cfg.paths.spool, "77", "0", {"job": "77", "findings": [world, odd], "coverage": "2 of 2"}, gid=None)
    bdir = tmp_path / "bundle"
    bdir.mkdir()
    (bdir / "job.json").write_text(json.dumps({"job_id": "77"}))
    syms, _cov = analyze(Bundle(str(bdir)), cfg)
    assert [(s.cause, s.role, s.rank) for s in syms] == [("collective_mismatch", "root", 5), ("comm_hang", "cascade", None)]


def test_sattr_live_shows_what_ras_said_when_it_did_not_agree():
    f = _hang("H1", "wo", "world wo", 8, [5], [0, 1])
    f["cancel"] = {"done": False, "why": "withheld: one source only", "ras": "RAS sees communicator wo healthy"}
    assert findings.lines({"findings": [f]})[-1] == "  NCCL RAS: RAS sees communicator wo healthy"
    # near miss: RAS's line already is the reason given (it agreed): not said twice
    f["cancel"] = {"done": True, "why": "RAS: 1 rank dead", "ras": "RAS: 1 rank dead"}
    assert not any(ln.startswith("  NCCL RAS") for ln in findings.lines({"findings": [f]}))


def test_the_watcher_process_runs_at_idle_priority():
    """What _quiet_priority does, in a process of its own: the job's ranks always run first."""
    import subprocess
    import sys

    code = ("import os; from slurm_attr.live.__main__ import _quiet_priority; _quiet_priority(); "
            "print(os.sched_getscheduler(0) == os.SCHED_IDLE, os.nice(0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "19"]
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # near miss: this process is untouched
