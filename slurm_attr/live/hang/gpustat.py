"""Which local processes are busy on a GPU, from ``nvidia-smi``, read boundedly.

The busy check (busy.py) asks this about a node's ranks while a stall is judged: a rank
that the others wait for and whose GPU is computing (an evaluation pass, a forward pass of
a data pipeline) is busy, not stuck. Two queries, each with a timeout and an output cap:

    nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits
    nvidia-smi --query-gpu=uuid,utilization.gpu --format=csv,noheader,nounits

A process's activity is the utilisation of the GPU(s) it holds a context on (per-process
utilisation needs accounting mode, which sites rarely turn on). Only ranks that have nothing
under way in NCCL are judged here, so a spinning NCCL kernel (100 % of a GPU while a
collective hangs) never makes a rank busy; a rank idle from NCCL's view whose GPU computes is.

Where there is no ``nvidia-smi`` (this machine, the test cluster) or it fails, there is no
signal: ``sample`` returns None and the busy check is what it was without GPUs. After a
failure the tool is not asked again for ``RETRY_S``.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

TIMEOUT_S = 2.0  # per query (the node's cycle waits on it)
OUT_CAP = 64 << 10
MAX_LINES = 1024
RETRY_S = 60.0
BUSY_PCT = 5  # utilisation of a rank's GPU at or above this: computing
APPS = ["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]
GPUS = ["--query-gpu=uuid,utilization.gpu", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class GpuUse:
    util_pct: int | None  # the highest utilisation of the GPUs it holds; None: not reported
    mem_mib: int | None


def _int(tok: str) -> int | None:
    """An integer field; None for "[N/A]", "[Not Supported]", "[Insufficient Permissions]"."""
    tok = tok.strip().removesuffix("MiB").removesuffix("%").strip()
    return int(tok) if tok.isdigit() and len(tok) < 12 else None


def parse_apps(text: str) -> dict[int, tuple[str, int | None]]:
    """pid -> (GPU uuid or "", used MiB) from the compute-apps query (with or without
    gpu_uuid first, units or not). A pid on several GPUs keeps its first."""
    out: dict[int, tuple[str, int | None]] = {}
    for line in text.splitlines()[:MAX_LINES]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2:
            parts.insert(0, "")
        if len(parts) != 3:
            continue
        pid = _int(parts[1])
        if pid is not None and 0 < pid < 1 << 22:
            out.setdefault(pid, (parts[0][:64], _int(parts[2])))
    return out


def parse_gpus(text: str) -> dict[str, int | None]:
    """GPU uuid -> utilisation % from the query-gpu query."""
    out: dict[str, int | None] = {}
    for line in text.splitlines()[:MAX_LINES]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0]:
            out[parts[0][:64]] = _int(parts[1])
    return out


def combine(apps: dict[int, tuple[str, int | None]], gpus: dict[str, int | None]) -> dict[int, GpuUse]:
    return {pid: GpuUse(gpus.get(uuid) if uuid else None, mem) for pid, (uuid, mem) in apps.items()}


def run_tool(tool: str, args: list[str]) -> str | None:
    try:
        p = subprocess.run([tool, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                           timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    return p.stdout[:OUT_CAP].decode("utf-8", "replace")


class GpuProbe:
    """``sample(now)``: pid -> GpuUse of every process on the node's GPUs, None without a signal."""

    def __init__(self, tool: str | None = None, run: Callable[[str, list[str]], str | None] = run_tool):
        self.tool = tool if tool is not None else shutil.which("nvidia-smi")
        self.run = run  # the tests' stand-in answers with captured output
        self.failed_at: float | None = None

    def sample(self, now: float) -> dict[int, GpuUse] | None:
        if not self.tool or (self.failed_at is not None and now - self.failed_at < RETRY_S):
            return None
        apps = self.run(self.tool, APPS)
        gpus = self.run(self.tool, GPUS) if apps is not None else None
        if apps is None or gpus is None:
            self.failed_at = now
            return None
        self.failed_at = None
        return combine(parse_apps(apps), parse_gpus(gpus))


def active(use: GpuUse | None) -> bool:
    return use is not None and use.util_pct is not None and use.util_pct >= BUSY_PCT
