"""sattr-record, EpilogSlurmctld's native front (issue 23): the hook environment into the intake in
a few milliseconds, a worker started only into a free slot, everything else handed to the Python
hook; the worker's ingest turns the record into the same pending entry the Python hook writes."""
import fcntl
import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_attr.collect.jobstate import facts_from_env
from slurm_attr.config import load
from slurm_attr.pipeline import ctldrecord, intake

REPO = Path(__file__).resolve().parents[2]
FRONT = REPO / "spank" / "build" / "sattr-record"

ENV = {"SLURM_JOB_ID": "662", "SLURM_ARRAY_JOB_ID": "661", "SLURM_ARRAY_TASK_ID": "2",
       "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_EXIT_CODE2": "3:0", "SLURM_JOB_UID": "1001",
       "SLURM_JOB_USER": "sattrtest", "SLURM_JOB_NAME": "a name with spaces and = signs",
       "SLURM_JOB_STDIN": "/dev/null", "SLURM_JOB_STDOUT": "/tmp/o-%j.txt", "SPANK_SATTR_ENABLED": "1"}


@pytest.fixture(scope="module")
def front():
    subprocess.run(["make", "-s", "-C", str(REPO / "spank"), "build/sattr-record"], check=True)
    return str(FRONT)


@pytest.fixture
def site(tmp_path):
    fake = tmp_path / "python"  # stands in for the interpreter: says how it was started
    fake.write_text("#!/bin/sh\necho \"$* fd=$SLURM_ATTR_WORKER_FD\" >> \"$0.calls\"\n"
                    "[ \"$3\" = work ] && sleep 1\nexit 0\n")
    fake.chmod(0o755)

    def run(extra_cfg="", env=None, hold_slots=0):
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[paths]\nspool = "{tmp_path}/spool"\n\n[intake]\nqueue_dir = "{tmp_path}/q"\n'
                       f"\n[analysis]\nworkers = 2\n{extra_cfg}")
        (tmp_path / "q").mkdir(exist_ok=True)
        held = []
        for i in range(hold_slots):
            fd = os.open(tmp_path / "q" / f".worker-{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(fd)
        e = {"PATH": "/usr/bin:/bin", "SLURM_ATTR_CONFIG": str(cfg), "SLURM_ATTR_PYTHON": str(fake),
             "HOME": "/root", **(ENV if env is None else env)}
        t0 = time.monotonic()
        proc = subprocess.run([front_path()], env=e, capture_output=True, text=True, timeout=30)
        took = time.monotonic() - t0
        for fd in held:
            os.close(fd)
        c = load(str(cfg))
        calls = tmp_path / "python.calls"
        return proc, c, (calls.read_text() if calls.exists() else ""), took
    return run


def front_path():
    return str(FRONT)


def test_the_record_holds_the_hook_environment_and_ingests_to_the_python_hooks_entry(front, site):
    proc, cfg, calls, _took = site(hold_slots=2)  # every slot busy: no worker started
    assert proc.returncode == 0 and calls == ""
    data = Path(cfg.intake.queue_dir, "662.env").read_bytes()
    env = ctldrecord.parse_env_record(data)
    assert env == ENV  # PATH, HOME and the config variables are not the job's facts: left out
    assert intake.keys(cfg) == {"662"}  # pending before any worker read it
    assert ctldrecord.ingest(cfg) == 1
    assert not Path(cfg.intake.queue_dir, "662.env").exists()
    job = intake.load(cfg, "662")["job"]
    assert job == {**facts_from_env(ENV), "opted_out": False}
    assert job["job_id"] == "661_2" and job["name"] == ENV["SLURM_JOB_NAME"]


def test_a_free_slot_gets_a_worker_that_holds_it(front, site, tmp_path):
    proc, cfg, _calls, _took = site()
    assert proc.returncode == 0
    deadline = time.monotonic() + 10
    while not (tmp_path / "python.calls").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    line = (tmp_path / "python.calls").read_text()
    assert line.startswith("-m slurm_attr.hooks work fd=")
    fd = os.open(Path(cfg.intake.queue_dir, ".worker-0.lock"), os.O_RDWR)
    try:  # the fake worker (sleeping 1 s) holds slot 0
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_turned_off_records_nothing(front, site):
    proc, cfg, calls, _took = site("enabled = false\n")
    assert proc.returncode == 0 and calls == "" and not os.listdir(cfg.intake.queue_dir)


def test_an_odd_job_id_goes_to_the_python_hook(front, site):
    proc, cfg, calls, _took = site(env={**ENV, "SLURM_JOB_ID": "12;rm"})
    assert proc.returncode == 0 and calls.startswith("-m slurm_attr.hooks controller")
    assert not [n for n in os.listdir(cfg.intake.queue_dir) if n.endswith(".env")]


def test_a_config_it_does_not_read_goes_to_the_python_hook(front, tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"$*\" >> \"$0.calls\"\n")
    fake.chmod(0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[intake]\nqueue_dir = "{tmp_path}\\\\q"\n')  # an escape: TOML this front leaves to Python
    proc = subprocess.run([front_path()], env={"SLURM_ATTR_CONFIG": str(cfg), "SLURM_ATTR_PYTHON": str(fake), **ENV},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "config not read here" in proc.stderr
    assert (tmp_path / "python.calls").read_text() == "-m slurm_attr.hooks controller\n"


def test_a_requeued_job_is_its_own_key(front, site):
    proc, cfg, _calls, _took = site(env={**ENV, "SLURM_JOB_RESTART_COUNT": "2"}, hold_slots=2)
    assert Path(cfg.intake.queue_dir, "662.r2.env").is_file()
    assert ctldrecord.ingest(cfg) == 1 and intake.keys(cfg) == {"662.r2"}


def test_a_record_that_cannot_be_recorded_now_stays(tmp_path):
    cfg = load(None)
    cfg.intake.queue_dir = str(tmp_path / "q")
    os.makedirs(cfg.intake.queue_dir)
    Path(cfg.intake.queue_dir, "5.env").write_bytes(b"SLURM_JOB_ID=5\0SLURM_JOB_NODELIST=n1\0")
    os.chmod(cfg.intake.queue_dir, 0o500)  # root ignores modes: make the record write fail instead
    import slurm_attr.pipeline.intake as im
    orig = im._atomic_write
    try:
        im._atomic_write = lambda path, doc: (_ for _ in ()).throw(OSError(28, "No space left on device"))
        assert ctldrecord.ingest(cfg) == 0 and Path(cfg.intake.queue_dir, "5.env").exists()
    finally:
        im._atomic_write = orig
        os.chmod(cfg.intake.queue_dir, 0o700)
    assert ctldrecord.ingest(cfg) == 1 and intake.keys(cfg) == {"5"}


def test_the_worker_starts_at_the_lowest_priority_before_its_interpreter(front, tmp_path):
    """The worker's interpreter start runs in the batch class at nice 19 (as pool.py sets once
    Python runs), not at the hook's priority beside slurmctld. Near miss: with every slot held
    no worker is started at all (the record is still written)."""
    fake = tmp_path / "python"
    # written whole, then renamed: the test reads the file as soon as it exists (a file the
    # shell's >> creates before awk writes to it read empty under load)
    fake.write_text("#!/bin/sh\n"
                    "awk '{print \"nice=\" $19 \" policy=\" $41}' /proc/$$/stat > \"$0.calls.tmp\" && "
                    "mv \"$0.calls.tmp\" \"$0.calls\"\n")
    fake.chmod(0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[intake]\nqueue_dir = "{tmp_path}/q"\n\n[analysis]\nworkers = 1\n')
    env = {"PATH": "/usr/bin:/bin", "SLURM_ATTR_CONFIG": str(cfg), "SLURM_ATTR_PYTHON": str(fake), **ENV}
    calls = tmp_path / "python.calls"
    proc = subprocess.run([front_path()], env=env, capture_output=True, text=True, timeout=30)
    deadline = time.monotonic() + 10
    while not calls.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.returncode == 0 and calls.read_text() == "nice=19 policy=3\n"  # 3: SCHED_BATCH
    # near miss: the slot held by a running worker, so no second one and nothing lowered
    calls.unlink()
    fd = os.open(tmp_path / "q" / ".worker-0.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        env["SLURM_JOB_ID"] = "663"
        proc = subprocess.run([front_path()], env=env, capture_output=True, text=True, timeout=30)
    finally:
        os.close(fd)
    time.sleep(0.3)
    assert proc.returncode == 0 and not calls.exists() and Path(tmp_path, "q", "663.env").is_file()
