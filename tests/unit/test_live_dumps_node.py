"""Evidence before the kill, node side (slurm_attr/live/dumps.py): the FR debug pipe, the
bounded HTTP client against torch's real worker server, and the stuck line parsed from a
captured ``dump_traceback`` reply. Every positive case has its near miss beside it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from unix_servers import UnixServer

from slurm_attr.live import dumps, frjson, workerclient

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "live_dumps"
UID = os.getuid()
OTHER_UID = 4242


# ---- the FR debug pipe: FIFOs made as ProcessGroupNCCL makes them ---------------------
class PipeRank:
    """What ProcessGroupNCCL does with TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>: mkfifo
    ``<stem><rank>.pipe`` 0666 and hold it open O_RDONLY|O_NONBLOCK; records what arrives."""

    def __init__(self, stem: str, rank: int, listen: bool = True):
        self.path = f"{stem}{rank}.pipe"
        os.mkfifo(self.path, 0o666)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK) if listen else None

    def received(self) -> bytes:
        if self.fd is None:
            return b""
        try:
            return os.read(self.fd, 4096)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


@pytest.fixture
def jobdir(tmp_path):
    d = tmp_path / "job"
    (d / "fr").mkdir(parents=True)
    return d


def test_pipe_trigger_writes_every_listening_rank(jobdir):
    ranks = [PipeRank(str(jobdir / "fr" / "pipe_rank_"), r) for r in (0, 1)]
    try:
        assert dumps.trigger_pipes(str(jobdir), UID) == {0: "sent", 1: "sent"}
        assert [r.received() for r in ranks] == [b"1", b"1"]
    finally:
        for r in ranks:
            r.close()


def test_pipe_without_reader_is_skipped_not_waited_on(jobdir):
    # the rank is gone (or not NCCL): open(O_NONBLOCK) fails at once with ENXIO
    PipeRank(str(jobdir / "fr" / "pipe_rank_"), 3, listen=False)
    assert dumps.trigger_pipes(str(jobdir), UID) == {3: "no reader"}  # a blocking open would hang here


def test_symlinked_pipe_is_refused_and_its_target_untouched(jobdir, tmp_path):
    target = PipeRank(str(tmp_path / "elsewhere_"), 0)
    os.symlink(target.path, jobdir / "fr" / "pipe_rank_2.pipe")
    try:
        assert dumps.trigger_pipes(str(jobdir), UID) == {2: "not a FIFO"}
        assert target.received() == b""
    finally:
        target.close()


def test_regular_file_named_as_pipe_is_not_written(jobdir):
    p = jobdir / "fr" / "pipe_rank_4.pipe"
    p.write_bytes(b"keep")
    assert dumps.trigger_pipes(str(jobdir), UID) == {4: "not a FIFO"}
    assert p.read_bytes() == b"keep"


def test_pipe_of_another_user_is_refused(jobdir):
    r = PipeRank(str(jobdir / "fr" / "pipe_rank_"), 5)
    try:
        assert dumps.trigger_pipes(str(jobdir), OTHER_UID) == {5: f"owned by uid {UID}, not the job's"}
        assert r.received() == b""
    finally:
        r.close()


def test_symlinked_pipe_dir_is_not_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    r = PipeRank(str(real / "pipe_rank_"), 0)
    job = tmp_path / "job"
    job.mkdir()
    os.symlink(real, job / "fr")
    try:
        assert dumps.trigger_pipes(str(job), UID) == {}
        assert r.received() == b""
    finally:
        r.close()


# ---- dump_traceback, as captured from torch 2.13 (tests/fixtures/live_dumps) ----------
def test_captured_traceback_of_the_waiting_rank():
    text = (FIX / "dump_traceback_rank0.txt").read_text()
    threads = dumps.parse_traceback(text)
    assert [len(t.frames) for t in threads] == [0, 3]
    at = dumps.stuck_at(threads)
    assert at["at"] == "/tmp/wsx/hk/train.py:10 in <module>"
    assert at["inner"].endswith("torch/distributed/distributed_c10d.py:3252 in all_reduce")


def test_captured_traceback_of_the_sleeping_rank():
    text = (FIX / "dump_traceback_rank1.txt").read_text()
    at = dumps.stuck_at(dumps.parse_traceback(text))
    assert (at["file"], at["line"], at["func"]) == ("/tmp/wsx/hk/train.py", 9, "<module>")


def test_traceback_prefers_the_programs_main_thread_over_a_helper():
    text = ('Thread 0x0000000000000002 (most recent call first):\n'
            '  File "/home/u/loader.py", line 5 in fetch\n'
            '  File "/usr/lib/python3.11/threading.py", line 975 in run\n\n'
            'Thread 0x0000000000000001 (most recent call first):\n'
            '  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
            '  File "/home/u/train.py", line 212 in step\n'
            '  File "/home/u/train.py", line 300 in <module>\n')
    at = dumps.stuck_at(dumps.parse_traceback(text))
    assert at["at"] == "/home/u/train.py:212 in step"


def test_traceback_garbage_gives_no_line():
    # near miss: frames outside any thread header, a header without frames, binary noise
    text = '  File "/x.py", line 1 in f\nCurrent thread 0x01 (most recent call first):\n  <no Python frame>\n\x00\xff'
    assert dumps.stuck_at(dumps.parse_traceback(text)) is None


def _fr(doc: dict) -> frjson.FrDoc:
    return frjson.decode(json.dumps(doc).encode())


def test_fr_status_from_captured_reply():
    body = (FIX / "fr_trace_json_rank0.json").read_bytes()
    doc = frjson.decode(body)
    assert frjson.status(doc) == {"0": [4, 3]}
    assert frjson.pending(doc) == "gloo:all_reduce #4"
    # near miss: the rank that completed everything it enqueued has nothing pending
    raw = (FIX / "fr_trace_json_rank1.json").read_bytes()
    assert json.loads(raw)["pg_status"]["0"]["last_completed_collective"] == "2"  # Gloo's status lags...
    done = frjson.decode(raw)
    assert (frjson.status(done), frjson.pending(done)) == ({"0": [3, 3]}, None)  # ...the entries do not
    assert frjson.status(_fr({"pg_status": {"0": {"last_enqueued_collective": "x"}}})) == {}
    assert frjson.status(_fr({"pg_status": {"7": {"last_enqueued_collective": "5",
                                                  "last_completed_collective": "4"}}})) == {"7": [5, 4]}


# ---- the HTTP client against hostile servers -------------------------------------------
class FakeServer(UnixServer):
    """A unix-socket server that answers every connection with ``reply`` (bytes), or
    never answers (``reply=None``)."""

    def __init__(self, path: str, reply: bytes | None):
        self.reply = reply
        super().__init__(path, backlog=4)

    def answer(self, c) -> None:
        if self.reply is not None:
            c.recv(4096)
            c.sendall(self.reply)
            c.close()


@pytest.fixture
def short_dir():
    import tempfile

    d = tempfile.mkdtemp(prefix="sattr-ws-", dir="/tmp")  # sun_path is 108 bytes
    yield d
    subprocess.run(["rm", "-rf", d], check=False)


def test_client_reads_a_bounded_reply(short_dir):
    srv = FakeServer(f"{short_dir}/a.sock", b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong")
    try:
        assert workerclient.post(f"{short_dir}/a.sock", "ping", UID) == b"pong"
    finally:
        srv.close()


def test_client_refuses_an_oversized_reply(short_dir):
    srv = FakeServer(f"{short_dir}/a.sock", b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\nxx")
    srv2 = FakeServer(f"{short_dir}/b.sock", b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 5000)  # no length, to EOF
    try:
        with pytest.raises(workerclient.DumpError, match="cap"):
            workerclient.post(f"{short_dir}/a.sock", "fr_trace_json", UID, cap=1000)
        with pytest.raises(workerclient.DumpError, match="cap"):
            workerclient.post(f"{short_dir}/b.sock", "fr_trace_json", UID, cap=1000)
        assert len(workerclient.post(f"{short_dir}/b.sock", "fr_trace_json", UID, cap=6000)) == 5000
    finally:
        srv.close()
        srv2.close()


def test_client_gives_up_on_a_server_that_never_answers(short_dir):
    srv = FakeServer(f"{short_dir}/a.sock", None)
    try:
        with pytest.raises(workerclient.DumpError, match="in time"):
            workerclient.post(f"{short_dir}/a.sock", "dump_traceback", UID, timeout=0.5)
    finally:
        srv.close()


def test_client_refuses_a_server_of_another_user_before_sending(short_dir):
    srv = FakeServer(f"{short_dir}/a.sock", None)
    try:
        with pytest.raises(workerclient.DumpError, match=f"uid {UID}, not the job's {OTHER_UID}"):
            workerclient.post(f"{short_dir}/a.sock", "ping", OTHER_UID, timeout=5)
        time.sleep(0.1)
        assert all(c.recv(1, socket.MSG_DONTWAIT) == b"" for c in srv.conns)  # closed, nothing sent
    finally:
        srv.close()


def test_client_reports_http_errors_and_non_http(short_dir):
    a = FakeServer(f"{short_dir}/a.sock", b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nno!")
    b = FakeServer(f"{short_dir}/b.sock", b"SSH-2.0-OpenSSH\r\n\r\n")
    try:
        with pytest.raises(workerclient.DumpError, match="HTTP 404"):
            workerclient.post(f"{short_dir}/a.sock", "nope", UID)
        with pytest.raises(workerclient.DumpError, match="not an HTTP reply"):
            workerclient.post(f"{short_dir}/b.sock", "ping", UID)
    finally:
        a.close()
        b.close()


def test_symlinked_socket_is_not_used(short_dir):
    os.mkdir(f"{short_dir}/ws")
    srv = FakeServer(f"{short_dir}/real.sock", b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong")
    os.symlink(f"{short_dir}/real.sock", f"{short_dir}/ws/rank_0.sock")
    try:
        res = dumps.collect(short_dir, dumps.Limits(UID), lambda *a: None)
        assert res["ranks"] == {} and res["problems"] == ["rank_0.sock: not a socket of the job's user"]
        assert srv.conns == []
    finally:
        srv.close()


# ---- against torch's real worker server ------------------------------------------------
SERVER = r"""
import os, sys, time
import torch, torch.distributed as dist
from torch._C._distributed_c10d import _WorkerServer
dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + sys.argv[2])
t = torch.ones(4)
dist.all_reduce(t)
s = _WorkerServer(sys.argv[1])
print("ready", flush=True)
def park_here():
    time.sleep(120)
