"""Render a Scene as an evidence bundle (DESIGN §3) on disk, with noise and missing parts.

What may go missing is drawn here, never from what the truth needs: a node the truth blames by
its kernel log keeps that log; a truth read from the job's output keeps the output.
"""
from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timedelta

from . import fmt_job, fmt_kernel
from .scene import Line, Scene


def write(scene: Scene, root: str, case_id: str) -> None:
    """Write the bundle under ``root`` and its ground truth as truth.json beside job.json."""
    w = scene.w
    if scene.end is None:
        scene.finish(max([l.t for l in scene.out] + [w.start + timedelta(minutes=30)]) + timedelta(seconds=40), "FAILED", 1)
    os.makedirs(root, exist_ok=True)
    _scheduler(scene, root)
    _output(scene, root)
    _nodes(scene, root)
    _json(os.path.join(root, "job.json"), {k: v for k, v in scene.job.items() if v is not None})
    _json(os.path.join(root, "truth.json"), {"case": case_id, **scene.truth.to_dict()})


def _json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def _text(path: str, lines: list[str]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + ("\n" if lines else ""))


def _sorted(lines: list[Line]) -> list[Line]:
    return sorted(lines, key=lambda l: (l.t, l.seq))


def _output(scene: Scene, root: str) -> None:
    w = scene.w
    if not scene.out or (not scene.protect_out and w.chance(0.12)):
        if scene.ranks_from_output:
            scene.truth.ranks = []  # nothing left that could name the rank
        return  # no output collected (path unreadable, or the job wrote none)
    split = w.chance(0.4)  # --error given: stderr in its own file
    out = [l.text for l in _sorted(scene.out) if not split or l.stream == "stdout"]
    _text(os.path.join(root, "output", "stdout"), out)
    if split:
        _text(os.path.join(root, "output", "stderr"), [l.text for l in _sorted(scene.out) if l.stream == "stderr"])


def _scheduler(scene: Scene, root: str) -> None:
    w = scene.w
    lines = list(scene.sched)
    first = w.nodes[0]
    t0 = w.start - timedelta(seconds=w.rng.randint(1, 600))
    lines += [Line(t0, 0, f"slurmctld.log: [{t0:%Y-%m-%dT%H:%M:%S}.331] _slurm_rpc_submit_batch_job: JobId={w.job_id} InitPrio=4294901757 usec=331"),
              Line(w.start, 0, f"slurmctld.log: [{w.start:%Y-%m-%dT%H:%M:%S}.442] sched: Allocate JobId={w.job_id} "
                                f"NodeList={fmt_job.hostlist(w.nodes)} #CPUs={len(w.nodes) * 64} Partition={scene.job['partition']}"),
              Line(w.start, 1, f"slurmd-{w.short(first)}.log: [{w.start:%Y-%m-%dT%H:%M:%S}.479] Launching batch job {w.job_id} for UID {w.uid}")]
    if scene.end:
        code, sig = scene.job.get("exit_code"), scene.job.get("signal")
        status = f"WTERMSIG {sig}" if sig else f"WEXITSTATUS {code or 0}"
        said = (status, "done") if scene.job.get("state") != "NODE_FAIL" else ("done",)
        for i, what in enumerate(said):
            lines.append(Line(scene.end, 10**9 + i, f"slurmctld.log: [{scene.end:%Y-%m-%dT%H:%M:%S}.178] _job_complete: JobId={w.job_id} {what}"))
    # The controller-side collector does not always get the daemons' logs (remote slurmctld).
    if scene.protect_sched or w.chance(0.7):
        _text(os.path.join(root, "scheduler", "slurm.log"), [l.text for l in _sorted(lines)])


