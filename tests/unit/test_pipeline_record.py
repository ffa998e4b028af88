"""EpilogSlurmctld only records (issue 23): the job's facts from the hook's own environment into
the intake, no Slurm call, a worker started only when a slot is free; off when the site says so."""

import pytest

from slurm_attr import hooks
from slurm_attr.pipeline import intake
from slurm_attr.collect.jobstate import expand_output_path, facts_from_env
from slurm_attr.config import load
from slurm_attr.pipeline import pool
from slurm_attr.slurm import cli as slurm_cli

# EpilogSlurmctld's environment for an array task on 22.05 (captured on the test cluster).
ENV = {"SLURM_JOB_ID": "662", "SLURM_ARRAY_JOB_ID": "661", "SLURM_ARRAY_TASK_ID": "2",
       "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_EXIT_CODE2": "3:0", "SLURM_JOB_EXIT_CODE": "768",
       "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "sattrtest", "SLURM_JOB_NAME": "wrap",
       "SLURM_JOB_PARTITION": "debug", "SLURM_JOB_ACCOUNT": "(null)", "SLURM_JOB_RESTART_COUNT": "0",
       "SLURM_JOB_STDIN": "/dev/null", "SLURM_JOB_STDOUT": "/tmp/o-%A_%3a.txt", "SLURM_JOB_WORK_DIR": "/tmp"}


@pytest.fixture
def site(tmp_path, monkeypatch):
    def write(extra=""):
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[paths]\nspool = "{tmp_path}/spool"\n[intake]\nqueue_dir = "{tmp_path}/q"\n{extra}')
        monkeypatch.setenv("SLURM_ATTR_CONFIG", str(cfg))
        return load(str(cfg))
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)

    def no_slurm(self, tool, *args):
        raise AssertionError(f"the hook asked Slurm: {tool} {args}")
    monkeypatch.setattr(slurm_cli.CliSlurm, "run", no_slurm)
    kicks = []
    monkeypatch.setattr(pool, "kick", lambda cfg, env: kicks.append(env["SLURM_JOB_ID"]) or True)
    return write, kicks


def test_the_hook_records_the_job_from_its_environment_without_asking_slurm(site, tmp_path):
    write, kicks = site
    cfg = write()
    assert hooks.main(["controller"]) == 0
    doc = intake.load(cfg, "662")
    job = doc["job"]
    assert (job["job_id"], job["slurm_job_id"], job["nodes"]) == ("661_2", "662", ["n1", "n2"])
    assert (job["exit_code"], job["signal"], job["state"], job["state_source"]) == (3, 0, "FAILED", "derived")
    assert (job["uid"], job["user"], job["partition"]) == (1001, "sattrtest", "debug")
    assert "account" not in job  # "(null)" is Slurm's word for none
    assert job["stdout_path"] == job["stderr_path"] == "/tmp/o-661_002.txt"
    assert kicks == ["662"]
    assert not (tmp_path / "spool" / "bundles" / "662").exists()  # the worker writes the bundle's part


def test_analysis_disabled_records_nothing_and_starts_nothing(site, tmp_path):
    write, kicks = site
    cfg = write("[analysis]\nenabled = false\n")
    assert hooks.main(["controller"]) == 0
    assert intake.entries(cfg) == [] and kicks == []


def test_facts_from_env_near_misses():
    # An interactive job (no stdin of slurmctld's choosing): no output path to tail.
    env = {k: v for k, v in ENV.items() if k not in ("SLURM_JOB_STDIN", "SLURM_JOB_STDOUT")}
    facts = facts_from_env(env)
    assert "stdout_path" not in facts and facts["batch"] is False
    # Batch without -o: slurm-%A_%a.out in the work dir; a job's name that looks like an id is its name.
    facts = facts_from_env({**ENV, "SLURM_JOB_STDOUT": "", "SLURM_JOB_NAME": "661_9"})
    assert facts["stdout_path"] == "/tmp/slurm-661_2.out" and facts["job_id"] == "661_2"
    # 26.05 gives the pattern as typed: relative to the work dir (an absolute one stays as it is).
    rel = facts_from_env({**ENV, "SLURM_JOB_STDOUT": "slurm-%j.out", "SLURM_JOB_WORK_DIR": "/home/u/run"})
    assert rel["stdout_path"] == rel["stderr_path"] == "/home/u/run/slurm-662.out"
    # Not an array task: the raw id; a killed job (0:9) is CANCELLED, a clean exit undecided.
    plain = {k: v for k, v in ENV.items() if not k.startswith("SLURM_ARRAY")}
    assert facts_from_env({**plain, "SLURM_JOB_EXIT_CODE2": "0:9"})["state"] == "CANCELLED"
    ok = facts_from_env({**plain, "SLURM_JOB_EXIT_CODE2": "0:0"})
    assert ok["job_id"] == "662" and "state" not in ok


@pytest.mark.parametrize("pattern,expected", [
    ("/o/%j.out", "/o/662.out"),
    ("/o/%A_%a-%x-%u.out", "/o/661_2-wrap-sattrtest.out"),
    ("/o/%5j.%N.%%", "/o/00662.n1.%"),
    ("/o/\\%j.out", "/o/%j.out"),  # a backslash turns replacement off
    ("/o/%q.out", "/o/%q.out"),    # not a pattern letter: kept
])
def test_output_patterns(pattern, expected):
    facts = {"slurm_job_id": "662", "nodes": ["n1", "n2"], "user": "sattrtest", "name": "wrap"}
    assert expand_output_path(pattern, facts, "661", "2") == expected


def test_slots_bound_the_workers_and_come_back(tmp_path):
    cfg = load(None)
    cfg.intake.queue_dir = str(tmp_path / "q")
    cfg.analysis.workers = 2
    a, b = pool._take_slot(cfg), pool._take_slot(cfg)
    assert a is not None and b is not None and pool._take_slot(cfg) is None
    import os
    os.close(a)
    c = pool._take_slot(cfg)
    assert c is not None
    os.close(b), os.close(c)