park_here()
"""


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory):
    pytest.importorskip("torch")
    import tempfile

    d = tempfile.mkdtemp(prefix="sattr-ws-", dir="/tmp")
    os.mkdir(f"{d}/ws")
    script = tmp_path_factory.mktemp("srv") / "server_job.py"
    script.write_text(SERVER)
    proc = subprocess.Popen([sys.executable, str(script), f"{d}/ws/rank_0.sock", f"{d}/store"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        pytest.fail("torch worker server did not start")
    yield d, str(script)
    proc.kill()
    proc.wait()
    subprocess.run(["rm", "-rf", d], check=False)


def test_real_worker_server_ping_and_collect(torch_server):
    d, script = torch_server
    assert workerclient.post(f"{d}/ws/rank_0.sock", "ping", UID) == b"pong"
    saved: dict[tuple[str, int], bytes] = {}
    res = dumps.collect(d, dumps.Limits(UID), lambda kind, rank, data: saved.__setitem__((kind, rank), bytes(data)))
    r = res["ranks"]["0"]
    assert r["stack"]["at"] == f"{script}:11 in park_here", r
    assert r["fr"]["pg"] == {"0": [1, 1]} and r["fr"]["pend"] is None
    assert json.loads(saved[("fr", 0)])["entries"][0]["profiling_name"] == "gloo:all_reduce"
    assert b"park_here" in saved[("stack", 0)]
    # near miss: the same server, but the job's user is someone else -> nothing pulled
    res2 = dumps.collect(d, dumps.Limits(OTHER_UID), lambda *a: None)
    assert res2["ranks"] == {} and res2["problems"]


def test_symlinked_socket_dir_is_not_followed(short_dir):
    os.mkdir(f"{short_dir}/real")
    srv = FakeServer(f"{short_dir}/real/rank_0.sock", b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong")
    os.symlink(f"{short_dir}/real", f"{short_dir}/ws")
    try:
        assert dumps.collect(short_dir, dumps.Limits(UID), lambda *a: None)["ranks"] == {}
        assert dumps.poll_fr(short_dir, dumps.Limits(UID)) == ({}, [])
        assert srv.conns == []
    finally:
        srv.close()
