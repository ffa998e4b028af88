"""The plugin's start record (<evidence_root>/<job>.start) as the node epilog's window start.

On 22.05 the node Epilog has no SLURM_JOB_START_TIME; the record spares one `scontrol show job`
(a slurmctld RPC) per node per job. It counts only as the plugin writes it: root-owned 0600,
one link, in a root-owned evidence root. Each positive case has its near miss beside it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurm_attr.collect import window
from slurm_attr.collect.node import NodeJob, read_kernel

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the record is root's: needs root to own it")


class Asked:
    """A show_job that counts its calls and knows no job."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, job_id: str) -> None:
        self.calls += 1
        return None


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ev = tmp_path / "ev"
    ev.mkdir()
    os.chmod(ev, 0o755)
    return ev


def _record(root: Path, job: str = "77", mode: int = 0o600) -> Path:
    p = root / f"{job}.start"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.write(fd, f"{time.time():.9f}\n".encode())
    os.close(fd)
    os.chmod(p, mode)
    return p


def test_the_record_is_the_start_and_slurmctld_is_not_asked(root: Path) -> None:
    rec = _record(root)
    ctime = rec.stat().st_ctime
    asked = Asked()
    w = window.resolve("77", time.time() + 5, 120, show_job=asked, evidence_root=str(root))
    assert w.trusted_start and w.start_source == "record" and w.start == ctime
    assert asked.calls == 0
    assert not rec.exists()  # taken: the epilog is its one reader
    # Near miss: a second look (no record any more) asks slurmctld.
    again = window.resolve("77", time.time() + 5, 120, show_job=asked, evidence_root=str(root))
    assert asked.calls == 1 and again.start_source == "none" and "record: none" in again.detail


@pytest.mark.parametrize("spoil", ["other_owner", "readable", "two_links", "symlink", "directory"])
def test_a_record_not_as_the_plugin_writes_it_is_not_used(root: Path, tmp_path: Path, spoil: str) -> None:
    path = root / "77.start"
    if spoil == "other_owner":
        _record(root)
        os.chown(path, 1234, 1234)
    elif spoil == "readable":
        _record(root, mode=0o644)
    elif spoil == "two_links":
        _record(root)
        os.link(path, tmp_path / "kept")
    elif spoil == "symlink":
        _record(root, job="76")
        os.symlink(root / "76.start", path)
    else:
        path.mkdir()
    asked = Asked()
    w = window.resolve("77", time.time() + 5, 120, show_job=asked, evidence_root=str(root))
    assert w.start_source != "record" and asked.calls == 1
    assert os.path.lexists(path)  # not ours: left where it is


def test_an_evidence_root_others_can_write_is_not_trusted(root: Path) -> None:
    _record(root)
    os.chmod(root, 0o777)  # near miss: 1777 (sticky) below is trusted
    got, why = window.record_start(str(root), "77", take=False)
    assert got is None and "not root-owned" in why
    os.chmod(root, 0o1777)
    got, _ = window.record_start(str(root), "77", take=False)
    assert got is not None


def test_the_environment_start_wins_and_the_record_is_still_removed(root: Path) -> None:
    rec = _record(root)
    end = time.time() + 5
    w = window.resolve("77", end, 120, env_start=end - 50, show_job=Asked(), evidence_root=str(root))
    assert w.start_source == "env" and w.start == end - 50 and not rec.exists()


def test_stale_records_of_other_jobs_are_swept(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _record(root, job="70")
    foreign = _record(root, job="71", mode=0o644)  # not a record of ours: never removed
    time.sleep(0.05)
    _record(root, job="77")
    window.record_start(str(root), "77")
    assert old.exists()  # near miss: a fresh record of another job is its epilog's to take
    _record(root, job="78")
    monkeypatch.setattr(window, "STALE_RECORD_S", 0.01)
    window.record_start(str(root), "78")
    assert not old.exists() and foreign.exists()


def test_an_hour_old_xid_is_outside_a_record_window_and_a_fresh_one_inside(cfg, tmp_path: Path) -> None:
    cfg.collect.window_slack_s = 120
    ev = Path(cfg.paths.evidence_root)
    ev.mkdir(parents=True, exist_ok=True)
    os.chmod(ev, 0o755)
    now = time.time()
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))  # noqa: E731
    line = lambda t: f"{stamp(t)[:-2]}:{stamp(t)[-2:]} h kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"  # noqa: E731
    (tmp_path / "kern-n2.log").write_text(line(now - 3600))
    _record(ev)
    asked = Asked()
    job = NodeJob(job_id="77", node="n2", bundle_key="77", end=now + 2, show_job=asked)
    win, _ = read_kernel(cfg, job, time.monotonic() + 10)
    assert win.text == b"" and win.span["start_source"] == "record" and asked.calls == 0
    # Near miss: the same Xid during the job is read.
    with open(tmp_path / "kern-n2.log", "a") as f:
        f.write(line(now + 1))
    _record(ev)
    win, _ = read_kernel(cfg, job, time.monotonic() + 10)
    assert win.text.count(b"Xid") == 1 and win.span["start_source"] == "record"
