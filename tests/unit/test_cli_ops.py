"""The operators' commands through click's CliRunner, against a FakeSlurm and a temporary database."""
from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from slurm_attr import access
from slurm_attr.cli import drains, fleet, main, ops
from slurm_attr.model import Action, Coverage, Evidence, Symptom, Verdict
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm, hw_verdict


@pytest.fixture
def env(tmp_path, monkeypatch):
    db = tmp_path / "attr" / "sattr.db"
    cfg = tmp_path / "slurm_attr.toml"
    cfg.write_text(f'[paths]\ndatabase = "{db}"\nspool = "{tmp_path / "spool"}"\n'
                   f'evidence_root = "{tmp_path / "ev"}"\n[drain]\nmax_partition_percent = 100.0\n')
    slurm = FakeSlurm()
    monkeypatch.setattr(ops, "default_backend", lambda *a, **k: slurm)
    monkeypatch.setattr(fleet, "default_backend", lambda *a, **k: slurm)
    monkeypatch.setattr(drains, "default_backend", lambda *a, **k: slurm)
    monkeypatch.setattr(access, "default_backend", lambda *a, **k: slurm)
    monkeypatch.setattr(access, "caller", lambda: (0, "root"))
    monkeypatch.delenv("SUDO_USER", raising=False)

    class Env:
        pass

    e = Env()
    e.db, e.cfg, e.slurm, e.tmp = str(db), str(cfg), slurm, tmp_path
    e.store = Store(str(db))

    def run(*args, user=None):
        if user:
            monkeypatch.setattr(access, "caller", lambda: (1000 + len(user), user))
        else:
            monkeypatch.setattr(access, "caller", lambda: (0, "root"))
        return CliRunner().invoke(main, ["--config", str(cfg), *args], catch_exceptions=False)

    e.run = run
    return e


def _save(store, job_id, user, cause="gpu_hardware", node="n2", nodes=("n1", "n2"), actions=None, bundle=""):
    if cause == "gpu_hardware":
        v = hw_verdict(job_id, node)
    else:
        v = Verdict(job_id=job_id, cause=cause, summary=f"{cause} happened")
    v.actions = actions or []
    store.save({"job_id": job_id, "user": user, "uid": 1000 + len(user), "partition": "debug", "nodes": list(nodes),
                "state": "FAILED", "exit_code": 1, "signal": 0, "start_time": "2026-11-30T10:00:00+00:00",
                "end_time": "2026-11-30T10:12:34+00:00"}, v, bundle_path=bundle)
    if v.actions:
        store.record_actions(job_id, v.actions, path="central")
    return v


def _all_commands(group: click.Group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, prefix + (name,))


def test_every_command_has_help_with_an_example():
    seen = []
    for path, cmd in _all_commands(main):
        seen.append(" ".join(path))
        assert cmd.help and cmd.help.strip(), f"sattr {' '.join(path)} has no help"
        assert "Example" in cmd.help, f"sattr {' '.join(path)}: help has no Example"
        res = CliRunner().invoke(main, [*path, "--help"])
        assert res.exit_code == 0 and "Example" in res.output
    for name in ("list", "nodes", "drains", "undrain", "breaker", "breaker status", "breaker reset", "reanalyze",
                 "show", "analyze"):
        assert name in seen


@pytest.mark.parametrize("value,ago", [("1d", 86400), ("12h", 43200), ("30m", 1800), ("2w", 14 * 86400), ("90s", 90)])
def test_parse_since_spans(value, ago):
    assert ops.parse_since(value, now=1_000_000.0) == 1_000_000.0 - ago


def test_parse_since_iso_and_bad():
    assert ops.parse_since("2026-01-02T00:00:00+00:00") == 1767312000.0
    with pytest.raises(click.BadParameter):
        ops.parse_since("yesterday")


def test_list_filters_and_json(env):
    _save(env.store, "10", "alice", "gpu_hardware", nodes=("n1", "n2"))
    _save(env.store, "11", "bob", "user_error", nodes=("n3",))
    res = env.run("list", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["job_id"] for r in rows} == {"10", "11"}
    assert json.loads(env.run("list", "--cause", "user_error", "--json").output)[0]["job_id"] == "11"
    assert [r["job_id"] for r in json.loads(env.run("list", "--node", "n2", "--json").output)] == ["10"]
    assert [r["job_id"] for r in json.loads(env.run("list", "--user", "bob", "--json").output)] == ["11"]
    out = env.run("list").output
    assert "JOB" in out and "gpu_hardware" in out and "alice" in out


def test_list_as_user_shows_only_own_jobs(env, monkeypatch):
    _save(env.store, "10", "alice")
    _save(env.store, "11", "bob", "user_error")
    res = env.run("list", "--json", user="alice")
    assert res.exit_code == 0 and [r["job_id"] for r in json.loads(res.output)] == ["10"]
    res = env.run("list", "--user", "bob", user="alice")
    assert res.exit_code == 5 and "only your own" in res.output
    monkeypatch.setattr(access, "can_read_database", lambda path: False)
    res = env.run("list", user="alice")
    assert res.exit_code == 5 and "readable only by admins" in res.output and "sattr JOBID" in res.output