def _nodes(scene: Scene, root: str) -> None:
    w = scene.w
    end = scene.end or w.start
    for node in w.nodes:
        protected = node in scene.protect_kernel
        if node in scene.absent or (not protected and w.chance(0.05)):
            continue  # the node's epilog never reported: no directory at all
        d = os.path.join(root, "nodes", node)
        os.makedirs(d, exist_ok=True)
        sources = {}
        if not protected and w.chance(0.1):
            sources["kernel"] = {"status": "missing", "detail": "journalctl -k: no kernel messages readable"}
        else:
            _text(os.path.join(d, "kernel.log"), _kernel_lines(scene, node, end))
            sources["kernel"] = {"status": "ok", "detail": "journalctl -k" if w.kfmt != "dmesg_t" else "dmesg -T"}
        if node in scene.journal:
            _text(os.path.join(d, "journal.log"), [_journal(scene, node, l) for l in _sorted(scene.journal[node])])
        sources["nccl"] = _nccl(scene, node, d)
        sources["fr"] = _fr(scene, node, d)
        _json(os.path.join(d, "collect.json"), {
            "version": 1, "node": node, "job_id": w.job_id, "sources": sources,
            "window": {"start": w.start.isoformat(), "end": end.replace(microsecond=0).isoformat(), "start_source": "scontrol"}})


def _clock(scene: Scene, node: str, t: datetime) -> datetime:
    return t + timedelta(seconds=scene.w.offsets[node])


def _kernel_lines(scene: Scene, node: str, end: datetime) -> list[str]:
    w = scene.w
    host = w.short(node)
    lines = list(scene.kernel.get(node, []))
    if scene.noisy:
        span = max((end - w.start).total_seconds(), 60.0)
        for msg in fmt_kernel.noise(w, host):
            lines.append(Line(w.start + timedelta(seconds=w.rng.uniform(-300, span)), 0, msg))
    out = []
    for l in _sorted(lines):
        head = fmt_kernel.prefix(w.kfmt, _clock(scene, node, l.t), host)
        first, *cont = l.text.split("\n")
        # printk continuation lines: no timestamp of their own, indented under the message
        out += [head + first] + [" " * len(head) + c for c in cont]
    return out


def _journal(scene: Scene, node: str, line: Line) -> str:
    t = _clock(scene, node, line.t)
    return f"{t:%b %d %H:%M:%S} {scene.w.short(node)} {line.text}"


def _nccl(scene: Scene, node: str, d: str) -> dict:
    w = scene.w
    lines = list(scene.nccl.get(node, []))
    if not lines:
        return {"status": "missing", "detail": "no files in nccl/"}
    rank = w.ranks_on(node)[0]
    if scene.nccl_info:
        from .fmt_job import nccl
        lines.insert(0, Line(w.start, 0, nccl(w, node, rank, "", "INFO", f"Bootstrap : Using ib0:{w.ips[node]}<0>")))
        lines.insert(1, Line(w.start, 1, nccl(w, node, rank, "", "INFO", "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB "
                                                             f"[2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB ib0:{w.ips[node]}<0>")))
    stamped = w.nccl_version >= "2.23"  # NCCL_DEBUG_TIMESTAMP_FORMAT's default "[%F %T] " since 2.23
    text = [(f"[{_clock(scene, node, l.t):%Y-%m-%d %H:%M:%S}] " if stamped else "") + l.text for l in _sorted(lines)]
    _text(os.path.join(d, "nccl", f"nccl.{w.short(node)}.{w.pids[rank]}.log"), text)
    return {"status": "ok", "files": 1}


def _fr(scene: Scene, node: str, d: str) -> dict:
    files = scene.fr.get(node, [])
    if not files:
        return {"status": "missing", "detail": "no files in fr/"}
    os.makedirs(os.path.join(d, "fr"), exist_ok=True)
    for src, name in files:
        if isinstance(src, bytes):  # a dump the generator derived from a real one
            with open(os.path.join(d, "fr", name), "wb") as f:
                f.write(src)
        else:
            shutil.copyfile(src, os.path.join(d, "fr", name))
    return {"status": "ok", "files": len(files)}
