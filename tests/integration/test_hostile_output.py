"""Issue 21 item 5 on the real cluster: a job's escape sequences reach no terminal raw.

A 2-rank job in partition ``live`` (the plugin starts its watchers and sets each rank's
``TORCH_WORKER_SERVER_SOCKET``) runs, as its user, a small stdlib server in place of torch's
worker server. Rank 0 answers ``fr_trace_json`` with a collective under way (``retired``
false) whose ``profiling_name`` holds CSI and OSC sequences and a copied NVRM Xid line; rank 1
never entered it. The plugin's watchers find the hang from that Flight Recorder after
``hang_after_s`` and pull ``dump_traceback``, a faulthandler stack whose file and function
hold escape sequences, a bidi override and the Xid line. ``sattr live JOB`` and ``sattr JOB``
then run under ``script`` (stdout a real terminal, so colour is on): the bytes may hold no
ESC but our own colour (SGR) sequences, no BEL, no 8-bit CSI, no bidi control, and the
injected text must be there, visibly escaped and quoted as the job's words.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_attr import config as config_mod
from slurm_attr.live import findings

pytestmark = pytest.mark.cluster

USER = "sattrtest"
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
# fr_pending keeps 64 characters of a name: the escapes and the copied line's start fit
FR_NAME = "gloo:\x1b[2K\x1b[1A\x1b]0;pwned\x07NVRM: Xid (PCI:0000:3b:00): 79"
FILE = "/home/u/\x1b[2K\x1b[1A\x1b]0;pwned\x07train.py"
FUNC = "step\x1b[2J\u202e" + XID

SERVER = r'''
"""A hostile stand-in for torch's worker server: HTTP/1.1 over the unix socket the plugin names."""
import json, os, socket, sys, threading

rank = int(os.environ["SLURM_PROCID"])
path = os.environ["TORCH_WORKER_SERVER_SOCKET"]
FR_NAME, FILE, FUNC, GATE = sys.argv[1:5]


def entry(seq, name, retired):
    return {"record_id": seq, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": name, "time_created_ns": 1000 + seq,
            "input_sizes": [[8]], "output_sizes": [[8]], "input_dtypes": ["Float"], "output_dtypes": ["Float"],
            "state": "completed" if retired else "started", "retired": retired, "is_p2p": False}


# rank 0 waits in collective 7 (named by the job); rank 1 never entered it
entries = [entry(s, "gloo:all_reduce", True) for s in range(1, 7)]
if rank == 0:
    entries.append(entry(7, FR_NAME, False))
FR = json.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                 "pg_status": {"0": {"last_enqueued_collective": len(entries), "last_started_collective": len(entries),
                                     "last_completed_collective": 6}}, "entries": entries}).encode()
STACK = ("Current thread 0x00007f0000000001 (most recent call first):\n  <no Python frame>\n\n"
         "Thread 0x00007f0000000002 (most recent call first):\n"
         f'  File "{FILE}", line 12 in {FUNC}\n'
         '  File "/home/u/main.py", line 30 in <module>\n').encode()


def serve(conn):
    with conn:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                return
            buf += chunk
        body = FR if b"/handler/fr_trace_json" in buf else STACK if b"/handler/dump_traceback" in buf else None
        if body is None:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % len(body) + body)