@pytest.mark.parametrize("args", [["nodes"], ["drains"], ["undrain", "n1", "--reason", "x"], ["breaker", "status"],
                                  ["breaker", "reset"], ["reanalyze", "1"]])
def test_admin_only_commands_refuse_users(env, args):
    res = env.run(*args, user="mallory")
    assert res.exit_code == 5, res.output
    assert "for admins" in res.output


def test_undrain_command(env):
    env.slurm.drain("n1", "SATTR: gpu_hardware xid79 job 10")
    env.slurm.admin_drain("n2", "rma")
    res = env.run("undrain", "n[1-2]", "--reason", "diag passed")
    assert res.exit_code == 1
    assert "n1 resumed" in res.output and "n2 refused" in res.output and "1 of 2" in res.output
    assert env.slurm.state("n1") == "IDLE" and env.slurm.state("n2") == "IDLE+DRAIN"
    ok = env.run("undrain", "n1", "n3", "--reason", "again")
    assert ok.exit_code == 0 and "not drained" in ok.output
    rows = env.store.undrains()
    assert {(r["node"], r["ok"], r["actor"]) for r in rows} == {("n1", 1, "root"), ("n2", 0, "root")}


def test_undrain_needs_a_reason(env):
    res = env.run("undrain", "n1")
    assert res.exit_code == 2 and "--reason" in res.output


def test_undrain_records_sudo_user(env, monkeypatch):
    env.slurm.drain("n1", "SATTR: x job 1")
    monkeypatch.setenv("SUDO_USER", "alice")
    assert env.run("undrain", "n1", "--reason", "ok").exit_code == 0
    assert env.store.undrains()[0]["actor"] == "root (sudo from alice)"


def test_drains_history_includes_blocked_dry_run_and_undrains(env):
    _save(env.store, "20", "alice", actions=[Action("drain", "n1", "SATTR: gpu_hardware xid79 job 20", True)])
    _save(env.store, "21", "alice", node="n2",
          actions=[Action("drain", "n2", "SATTR: gpu_hardware xid79 job 21", False, "circuit breaker")])
    _save(env.store, "22", "alice", node="n3",
          actions=[Action("drain", "n3", "SATTR: gpu_hardware xid79 job 22", False, "dry-run")])
    env.slurm.drain("n1", "SATTR: gpu_hardware xid79 job 20")
    assert env.run("undrain", "n1", "--reason", "fixed the riser").exit_code == 0
    data = json.loads(env.run("drains", "--json").output)
    events = [(d["event"], d["node"], d["applied"], d["blocked_by"]) for d in data["decisions"]]
    assert ("undrain", "n1", True, None) in events
    assert ("drain", "n1", True, None) in events
    assert ("drain", "n2", False, "circuit breaker") in events
    assert ("drain", "n3", False, "dry-run") in events
    text = env.run("drains").output
    assert "fixed the riser" in text and "blocked: circuit breaker" in text and "blocked: dry-run" in text


def test_breaker_status_and_reset(env):
    with env.store.transaction():
        env.store.trip_breaker("5 automatic drains in the last 3600s (max 5)")
    out = env.run("breaker", "status").output
    assert "TRIPPED" in out and "5 automatic drains" in out and "partition debug" in out
    st = json.loads(env.run("breaker", "status", "--json").output)
    assert st["tripped"] is True and st["partitions"][0]["total"] == 4
    res = env.run("breaker", "reset", "--reason", "looked at it")
    assert res.exit_code == 0 and "breaker reset" in res.output
    row = Store(env.db).breaker()
    assert not row["tripped"] and row["reset_by"] == "root" and row["reset_why"] == "looked at it"
    assert json.loads(env.run("breaker", "status", "--json").output)["tripped"] is False


def test_nodes_report_worst_first_with_recurrence(env):
    _save(env.store, "30", "alice", node="n2", nodes=("n1", "n2"))
    _save(env.store, "31", "alice", node="n2", nodes=("n2", "n3"))
    _save(env.store, "32", "bob", "user_error", nodes=("n3",))
    env.slurm.drain("n2", "SATTR: gpu_hardware xid79 gpu3b:00 job 31")
    report = json.loads(env.run("nodes", "--json").output)
    assert report[0]["node"] == "n2"
    n2 = report[0]
    assert n2["hardware_jobs"] == 2 and n2["recurring"] is True and n2["drained_by_us"] is True
    assert n2["gpus"][0]["gpu"] == "0000:3b:00" and n2["gpus"][0]["recurring"] == ["gpu.xid_79"]
    assert n2["culprit_of"] == {"gpu_hardware": 2}
    assert "drain" in n2["state"] and n2["reason"].startswith("SATTR:")
    text = env.run("nodes").output
    assert text.splitlines()[1].startswith("n2") and "gpu.xid_79 x2" in text


