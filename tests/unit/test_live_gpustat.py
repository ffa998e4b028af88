"""The busy check's GPU signal (hang/gpustat.py, hang/busy.py): nvidia-smi's answers parsed from captured
text, no signal without the tool, and a rank whose GPU computes counted as moving (beside one
whose GPU is idle, and one whose GPU is not reported)."""
from __future__ import annotations

import os

from slurm_attr.live.hang import busy, gpustat, procstat
from slurm_attr.live.dumps import Limits

# nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits
# (an 8-GPU node, two ranks shown, and a process whose memory the driver does not report)
APPS = """GPU-5a4c3f2e-1b7d-4f6a-9c0e-2d8b7a6f1e30, 4242, 30718
GPU-9b1e2d3c-4a5f-4e6d-8c7b-1a2b3c4d5e6f, 4243, 30722
GPU-9b1e2d3c-4a5f-4e6d-8c7b-1a2b3c4d5e6f, 4999, [N/A]
"""
# nvidia-smi --query-gpu=uuid,utilization.gpu --format=csv,noheader,nounits
GPUS = """GPU-5a4c3f2e-1b7d-4f6a-9c0e-2d8b7a6f1e30, 97
GPU-9b1e2d3c-4a5f-4e6d-8c7b-1a2b3c4d5e6f, 0
GPU-0c0c0c0c-0000-4000-8000-000000000000, [Not Supported]
"""
# the brief's short form, with units: pid,used_memory --format=csv,noheader
APPS_SHORT = "4242, 30718 MiB\n4243, 30722 MiB\n"


def test_compute_apps_and_utilisation_are_parsed_from_nvidia_smi_text():
    apps = gpustat.parse_apps(APPS)
    assert apps == {4242: ("GPU-5a4c3f2e-1b7d-4f6a-9c0e-2d8b7a6f1e30", 30718),
                    4243: ("GPU-9b1e2d3c-4a5f-4e6d-8c7b-1a2b3c4d5e6f", 30722),
                    4999: ("GPU-9b1e2d3c-4a5f-4e6d-8c7b-1a2b3c4d5e6f", None)}
    assert gpustat.parse_apps(APPS_SHORT) == {4242: ("", 30718), 4243: ("", 30722)}
    gpus = gpustat.parse_gpus(GPUS)
    assert gpus == {"GPU-5a4c3f2e-1b7d-4f6a-9c0e-2d8b7a6f1e30": 97, "GPU-9b1e2d3c-4a5f-4e6d-8c7b-1a2b3c4d5e6f": 0,
                    "GPU-0c0c0c0c-0000-4000-8000-000000000000": None}
    use = gpustat.combine(apps, gpus)
    assert use[4242] == gpustat.GpuUse(97, 30718) and gpustat.active(use[4242])
    assert use[4243] == gpustat.GpuUse(0, 30722) and not gpustat.active(use[4243])  # the near miss: idle GPU
    assert not gpustat.active(gpustat.combine(gpustat.parse_apps(APPS_SHORT), gpus)[4242])  # no uuid: no utilisation


def test_hostile_or_odd_lines_are_skipped_and_bounded():
    text = "No running processes found\n,,,\nGPU-x, -5, 10\nGPU-x, 99999999999999, 1\nGPU-x, 12, 7\n" * 3
    assert gpustat.parse_apps(text) == {12: ("GPU-x", 7)}
    many = "".join(f"GPU-x, {p}, 1\n" for p in range(1, 5000))
    assert len(gpustat.parse_apps(many)) == gpustat.MAX_LINES


def test_no_nvidia_smi_is_no_signal_and_a_failure_is_not_retried_at_once():
    assert gpustat.GpuProbe(tool="").sample(0.0) is None
    calls = []

    def run(tool, args):
        calls.append(args[0])
        return None if len(calls) == 1 else (APPS if "apps" in args[0] else GPUS)

    p = gpustat.GpuProbe(tool="/usr/bin/nvidia-smi", run=run)
    assert p.sample(0.0) is None and calls == [gpustat.APPS[0]]  # failed: no signal
    assert p.sample(10.0) is None and len(calls) == 1  # within RETRY_S: not asked
    assert p.sample(gpustat.RETRY_S + 1)[4242].util_pct == 97 and len(calls) == 3