os.makedirs(os.path.dirname(path), exist_ok=True)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(16)
srv.settimeout(0.5)
print("rank", rank, "serving", path, flush=True)
for _ in range(3600):  # until the test opens the gate (at most ~30 min)
    if os.path.exists(GATE):
        break
    try:
        conn, _ = srv.accept()
    except socket.timeout:
        continue
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
sys.exit(3)  # the job fails on its own once the test has looked
'''

SGR = re.compile(rb"\x1b\[[0-9;]*m")
RAW = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\x8b-\x8f\xaa-\xae]|\xe2\x81[\xa6-\xa9]")
ESCAPED_FR = '"gloo:\\x1b[2K\\x1b[1A\\x1b]0;pwned\\x07NVRM: Xid (PCI:0000:3b:00): 79" #7'
ESCAPED_AT = '"/home/u/\\x1b[2K\\x1b[1A\\x1b]0;pwned\\x07train.py":12 in "step\\x1b[2J\\u202eNVRM: Xid'


def _on_a_terminal(cluster, *args: str, user: str | None = None) -> bytes:
    """`sattr ARGS` with stdout a pty (script -q), as an admin (or ``user``) types it: the raw bytes."""
    cmd = ["script", "-q", "-e", "-c", shlex.join([cluster.env["SATTR_BIN"], *args]), "/dev/null"]
    env = dict(cluster.env, TERM="xterm")
    if user:  # as Cluster.run does it: runuser resets the environment
        cmd = ["runuser", "-u", user, "--", "env", "TERM=xterm", f"SLURM_CONF={env['SLURM_CONF']}",
               f"SLURM_ATTR_CONFIG={env['SLURM_ATTR_CONFIG']}", f"PATH={env['PATH']}", *cmd]
    proc = subprocess.run(cmd, capture_output=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (args, user, proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout.replace(b"\r\n", b"\n")  # the pty's line ends


def _clean(out: bytes, colour: bool) -> str:
    """No raw control character but our SGR colours (and newlines, tabs); returns the text."""
    assert bool(SGR.search(out)) == colour, out[:400]
    rest = SGR.sub(b"", out)
    assert RAW.findall(rest) == [], sorted(set(RAW.findall(rest)))
    assert b"\x1b" not in rest and b"\x07" not in rest and b"\xc2\x9b" not in rest
    return rest.decode("utf-8")


def _job(cluster, gate) -> str:
    work = Path(cluster.workdir(USER))
    server = work / f"hostile-ws-{time.time_ns()}.py"
    server.write_text(SERVER)
    server.chmod(0o644)
    argv = shlex.join([sys.executable, str(server), FR_NAME, FILE, FUNC, str(gate.path)])
    return cluster.sbatch(f"#!/bin/bash\n#SBATCH -N2 -n2 -p live -t 5\nsrun {argv}\n", user=USER)


def _wait_finding(cluster, job: str, timeout: float = 180) -> dict | None:
    spool = config_mod.load(str(cluster.config_path)).paths.spool
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = findings.load(spool, job) or {}
        f = next((f for f in doc.get("findings", []) if f.get("stacks")), None)
        if f is not None:
            return f
        time.sleep(0.5)
    return None


def test_escape_sequences_from_a_worker_server_reach_no_terminal_raw(cluster):
    gate = cluster.gate()
    with cluster.settings(live={"on_hang": "dump"}):
        job = _job(cluster, gate)
        try:
            cluster.job_nodes(job, timeout=90)
            f = _wait_finding(cluster, job)
            assert f is not None, f"no finding with stacks for job {job}"
            # what the watchers stored is the job's text as it was: the quoting is ours, not the data's
            assert (f["class"], f["ranks"], f["source"]) == ("H1", [1], "fr"), f
            assert any(FILE in s["at"] and FUNC in s["at"] for s in f["stacks"]), f["stacks"]
            live = {who: _clean(_on_a_terminal(cluster, "live", job, user=who), colour=False) for who in (None, USER)}
            running = _clean(_on_a_terminal(cluster, job), colour=False)  # `sattr JOB` of a running job
            assert cluster.is_running(job)
        finally:
            gate.open()
            state = cluster.wait_state(job)
    for text in (*live.values(), running):
        headline = next(ln for ln in text.splitlines() if "hang detected" in ln)
        assert headline.startswith(f"job {job}: hang detected") and f"rank 1 never entered {ESCAPED_FR}" in headline
        assert f"is at {ESCAPED_AT}" in text, text
        assert not any(ln.split(": ", 1)[-1].startswith("NVRM") for ln in text.splitlines()), text
    # after the job: the verdict as an admin sees it on a terminal, our colours on
    v = cluster.verdict(job)
    hang = [s for s in v["symptoms"] if s["id"] == "live.hang"]
    assert hang and f"never entered {ESCAPED_FR}" in hang[0]["summary"], hang  # quoted in the stored summary too
    verdict = _clean(_on_a_terminal(cluster, job), colour=True)
    assert f"Job {job}: why it ended" in verdict and "Verdict:" in verdict, verdict
    assert "\\x1b[2K\\x1b[1A\\x1b]0;pwned\\x07" in verdict, verdict  # the job's words, shown escaped
    print(f"\nhostile worker server, job {job} ({state}): `sattr live` and `sattr {job}` on a pty held no raw "
          f"control character; verdict {v['cause']}")
