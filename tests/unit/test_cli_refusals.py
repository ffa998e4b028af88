"""Issue 21 item 7: `sattr fr` and `sattr report` refuse another user's job as `sattr JOB` does,
never answering with an empty "no divergence" made of files the caller could not open."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from slurm_attr import access
from slurm_attr.cli import main
from slurm_attr.model import Verdict
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm

DENIED = "job 7 belongs to another user: you can see only your own jobs"


class Accounting(FakeSlurm):
    """sacct's row for job 7 (alice's), as `_check_in_accounting` reads it."""

    def sacct_job(self, job_id):
        return {"JobIDRaw": job_id, "User": "alice", "Partition": "debug"} if job_id == "7" else None


def _entry(seq: int, size: int) -> dict:
    return {"record_id": seq, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": 1000 + seq,
            "input_sizes": [[size]], "output_sizes": [[size]], "input_dtypes": ["Float"], "output_dtypes": ["Float"],
            "state": "completed", "retired": True, "timeout_ms": 1000, "is_p2p": False}


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Job 7 of alice (uid 1001) analysed, its bundle in the spool with a size mismatch on rank 1."""
    db = tmp_path / "sattr.db"
    cfg = tmp_path / "slurm_attr.toml"
    cfg.write_text(f'[paths]\ndatabase = "{db}"\nspool = "{tmp_path / "spool"}"\n'
                   f'[intake]\nqueue_dir = "{tmp_path / "pending"}"\n')
    Store(str(db)).save({"job_id": "7", "user": "alice", "uid": 1001, "nodes": ["n1"]},
                        Verdict(job_id="7", cause="collective_mismatch", summary="rank 1 passed other sizes"))
    bundle = tmp_path / "spool" / "bundles" / "7"
    fr = bundle / "nodes" / "n1" / "fr"
    fr.mkdir(parents=True)
    (bundle / "job.json").write_text(json.dumps({"job_id": "7", "user": "alice", "nodes": ["n1"]}))
    for rank in range(3):
        doc = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
               "entries": [_entry(1, 4), _entry(2, 8 if rank == 1 else 4)]}
        (fr / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(doc))
    monkeypatch.setattr(access, "default_backend", lambda *a, **k: Accounting())

    def run(user: tuple[int, str], *args: str):
        monkeypatch.setattr(access, "caller", lambda: user)
        return CliRunner().invoke(main, ["--config", str(cfg), *args])

    return type("Env", (), {"run": staticmethod(run), "tmp": tmp_path, "bundle": bundle, "db": db})


BOB, ALICE, ROOT = (1002, "bob"), (1001, "alice"), (0, "root")


def _fr_args(env, kind: str) -> list[str]:
    return ["fr", "7"] if kind == "fr" else ["report", "7", "--html", str(env.tmp / "r.html")]


@pytest.mark.parametrize("kind", ["fr", "report"])
def test_another_users_job_is_refused_as_sattr_job_refuses_it(env, kind):
    show = env.run(BOB, "7")
    assert show.exit_code == 5 and DENIED in show.output
    got = env.run(BOB, *_fr_args(env, kind))
    assert (got.exit_code, got.output) == (show.exit_code, show.output)
    assert not (env.tmp / "r.html").exists()
    # the bundle named by its directory in the spool is the same job
    path = env.run(BOB, "fr", str(env.bundle) + "/")
    assert path.exit_code == 5 and DENIED in path.output


@pytest.mark.parametrize("kind", ["fr", "report"])
def test_refused_by_accounting_when_the_database_is_not_readable(env, kind, monkeypatch):
    """What a user meets on a site whose verdict database is root's (the test cluster)."""
    monkeypatch.setattr(access, "can_read_database", lambda path: False)
    got = env.run(BOB, *_fr_args(env, kind))
    assert got.exit_code == 5 and DENIED in got.output


@pytest.mark.parametrize("user", [ALICE, ROOT])
def test_near_miss_the_owner_and_root_see_the_matrix(env, user):
    got = env.run(user, "fr", "7")
    assert got.exit_code == 0, got.output
    assert "rank 1 passed" in got.output and "No divergence" not in got.output
    rep = env.run(user, "report", "7", "--html", str(env.tmp / "r.html"))
    assert rep.exit_code == 0 and "rank 1 passed" in (env.tmp / "r.html").read_text()


def test_a_bundle_the_owner_cannot_read_is_said_so(env, monkeypatch):
    """A spool readable only by root: the owner is told, not shown an empty matrix."""
    real = os.access
    top = str(env.bundle)
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p).startswith(top) else real(p, mode, **k))
    got = env.run(ALICE, "fr", "7")
    assert got.exit_code == 5 and "readable only by admins" in got.output and "sattr 7" in got.output
    assert "No divergence" not in got.output


def test_a_dump_directory_outside_the_spool_needs_no_job(env):
    """Near miss: `sattr fr DIR` on the caller's own dumps asks nobody about a job."""
    got = env.run(BOB, "fr", str(env.bundle / "nodes" / "n1" / "fr"))
    assert got.exit_code == 0 and "rank 1 passed" in got.output