def test_a_real_run_of_a_tool_that_fails_or_hangs_is_bounded(tmp_path):
    slow = tmp_path / "nvidia-smi"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    assert gpustat.run_tool(str(slow), gpustat.APPS) is None  # killed at TIMEOUT_S
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'; exit 9\n")
    bad.chmod(0o755)
    assert gpustat.run_tool(str(bad), gpustat.APPS) is None
    ok = tmp_path / "ok"
    ok.write_text("#!/bin/sh\nprintf 'GPU-a, 7, 3\\n'\n")
    ok.chmod(0o755)
    assert gpustat.run_tool(str(ok), gpustat.APPS) == "GPU-a, 7, 3\n"


class _Gpu:
    """A node's GPUs as nvidia-smi would answer: pid -> utilisation (None: not on a GPU)."""

    def __init__(self, util: dict[int, int]):
        self.util, self.calls = util, 0

    def sample(self, now):
        self.calls += 1
        return {pid: gpustat.GpuUse(u, 1000) for pid, u in self.util.items()}


def _node(tmp_path, gpu):
    from slurm_attr.live import livespool

    uid = os.getuid()
    nb = busy.NodeBusy(str(tmp_path), "9", "0", "n0", str(tmp_path), limits=lambda u: Limits(uid=u),
                       counters=lambda pid: procstat.Counters(1, uid, 0, 0),  # CPU and storage still
                       children=lambda pid: [], stacks=lambda jobdir, lim, ranks: {}, gpu=gpu)
    ranks = {1000: 0, 1001: 1}
    nb.cycle(1.0, ranks, uid)
    livespool.write_json(str(tmp_path), "", busy.req_name("0"), {"job": "9", "seq": 1, "ranks": [
        ["n0", 1000, 0], ["n0", 1001, 1]]})
    rows = {}
    for t in range(2, 9):
        rows = nb.cycle(float(t), ranks, uid)
    return rows, uid


def test_a_rank_whose_gpu_computes_moves_and_one_whose_gpu_is_idle_is_still(tmp_path):
    gpu = _Gpu({1000: 95, 1001: 0})
    rows, _ = _node(tmp_path, gpu)
    assert gpu.calls == 6  # asked only once the leader's stack request came (cycle 2 on)
    assert rows["1000"]["still_s"] == 0.0 and rows["1000"]["gpu_still_s"] == 0.0
    assert busy.rank_busy(rows["1000"], awaiting=False) == "GPU moving (no stack: no worker server)"
    assert rows["1001"]["still_s"] is None and "gpu_still_s" not in rows["1001"]  # idle GPU: never moved
    assert busy.rank_busy(rows["1001"], awaiting=False) is None


def test_without_nvidia_smi_the_same_ranks_are_judged_on_their_counters_alone(tmp_path):
    rows, _ = _node(tmp_path, gpustat.GpuProbe(tool=""))
    assert rows["1000"]["still_s"] is None and "gpu_still_s" not in rows["1000"]
    assert busy.rank_busy(rows["1000"], awaiting=False) is None


def test_the_gpu_is_not_asked_while_no_stall_is_judged(tmp_path):
    uid, gpu = os.getuid(), _Gpu({1000: 95})
    nb = busy.NodeBusy(str(tmp_path), "9", "0", "n0", str(tmp_path), limits=lambda u: Limits(uid=u),
                       counters=lambda pid: procstat.Counters(1, uid, 0, 0), children=lambda pid: [],
                       stacks=lambda jobdir, lim, ranks: {}, gpu=gpu)
    for t in range(1, 20):
        rows = nb.cycle(float(t), {1000: 0}, uid)
    assert gpu.calls == 0 and rows["1000"]["still_s"] is None