def test_reanalyze_reruns_finish_job_on_the_stored_bundle(env, monkeypatch):
    bdir = env.tmp / "spool" / "bundles" / "40"
    bdir.mkdir(parents=True)
    _save(env.store, "40", "alice", "user_error", bundle=str(bdir))
    _save(env.store, "41", "alice", "user_error", bundle=str(env.tmp / "gone"))
    calls = []

    def fake_finish(cfg, slurm, store, path):
        calls.append((path, cfg.analysis.node_wait_s))
        return Verdict(job_id="40", cause="gpu_hardware", summary="now we know")

    import slurm_attr.pipeline.finish as pm

    monkeypatch.setattr(pm, "finish_job", fake_finish)
    res = env.run("reanalyze", "40")
    assert res.exit_code == 0, res.output
    assert calls == [(str(bdir), 0.0)]
    assert "40: gpu_hardware (was user_error)" in res.output
    res = env.run("reanalyze", "41")
    assert res.exit_code == 4 and "is gone" in res.output
    assert env.run("reanalyze").exit_code == 2


def test_show_renders_like_jobstats(env):
    v = hw_verdict("50", "n2")
    v.symptoms.append(Symptom(id="nccl.remote_error", cause="network", role="cascade", node="n1", rank=0,
                              evidence=[Evidence("nccl", "nodes/n1/nccl/x", 4, "NCCL WARN remote error")]))
    v.coverage.append(Coverage(source="fr", node="n1", status="missing", detail="no dumps"))
    v.actions = [Action("drain", "n2", "SATTR: gpu_hardware xid79 gpu3b:00 job 50", False, "already drained")]
    store = env.store
    store.save({"job_id": "50", "user": "alice", "uid": 1005, "partition": "debug", "nodes": ["n1", "n2"],
                "state": "FAILED", "exit_code": 1, "signal": 0, "start_time": "2026-11-30T10:00:00+00:00",
                "end_time": "2026-11-30T11:02:03+00:00"}, v)
    out = env.run("50").output
    for expect in ("Job 50", "User: alice", "Partition: debug", "Run Time: 01:02:03", "Verdict: gpu_hardware (hardware)",
                   "Culprit: nodes n2", "[kernel n2] nodes/n2/kernel.log:3", "cascade: nccl.remote_error on n1, rank 0",
                   "Coverage gaps:", "fr on n1: missing", "Notes:", "n2 drained; run the GPU/host diagnostic",
                   "sattr undrain n2"):
        assert expect in out, (expect, out)
    # The cascade is folded under its root, before the gaps.
    assert out.index("cascade: nccl.remote_error") < out.index("Coverage gaps:")
    assert "\x1b[" not in out  # no colour when not on a terminal
    assert json.loads(env.run("50", "--json").output)["actions"][0]["blocked_by"] == "already drained"


def test_show_refuses_other_users_job_with_exit_5(env):
    _save(env.store, "60", "alice")
    res = env.run("60", user="bob")
    assert res.exit_code == 5 and "belongs to another user" in res.output
    assert env.run("60", user="alice").exit_code == 0


def test_text_table_pads_plain_columns_and_leaves_cells_as_they_are():
    rows = [["1", "  gpu 0", "\x1b[31mhw\x1b[0m", "x  "], ["12345", "bob", "user_error", "ok"]]
    assert ops.text_table(rows, ["JOB", "NODE", "CAUSE", "SUMMARY"]).split("\n") == [
        "JOB    NODE     CAUSE       SUMMARY",
        "1        gpu 0  \x1b[31mhw\x1b[0m          x",  # left-aligned numbers, an indent kept, colour not counted
        "12345  bob      user_error  ok",
    ]
    # near miss: one row, so no column wider than its header needs
    assert ops.text_table([["7", "n1"]], ["JOB", "NODE"]) == "JOB  NODE\n7    n1"
    assert ops.text_table([], ["JOB", "NODE"]) == ""


class _Tty:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("tty, no_color, expect", [
    (True, None, True), (True, "", True),  # NO_COLOR set but empty does not count (no-color.org)
    (True, "1", False), (True, "0", False),  # any other value turns colour off
    (False, None, False),  # a pipe or a file: never
])
def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch, tty, no_color, expect):
    from slurm_attr.cli import options

    monkeypatch.setattr(options.sys, "stdout", _Tty(tty))
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    assert options.use_color() is expect


def test_list_colours_the_cause_by_domain_only_when_asked(env, monkeypatch):
    _save(env.store, "10", "alice", "gpu_hardware")
    _save(env.store, "11", "bob", "user_error", nodes=("n3",))
    monkeypatch.setattr(ops, "use_color", lambda: True)
    out = CliRunner().invoke(main, ["--config", env.cfg, "list"], color=True).output
    assert "\x1b[31mgpu_hardware\x1b[0m" in out and "\x1b[33muser_error\x1b[0m" in out
    monkeypatch.setattr(ops, "use_color", lambda: False)
    plain = env.run("list").output
    assert "\x1b[" not in plain and "gpu_hardware" in plain and "user_error" in plain
