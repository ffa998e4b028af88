"""The opt-in start-up hook (slurm_attr/live/pyhook/sitecustomize.py) in real interpreters:
a process that never imports torch is left alone, a torch process serves the worker
server at its per-rank socket, a launcher's worker uses its own RANK, a child of a serving
rank does not take its socket, and the sitecustomize the hook shadows still runs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurm_attr.live import workerclient

HOOK = Path(__file__).resolve().parents[2] / "slurm_attr" / "live" / "pyhook"


@pytest.fixture
def d():
    p = tempfile.mkdtemp(prefix="sattr-hk-", dir="/tmp")  # sun_path is 108 bytes
    yield p
    shutil.rmtree(p, ignore_errors=True)


def _env(d: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_ATTR_WS_OWNER", "PYTHONPATH")}
    env.update({"TORCH_WORKER_SERVER_SOCKET": f"{d}/ws/rank_3.sock", "PYTHONPATH": f"{HOOK}:{d}/theirs"})
    env.update(extra)
    return env


def test_a_process_without_torch_is_left_alone_and_theirs_still_runs(d):
    os.makedirs(f"{d}/theirs")
    Path(d, "theirs", "sitecustomize.py").write_text("print('their sitecustomize ran')\n")
    out = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"],
                         env=_env(d), capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["their", "sitecustomize", "ran", "False"]
    assert not os.path.exists(f"{d}/ws")


SERVE = "import torch.distributed, time; print('up', flush=True); time.sleep(60)"


def _serving(d: str, sock: str, **extra: str) -> tuple[subprocess.Popen, bytes | None]:
    p = subprocess.Popen([sys.executable, "-c", SERVE], env=_env(d, **extra), stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    assert p.stdout.readline().strip() == "up"
    reply = None
    for _ in range(100):  # the server binds in its own thread: poll a bounded number of times
        if os.path.exists(sock):
            reply = workerclient.post(sock, "ping", os.getuid())
            break
        time.sleep(0.05)
    return p, reply


def test_a_torch_process_serves_at_its_rank_socket_and_a_child_does_not_take_it(d):
    pytest.importorskip("torch")
    p, reply = _serving(d, f"{d}/ws/rank_3.sock")
    try:
        assert reply == b"pong"
        # near miss: a child of the serving rank (DataLoader worker, spawn) inherits the
        # variable and the owner mark: it must not unlink and re-bind the rank's socket
        c, _ = _serving(d, f"{d}/never", SLURM_ATTR_WS_OWNER=f"{p.pid}:{d}/ws/rank_3.sock")
        c.kill()
        c.wait()
        assert workerclient.post(f"{d}/ws/rank_3.sock", "ping", os.getuid()) == b"pong"
        assert sorted(os.listdir(f"{d}/ws")) == ["rank_3.sock"]
    finally:
        p.kill()
        p.wait()
    # a launcher's worker (torchrun sets RANK): its own socket beside the task's
    w, reply = _serving(d, f"{d}/ws/rank_11.sock", RANK="11")
    w.kill()
    w.wait()
    assert reply == b"pong"
