"""diag.py: `sattr undrain --diag` (the site's diagnostic decides the resume) and auto_undrain."""
from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from slurm_attr import access, diag
from slurm_attr.cli import drains, main
from slurm_attr.config import Config
from slurm_attr.errors import ConfigError, SattrError
from slurm_attr.model import Evidence, Symptom
from slurm_attr.slurmstate import NodeState
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm, hw_verdict

OURS = "SATTR: gpu_hardware xid79 gpu3b:00 job {job}"


def script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def cfg_for(tmp_path, command: str = "true", timeout_s: float = 60.0, auto: bool = False) -> Config:
    cfg = Config()
    cfg.actions.diag_command = command
    cfg.actions.diag_timeout_s = timeout_s
    cfg.actions.auto_undrain = auto
    cfg.actions.auto_undrain_after_s = 1800.0
    cfg.intake.queue_dir = str(tmp_path / "pending")
    return cfg


class Runner:
    """A diagnostic that passes or fails on demand and counts its runs (auto_undrain's tests)."""

    def __init__(self, ok: bool = True):
        self.ok, self.nodes = ok, []

    def __call__(self, template: str, node: str, timeout_s: float) -> diag.DiagResult:
        self.nodes.append(node)
        return diag.DiagResult(node, f"{template} {node}", 0 if self.ok else 1, self.ok, 0.1, "diag output\n")


def drain_at(slurm: FakeSlurm, node: str, job: str, at: float) -> None:
    """Drained by us at ``at`` as Slurm's reason stamp says (a later drain event in simulated time)."""
    slurm.set_state(node, "IDLE+DRAIN")
    slurm.recs[node]["Reason"] = f"{OURS.format(job=job)} [root@{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(at))}]"


def save_verdict(store: Store, job: str, node: str, recurring: bool = False) -> None:
    v = hw_verdict(job, node)
    if recurring:
        v.symptoms.append(Symptom(id="gpu.xid_recurrent", cause="gpu_hardware", role="root", trusted=True, node=node,
                                  gpu="0000:3b:00", action="drain", fields={"xid": 13, "jobs": ["90", "95"]},
                                  evidence=[Evidence(source="history", text="job 90 also logged Xid 13")]))
    store.save({"job_id": job, "user": "alice", "nodes": [node], "state": "FAILED"}, v)


