"""Without [intake] hook_fsync the controller hook's front (sattr-record) does not fsync its record:
a crash can leave it empty, cut or with blocks never written. Its trailer (byte count and CRC-32)
tells; a record that does not check is recorded by its file name and its facts are asked of
accounting before the analysis. The front fsyncs only when the site asks for it."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_attr.config import load
from slurm_attr.errors import SlurmUnavailable
from slurm_attr.pipeline import attempt, ctldrecord, finish, intake, pool
from slurm_attr.slurm.cli import SACCT_FIELDS

REPO = Path(__file__).resolve().parents[2]
ENV = {"SLURM_JOB_ID": "662", "SLURM_ARRAY_JOB_ID": "661", "SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_NODELIST": "n[1-2]",
       "SLURM_JOB_EXIT_CODE2": "3:0", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "sattrtest",
       "SLURM_JOB_NAME": "a name with = and \u00e9", "SPANK_SATTR_ENABLED": "1"}


from test_record_front import front  # noqa: E402,F401 - the front, built once (make build/sattr-record)


@pytest.fixture
def cfg(tmp_path):
    c = load(None)
    c.intake.queue_dir = str(tmp_path / "q")
    c.paths.spool = str(tmp_path / "spool")
    c.paths.database = str(tmp_path / "sattr.db")
    c.comment.enabled = False
    return c


def run_front(front, tmp_path, extra="", job="662", trace=False):
    conf = tmp_path / "c.toml"
    conf.write_text(f'[intake]\nqueue_dir = "{tmp_path}/q"\n{extra}\n[analysis]\nworkers = 0\n')
    env = {"PATH": "/usr/bin:/bin", "SLURM_ATTR_CONFIG": str(conf), "SLURM_ATTR_PYTHON": "/bin/true",
           **ENV, "SLURM_JOB_ID": job}
    cmd = [front]
    if trace:
        cmd = ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,syncfs", "-o", str(tmp_path / "trace"), front]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    return proc, (tmp_path / "q" / f"{job}.env")


def test_the_fronts_record_checks_and_any_damage_does_not(front, tmp_path):
    proc, path = run_front(front, tmp_path)
    data = path.read_bytes()
    assert proc.returncode == 0 and data.endswith(b"\0") and b"SATTR_RECORD_END=" in data
    body = ctldrecord.checked_body(data)
    assert body is not None and ctldrecord.parse_env_record(body) == ENV  # C and Python agree on the CRC
    cut_at_a_variable = data[:data.index(b"SATTR_RECORD_END=")]
    for torn in (b"", data[:-1], data[:len(data) // 2], cut_at_a_variable,
                 data[:10] + b"\0" * 8 + data[18:],  # a block never written
                 data.replace(b"sattrtest", b"sattrtesu"), b"\0" * len(data)):
        assert ctldrecord.checked_body(torn) is None, torn[:40]


def test_the_front_fsyncs_only_with_hook_fsync(front, tmp_path):
    if not shutil.which("strace"):
        pytest.skip("no strace here")
    proc, path = run_front(front, tmp_path, trace=True)
    assert proc.returncode == 0 and path.is_file()
    assert "fsync" not in (tmp_path / "trace").read_text()  # the default: none
    path.unlink()
    proc, path = run_front(front, tmp_path, "hook_fsync = true\n", trace=True)
    assert proc.returncode == 0 and path.is_file()
    assert (tmp_path / "trace").read_text().count("fsync(") == 2  # near miss: the record and the directory
    path.unlink()
    proc, path = run_front(front, tmp_path, "hook_fsync = false\n")
    assert proc.returncode == 0 and path.is_file() and ctldrecord.checked_body(path.read_bytes()) is not None


def test_a_hook_fsync_the_front_does_not_read_goes_to_the_python_hook(front, tmp_path):
    proc, path = run_front(front, tmp_path, 'hook_fsync = "yes"\n')
    assert proc.returncode == 0 and "config not read here" in proc.stderr and not path.exists()
    with pytest.raises(Exception, match="hook_fsync"):
        load(str(tmp_path / "c.toml"))  # the Python side refuses it too


def test_an_empty_record_becomes_a_pending_job_whose_facts_come_from_accounting(cfg, front, tmp_path):
    os.makedirs(cfg.intake.queue_dir)
    Path(cfg.intake.queue_dir, "77.env").write_bytes(b"")  # the crash came before the data reached the disk
    Path(cfg.intake.queue_dir, "78.r1.env").write_bytes(b"SLURM_JOB_ID=78\0SLURM_JOB_NO")  # cut
    proc, _path = run_front(front, tmp_path, job="79")  # near miss: a whole record
    assert ctldrecord.ingest(cfg) == 3 and not [n for n in os.listdir(cfg.intake.queue_dir) if n.endswith(".env")]
    torn = intake.load(cfg, "77")
    assert torn["job"] == {"job_id": "77", "slurm_job_id": "77", "facts_source": "torn"} and "torn" in torn["note"]
    assert intake.load(cfg, "78.r1")["job"] == {"job_id": "78", "slurm_job_id": "78", "facts_source": "torn",
                                               "restart_count": 1}
    whole = intake.load(cfg, "79")["job"]
    assert whole["facts_source"] == "env" and whole["job_id"] == "661_2" and whole["user"] == "sattrtest"


def test_a_torn_record_beside_an_entry_keeps_the_entrys_facts(cfg):
    intake.record(cfg, "81", {"job_id": "81", "slurm_job_id": "81", "user": "bob", "facts_source": "sacct"})
    Path(cfg.intake.queue_dir, "81.env").write_bytes(b"")
    Path(cfg.intake.queue_dir, "notajob.env").write_bytes(b"")
    assert ctldrecord.ingest(cfg) == 2
    assert intake.load(cfg, "81")["job"]["user"] == "bob" and intake.keys(cfg) == {"81"}


class Acct:
    def __init__(self, rows, down=False):
        self.rows, self.down, self.asked = rows, down, []

    def sacct_job(self, job_id):
        self.asked.append(job_id)
        if self.down:
            raise SlurmUnavailable("sacct: error: Problem talking to the database")
        return self.rows.get(job_id)


def _row(raw, job_id):
    r = {k: "" for k in SACCT_FIELDS}
    r.update(JobID=job_id, JobIDRaw=raw, User="root", Partition="debug", NodeList="n3", State="FAILED",
             ExitCode="2:0", Start="2026-12-01T10:00:00", End="2026-12-01T10:05:00", Elapsed="00:05:00")
    return r


def test_the_analysis_of_a_torn_record_asks_accounting_for_its_facts(cfg, monkeypatch):
    os.makedirs(cfg.intake.queue_dir)
    Path(cfg.intake.queue_dir, "91.env").write_bytes(b"")
    ctldrecord.ingest(cfg)
    seen = {}

    def finish_job(cfg_, slurm, store, bdir, job_facts=None, progress=None, **kw):
        seen["facts"] = job_facts
        progress["stored"] = True
    monkeypatch.setattr(finish, "finish_job", finish_job)
    out = attempt.process(cfg, "91", slurm=Acct({"91": _row("91", "90_1")}), open_store=lambda c: None, retry_for_s=0)
    assert out == "stored" and seen["facts"]["job_id"] == "90_1" and seen["facts"]["user"] == "root"
    assert seen["facts"]["state"] == "FAILED" and seen["facts"]["nodes"] == ["n3"] and seen["facts"]["uid"] == 0
    assert seen["facts"]["facts_source"] == "sacct"


def test_a_torn_record_with_accounting_down_stays_pending(cfg, monkeypatch):
    os.makedirs(cfg.intake.queue_dir)
    Path(cfg.intake.queue_dir, "92.env").write_bytes(b"")
    ctldrecord.ingest(cfg)
    monkeypatch.setattr(finish, "finish_job", lambda *a, **k: pytest.fail("analysed without its facts"))
    out = attempt.process(cfg, "92", slurm=Acct({}, down=True), open_store=lambda c: None, retry_for_s=0)
    doc = intake.load(cfg, "92")
    assert out == "pending" and doc["attempts"] == 1 and "Problem talking to the database" in doc["last_error"]
    assert doc["job"]["facts_source"] == "torn"
    # near miss: accounting without the job keeps the key's facts and the analysis goes on
    seen = {}

    def finish_job(cfg_, slurm, store, bdir, job_facts=None, progress=None, **kw):
        seen["facts"] = job_facts
        progress["stored"] = True
    monkeypatch.setattr(finish, "finish_job", finish_job)
    assert attempt.process(cfg, "92", slurm=Acct({}), open_store=lambda c: None, retry_for_s=0) == "stored"
    assert seen["facts"] == {"job_id": "92", "slurm_job_id": "92", "facts_source": "torn"}


def test_a_worker_with_nothing_left_runs_the_catch_up_and_drains_what_it_found(cfg, monkeypatch):
    from slurm_attr.slurm.cli import ENDED_FIELDS, slurm_time
    import time

    ended = time.time() - 600
    r = {k: "" for k in ENDED_FIELDS}
    r.update(JobID="95", JobIDRaw="95", User="root", NodeList="n1", State="FAILED", ExitCode="1:0",
             Start=slurm_time(ended - 5), End=slurm_time(ended))

    class Backend:
        def __init__(self):
            self.windows = 0

        def ended_jobs(self, start, end):
            self.windows += 1
            return [r]

        def sacct_jobs(self, ids):
            return {"95": r} if "95" in ids else {}

        def sacct_job(self, job_id):
            return r if job_id == "95" else None
    done = []

    def process(cfg_, key, slurm=None, **kw):
        done.append(key)
        intake.done(cfg_, key)
        return "stored"
    monkeypatch.setattr(attempt, "process", process)
    cfg.analysis.yield_pressure = 0
    backend = Backend()
    counts = pool.work(cfg, pool._take_slot(cfg), slurm=backend, open_store=lambda c: None)
    assert done == ["95"] and counts["stored"] == 1 and backend.windows == 1
    # near miss: the next worker within the minute asks accounting nothing
    assert pool.work(cfg, pool._take_slot(cfg), slurm=backend, open_store=lambda c: None)["stored"] == 0
    assert backend.windows == 1


def test_the_front_turned_off_stamps_the_catch_ups_file_and_records_nothing(front, tmp_path):
    (tmp_path / "q").mkdir()
    conf = tmp_path / "c.toml"
    conf.write_text(f'[intake]\nqueue_dir = "{tmp_path}/q"\n\n[analysis]\nenabled = false\n')
    env = {"PATH": "/usr/bin:/bin", "SLURM_ATTR_CONFIG": str(conf), "SLURM_ATTR_PYTHON": "/bin/true", **ENV}
    assert subprocess.run([front], env=env, timeout=30).returncode == 0
    assert os.listdir(tmp_path / "q") == []  # no catch-up made the file: nothing created
    stamp = tmp_path / "q" / ".off"
    stamp.touch()
    os.utime(stamp, (0, 0))
    assert subprocess.run([front], env=env, timeout=30).returncode == 0
    assert stamp.stat().st_mtime > 1e9 and sorted(os.listdir(tmp_path / "q")) == [".off"]