def gone(pid: int, wait_s: float = 10.0) -> bool:
    """Whether the process has ended (absent, or a zombie waiting for init)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


# -- running the diagnostic -----------------------------------------------------------------------


def test_passing_diag_resumes_and_both_are_recorded(tmp_path):
    slurm, store = FakeSlurm(), Store(memory=True)
    slurm.drain("n1", OURS.format(job=7))
    cfg = cfg_for(tmp_path, script(tmp_path, "diag.sh", 'echo "checked $1"; exit 0\n') + " %n")
    res = diag.undrain_with_diag(cfg, slurm, store, ["n1"], "GPU reseated", "alice", settle_s=0)
    assert res[0].ok and "n1 resumed" in res[0].message and "diag passed" in res[0].message
    assert slurm.state("n1") == "IDLE"
    [d] = store.diags(node="n1")
    assert (d["ok"], d["rc"], d["trigger"], d["actor"]) == (1, 0, "manual", "alice")
    assert d["output"] == "checked n1\n" and d["command"].endswith("diag.sh n1")
    [u] = store.undrains()
    assert u["ok"] == 1 and u["job_id"] == "7" and u["detail"].startswith("diag passed (rc 0") and "resumed" in u["detail"]


def test_failing_diag_keeps_the_node_drained_and_is_recorded(tmp_path):
    slurm, store = FakeSlurm(), Store(memory=True)
    slurm.drain("n1", OURS.format(job=7))
    cfg = cfg_for(tmp_path, script(tmp_path, "diag.sh", 'echo "GPU 3: memory test FAILED" >&2; exit 3\n') + " %n")
    res = diag.undrain_with_diag(cfg, slurm, store, ["n1"], "try", "alice", settle_s=0)
    assert not res[0].ok and "stays drained" in res[0].message and "rc 3" in res[0].message
    assert slurm.state("n1") == "IDLE+DRAIN" and not [c for c in slurm.calls if c[0] == "resume"]
    [d] = store.diags()
    assert (d["ok"], d["rc"]) == (0, 3) and "memory test FAILED" in d["output"]  # stderr is kept too
    [u] = store.undrains()
    assert u["ok"] == 0 and u["detail"].startswith("diag failed (rc 3")


def test_timeout_kills_the_whole_group_and_is_recorded(tmp_path):
    pidfile = tmp_path / "child.pid"
    body = f"sleep 300 &\necho $! > {pidfile}\necho started\nwait\n"
    res = diag.run_diag(script(tmp_path, "hang.sh", body), "n1", timeout_s=1.0)
    assert not res.ok and res.rc is None
    assert res.output.startswith("started\n") and "timed out after 1 s" in res.output
    assert diag.describe(res.ok, res.rc, res.took_s, res.output).startswith("failed: timed out after 1 s")
    assert gone(int(pidfile.read_text()))  # the background child died with its group


def test_leftover_children_of_a_finished_diag_are_killed(tmp_path):
    pidfile = tmp_path / "child.pid"
    res = diag.run_diag(script(tmp_path, "bg.sh", f"sleep 300 &\necho $! > {pidfile}\nexit 0\n"), "n1", 60.0)
    assert res.ok and res.rc == 0  # it exited 0: its leftover holding the output is not its failure
    assert gone(int(pidfile.read_text()))


def test_huge_output_is_bounded_to_its_tail(tmp_path):
    body = "head -c 5000000 /dev/zero | tr '\\0' x\necho\necho LAST-LINE\n"
    res = diag.run_diag(script(tmp_path, "loud.sh", body), "n1", 60.0)
    assert res.ok and len(res.output.encode()) <= diag.OUTPUT_TAIL_BYTES
    assert res.output.endswith("x\nLAST-LINE\n")


def test_command_has_no_shell_and_the_node_name_cannot_inject(tmp_path):
    assert diag.command_for("ssh %n dcgmi diag -r 3", "gpu-07") == ["ssh", "gpu-07", "dcgmi", "diag", "-r", "3"]
    assert diag.command_for("sh -c 'x \"$1\" | y' sh %n", "n1") == ["sh", "-c", 'x "$1" | y', "sh", "n1"]
    for bad in ("n1;reboot", "$(id)", "n1 n2", "-oProxyCommand=x", ""):
        with pytest.raises(SattrError, match="node name"):
            diag.command_for("ssh %n true", bad)
    res = diag.run_diag("/no/such/diag %n", "n1", 5.0)
    assert not res.ok and res.rc is None and "could not start" in res.describe()


def test_not_our_drain_is_refused_without_running_the_diag(tmp_path):
    slurm, store, runner = FakeSlurm(), Store(memory=True), Runner()
    slurm.admin_drain("n2", "bad PSU")
    res = diag.undrain_with_diag(cfg_for(tmp_path), slurm, store, ["n2"], "x", "alice", runner=runner, settle_s=0)
    assert not res[0].ok and "drained by someone else" in res[0].message
    assert runner.nodes == [] and store.diags() == [] and slurm.state("n2") == "IDLE+DRAIN"
    assert store.undrains()[0]["detail"] == "not our drain"


def test_node_with_jobs_still_running_is_not_diagnosed(tmp_path):
    slurm, store, runner = FakeSlurm(), Store(memory=True), Runner()
    slurm.set_state("n1", "MIXED+DRAIN", OURS.format(job=7))
    res = diag.undrain_with_diag(cfg_for(tmp_path), slurm, store, ["n1"], "x", "alice", runner=runner, settle_s=0)
    assert not res[0].ok and "diag not run: mixed" in res[0].message and runner.nodes == []


def test_drain_set_by_someone_else_during_the_diag_is_left_alone(tmp_path):
    slurm, store = FakeSlurm(), Store(memory=True)
    slurm.drain("n1", OURS.format(job=7))

    def runner(template, node, timeout_s):
        slurm.admin_drain(node, "admin: RMA ticket 12")  # a person stepped in meanwhile
        return Runner()(template, node, timeout_s)

    res = diag.undrain_with_diag(cfg_for(tmp_path), slurm, store, ["n1"], "x", "alice", runner=runner, settle_s=0)
    assert not res[0].ok and "state changed meanwhile" in res[0].message and "RMA ticket 12" in res[0].message
    assert slurm.reason("n1").startswith("admin: RMA ticket 12")


def test_no_diag_command_is_a_clear_error(tmp_path):
    cfg = cfg_for(tmp_path, command="")
    with pytest.raises(ConfigError, match=r"set \[actions\] diag_command .*%n is the node"):
        diag.undrain_with_diag(cfg, FakeSlurm(), Store(memory=True), ["n1"], "x", "alice")


# -- auto_undrain ---------------------------------------------------------------------------------


def test_auto_too_early_does_nothing(tmp_path):
    slurm, store, runner = FakeSlurm(), Store(memory=True), Runner()
    slurm.drain("n1", OURS.format(job=7))
    save_verdict(store, "7", "n1")
    [(dec, res)] = diag.auto_undrain(cfg_for(tmp_path, auto=True), slurm, store, now=time.time(), runner=runner)
    assert not dec.due and dec.why.startswith("waits:") and res is None
    assert runner.nodes == [] and slurm.state("n1") == "IDLE+DRAIN"


def test_auto_after_the_wait_resumes_once_then_a_second_drain_waits_for_a_person(tmp_path):
    slurm, store, runner = FakeSlurm(), Store(memory=True), Runner(ok=True)
    cfg = cfg_for(tmp_path, auto=True)
    slurm.drain("n1", OURS.format(job=7))
    slurm.admin_drain("n3", "admin: firmware")  # never ours to look at
    save_verdict(store, "7", "n1")
    later = time.time() + cfg.actions.auto_undrain_after_s + 60
    [(dec, res)] = diag.auto_undrain(cfg, slurm, store, now=later, runner=runner, settle_s=0)
    assert dec.due and res.ok and slurm.state("n1") == "IDLE" and runner.nodes == ["n1"]
    assert store.undrains()[0]["actor"] == diag.AUTO_ACTOR and store.diags()[0]["trigger"] == "auto"
    assert diag.auto_undrain(cfg, slurm, store, now=later, runner=runner) == []  # nothing of ours drained
    # The same node fails again: its one automatic chance is spent.
    drain_at(slurm, "n1", "8", later)
    save_verdict(store, "8", "n1")
    [(dec, res)] = diag.auto_undrain(cfg, slurm, store, now=later + 2 * cfg.actions.auto_undrain_after_s,
                                     runner=runner)
    assert not dec.due and "one automatic chance" in dec.why and "an earlier drain" in dec.why and res is None
    assert runner.nodes == ["n1"] and slurm.state("n1") == "IDLE+DRAIN"


def test_auto_failed_attempt_is_not_retried_for_this_drain_nor_the_next(tmp_path):
    slurm, store, runner = FakeSlurm(), Store(memory=True), Runner(ok=False)
    cfg = cfg_for(tmp_path, auto=True)
    slurm.drain("n1", OURS.format(job=7))
    save_verdict(store, "7", "n1")
    later = time.time() + cfg.actions.auto_undrain_after_s + 60
    [(dec, res)] = diag.auto_undrain(cfg, slurm, store, now=later, runner=runner, settle_s=0)
    assert dec.due and not res.ok and slurm.state("n1") == "IDLE+DRAIN"
    [(dec, res)] = diag.auto_undrain(cfg, slurm, store, now=later + 600, runner=runner)
    assert not dec.due and "this drain" in dec.why and runner.nodes == ["n1"]
    # Resumed by hand, drained again for another job: still a person's call.
    slurm.resume("n1")
    drain_at(slurm, "n1", "9", later + 600)
    save_verdict(store, "9", "n1")
    [(dec, res)] = diag.auto_undrain(cfg, slurm, store, now=later + 3 * cfg.actions.auto_undrain_after_s,
                                     runner=runner)
    assert not dec.due and "one automatic chance" in dec.why and runner.nodes == ["n1"]


def test_auto_never_for_a_recurring_gpu_nor_an_unknown_verdict(tmp_path):
    slurm, store, runner = FakeSlurm(), Store(memory=True), Runner()
    cfg = cfg_for(tmp_path, auto=True)
    slurm.drain("n1", OURS.format(job=7))
    save_verdict(store, "7", "n1", recurring=True)
    slurm.drain("n2", OURS.format(job=8))  # no verdict stored for job 8
    slurm.drain("n4", OURS.format(job=10))
    save_verdict(store, "10", "n4")  # near miss: the same drain without recurrence is resumed
    later = time.time() + cfg.actions.auto_undrain_after_s + 60
    out = {dec.node: (dec, res) for dec, res in diag.auto_undrain(cfg, slurm, store, now=later, runner=runner,
                                                                   settle_s=0)}
    assert "recurring GPU (gpu.xid_recurrent in job 7)" in out["n1"][0].why and not out["n1"][0].due
    assert "no stored verdict for job 8" in out["n2"][0].why and not out["n2"][0].due
    assert out["n4"][1].ok and runner.nodes == ["n4"]
    assert slurm.state("n1") == "IDLE+DRAIN" and slurm.state("n2") == "IDLE+DRAIN"


def test_auto_finds_the_drain_job_through_the_ledger_and_raw_job_id(tmp_path):
    slurm, store = FakeSlurm(), Store(memory=True)
    slurm.drain("n1", "SATTR: gpu_hardware xid79 gpu3b:00")  # a reason without its job
    v = hw_verdict("5_3", "n1")  # an array task: the ledger has Slurm's own id
    store.save({"job_id": "5_3", "slurm_job_id": "77", "nodes": ["n1"]}, v)
    store.ledger_record("n1", "77", "drain", "fast", "SATTR: gpu_hardware xid79 gpu3b:00")
    st = NodeState.from_record(slurm.show_node("n1"))
    assert diag.drain_jobs(store, "n1", st, time.time()) == ["77"]
    assert diag.recurrence(store, "n1", ["77"]) == (None, None)
    v.symptoms[0].evidence.append(Evidence(source="history", text="job 60 also logged it"))
    store.save({"job_id": "5_3", "slurm_job_id": "77", "nodes": ["n1"]}, v)
    assert diag.recurrence(store, "n1", ["77"])[0] == "gpu.xid_79 in job 77"


def test_auto_off_is_a_clear_error_and_the_periodic_path_starts_nothing(tmp_path):
    with pytest.raises(ConfigError, match=r"auto_undrain = true"):
        diag.auto_undrain(cfg_for(tmp_path), FakeSlurm(), Store(memory=True))
    started = []
    assert not diag.maybe_start_auto(cfg_for(tmp_path), spawn=started.append) and started == []


def test_periodic_path_starts_a_run_at_most_every_auto_every_s(tmp_path):
    cfg, started = cfg_for(tmp_path, auto=True), []
    now = 1_000_000.0
    assert diag.maybe_start_auto(cfg, now=now, spawn=started.append)
    assert not diag.maybe_start_auto(cfg, now=now + diag.AUTO_EVERY_S - 1, spawn=started.append)
    assert diag.maybe_start_auto(cfg, now=now + diag.AUTO_EVERY_S, spawn=started.append)
    assert [argv[1:] for argv in started] == [["-m", "slurm_attr.diag"]] * 2


def test_one_auto_run_at_a_time(tmp_path):
    cfg = cfg_for(tmp_path, auto=True)
    inner = []
    assert diag.run_locked(cfg, lambda: inner.append(diag.run_locked(cfg, lambda: "second")) or "first") == "first"
    assert inner == [None]  # the second run found the lock held and did nothing


# -- the CLI ----------------------------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path, monkeypatch):
    slurm = FakeSlurm()
    monkeypatch.setattr(drains, "default_backend", lambda *a, **k: slurm)
    monkeypatch.setattr(access, "caller", lambda: (0, "root"))
    monkeypatch.delenv("SUDO_USER", raising=False)
    db = tmp_path / "sattr.db"

    def run(*args, **actions):
        body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in actions.items())
        cfg = tmp_path / "slurm_attr.toml"
        cfg.write_text(f'[paths]\ndatabase = "{db}"\nspool = "{tmp_path / "spool"}"\n'
                       f'[intake]\nqueue_dir = "{tmp_path / "pending"}"\n[actions]\n{body}')
        return CliRunner().invoke(main, ["--config", str(cfg), *args], catch_exceptions=False)

    return type("Cli", (), {"run": staticmethod(run), "slurm": slurm, "db": str(db), "tmp": tmp_path})


def test_cli_undrain_diag_fail_then_pass_shown_in_drains(cli):
    flag = cli.tmp / "healthy"
    cmd = script(cli.tmp, "diag.sh", f'test -e {flag} && echo "all tests passed" || {{ echo "GPU 1 FAILED"; exit 2; }}\n')
    cli.slurm.drain("n1", OURS.format(job=7))
    res = cli.run("undrain", "n1", "--diag", "--reason", "reseated", diag_command=f"{cmd} %n")
    assert res.exit_code == 1 and "n1 stays drained: diag failed (rc 2" in res.output
    assert "running its diagnostic" in res.output and cli.slurm.state("n1") == "IDLE+DRAIN"
    flag.touch()
    res = cli.run("undrain", "n1", "--diag", "--reason", "reseated", diag_command=f"{cmd} %n")
    assert res.exit_code == 0 and "n1 resumed" in res.output and cli.slurm.state("n1") == "IDLE"
    data = json.loads(cli.run("drains", "--json").output)["decisions"]
    diags = [(d["node"], d["applied"], d["result"].split(" ")[0], d["path"]) for d in data if d["event"] == "diag"]
    assert sorted(diags) == [("n1", False, "failed", "manual"), ("n1", True, "passed", "manual")]
    assert [d["output_tail"] for d in data if d["event"] == "diag" and d["applied"]] == ["all tests passed\n"]
    text = cli.run("drains").output
    assert "diag" in text and "passed (rc 0" in text and "failed (rc 2" in text and "refused: diag failed" in text


def test_cli_undrain_diag_without_command_and_usage_errors(cli):
    cli.slurm.drain("n1", OURS.format(job=7))
    res = cli.run("undrain", "n1", "--diag", "--reason", "x")
    assert res.exit_code == 3 and "set [actions] diag_command" in res.output
    assert cli.slurm.state("n1") == "IDLE+DRAIN"
    assert cli.run("undrain", "--reason", "x").exit_code == 2
    assert cli.run("undrain", "n1", "--auto").exit_code == 2


def test_cli_undrain_auto(cli):
    cli.slurm.drain("n1", OURS.format(job=7))
    res = cli.run("undrain", "--auto")
    assert res.exit_code == 3 and "auto_undrain = true" in res.output
    res = cli.run("undrain", "--auto", diag_command="true %n", auto_undrain=True)
    assert res.exit_code == 0 and "n1: waits:" in res.output and cli.slurm.state("n1") == "IDLE+DRAIN"
