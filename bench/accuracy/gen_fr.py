"""Flight Recorder classes, built on the real dumps in shared/fixtures/flight_recorder/:
torch 2.13 Gloo jobs with a deliberate mismatch or stall (4 ranks), and NVIDIA
nvidia-resiliency-ext NCCL dumps of a 16-rank MoE job (GIL held, GPU error). The dumps are
copied unchanged into nodes/<node>/fr/; the output around them is what those jobs print.
Ground truth is each fixture's own (scenario.json, fault_injection.log).
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timedelta

from . import fmt_job, fmt_kernel as fk
from .scene import Scene
from .world import World

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# shared/ sits beside the checkout (tests read ../shared/fixtures) or inside it.
FR = os.environ.get("SATTR_FR_FIXTURES") or next(
    (p for p in (os.path.join(_REPO, "..", "shared", "fixtures", "flight_recorder"),
                 os.path.join(_REPO, "shared", "fixtures", "flight_recorder")) if os.path.isdir(p)), "")
GLOO_PAIR = "/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc"


def _gloo(w: World, scenario: str) -> tuple[Scene, dict, datetime]:
    src = os.path.join(FR, "gloo", scenario)
    with open(os.path.join(src, "scenario.json")) as f:
        meta = json.load(f)
    w.relayout(meta["world_size"])
    s = Scene(w)
    s.ranks_from_output = False
    culprits = set((meta.get("expected") or {}).get("culprit_ranks") or [])
    wrap = bool(culprits) and w.chance(0.35)  # some ranks' ring buffers hold fewer entries
    as_json = wrap or w.pick([False], [True])
    for r in range(meta["world_size"]):
        name = f"nccl_trace_rank_{r}"
        path = os.path.join(src, "json", name + ".json") if as_json else os.path.join(src, name)
        data: str | bytes = path
        if wrap and r not in culprits and w.chance(0.6):
            data = _wrapped(w, path)
        s.fr.setdefault(w.ranks[r], []).append((data, name + (".json" if as_json else "")))
    s.protect_kernel.update(w.nodes)  # the dumps live in the node directories
    t = w.start + w.secs(60, 3600)
    s.training(t)
    return s, meta, t


def _wrapped(w: World, path: str) -> bytes:
    """The same dump as a smaller (wrapped) ring buffer would hold it: the oldest entries gone,
    the rest unchanged (record ids keep counting from where the buffer began)."""
    with open(path) as f:
        dump = json.load(f)
    entries = dump.get("entries") or []
    if len(entries) > 2:
        dump["entries"] = entries[w.rng.randint(1, len(entries) - 2):]
    return json.dumps(dump).encode()


def _enforce(w: World, s: Scene, t: datetime, rank: int, got: int, want: int) -> None:
    """Gloo's abort on the rank that received a payload of the wrong size (torch 2.13)."""
    s.say(t, rank, ["terminate called after throwing an instance of 'gloo::EnforceNotMet'",
                    f"  what():  [enforce fail at {GLOO_PAIR}:456] op.preamble.length <= op.nbytes. {got} vs {want}. "
                    "Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?"],
          stream="stderr")


def _peers_reset(w: World, s: Scene, t: datetime, skip: set[int]) -> None:
    for r in sorted(w.ranks):
        if r not in skip:
            ip = w.ips[w.ranks[(r + 1) % len(w.ranks)]]
            s.say(t + w.secs(0.1, 1), r, f"[rank{r}] RuntimeError: [{GLOO_PAIR}:537] Read error [{ip}]:{w.rng.randint(2000, 60000)}: "
                  "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application. "
                  "Check the logs of the remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f", stream="stderr")


def _gloo_timeouts(w: World, s: Scene, t: datetime, skip: set[int]) -> None:
    for r in sorted(w.ranks):
        if r not in skip:
            s.say(t + w.secs(3, 4), r, f"[rank{r}] RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                  "Timed out waiting 3000ms for recv operation to complete", stream="stderr")


def _abort_case(w: World, scenario: str, victim: int, got: int, want: int, why: str) -> Scene:
    """A size mismatch Gloo caught: one rank aborts (SIGABRT), the rest lose their connection."""
    s, meta, t = _gloo(w, scenario)
    culprit = meta["expected"]["culprit_ranks"]
    _enforce(w, s, t, victim, got, want)
    _peers_reset(w, s, t, {victim})
    s.teardown(t + w.secs(1, 2), [victim], "Aborted (core dumped)")
    s.finish(t + w.secs(35, 40), "FAILED", 134 if w.chance(0.5) else 1)
    s.expect("collective_mismatch", [w.ranks[r] for r in culprit], culprit, [], why)
    return s


def fr_skip(w: World) -> Scene:
    return _abort_case(w, "s2_skip", 1, 4096, 4,
                       "rank 2 skipped reduce_loss (seq 7); rank 1, its neighbour, is the one Gloo aborts")


def fr_size_mismatch(w: World) -> Scene:
    return _abort_case(w, "s4_size_mismatch", 3, 4096, 4000, "rank 3 all_reduces [1000] where the others use [1024]")


def fr_subgroup_mismatch(w: World) -> Scene:
    return _abort_case(w, "s6_subgroup_mismatch", 1, 256, 128, "rank 1 uses [32] instead of [64] in the TP group's all_reduce")


def fr_op_mismatch(w: World) -> Scene:
    s, meta, t = _gloo(w, "s3_op_mismatch")
    culprit = meta["expected"]["culprit_ranks"]
    _gloo_timeouts(w, s, t, set())
    s.teardown(t + w.secs(4, 5), sorted(w.ranks))
    s.finish(t + w.secs(10, 40), "FAILED", 1)
    s.expect("collective_mismatch", [w.ranks[r] for r in culprit], culprit, [], "rank 1 calls all_gather where the others all_reduce")
    return s


def fr_stuck_compute(w: World) -> Scene:
    s, meta, t = _gloo(w, "s5_stuck_compute")
    culprit = meta["expected"]["culprit_ranks"]
    _gloo_timeouts(w, s, t, set(culprit))
    s.teardown(t + w.secs(4, 5), [r for r in w.ranks if r not in culprit])
    s.finish(t + w.secs(40, 45), "FAILED", 1)
    s.expect("rank_stuck", [w.ranks[r] for r in culprit], culprit, [], "rank 0 sleeps before sync_grads; the others wait in it")
    return s


# -- NCCL dumps (nvidia-resiliency-ext) ---------------------------------------------------
NVRX = {"lock_gil_1st": [9, 14], "lock_gil_2nd": [10, 15], "gpu_error_1st": [12, 14], "gpu_error_2nd": [9, 14]}


def _nvrx(w: World, case: str) -> tuple[Scene, list[int], datetime]:
    w.relayout(16)
    s = Scene(w)
    s.ranks_from_output = False
    src = os.path.join(FR, "nvrx", case)
    for r in range(16):
        s.fr.setdefault(w.ranks[r], []).append((os.path.join(src, f"_dump_{r}"), f"_dump_{r}"))
    s.protect_kernel.update(w.nodes)
    t = w.start + w.secs(600, 3600)
    s.training(t)
    faulty = NVRX[case]
    tt = t + timedelta(seconds=600)
    seq = w.rng.randint(4000, 6000)
    for r in sorted(w.ranks):
        if r not in faulty:
            s.torch_says(tt, r, fmt_job.watchdog_timeout(w, tt, r, seq, "ALLTOALL_BASE", 20618240, 600_000)[:1])
    s.teardown(tt + timedelta(seconds=5), [r for r in w.ranks if r not in faulty], "Aborted (core dumped)")
    s.finish(tt + timedelta(seconds=45), "FAILED", 1)
    return s, faulty, t


def fr_nccl_stuck(w: World) -> Scene:
    case = w.pick(["lock_gil_1st", "lock_gil_2nd"], ["gpu_error_2nd"])
    s, faulty, _ = _nvrx(w, case)
    s.expect("rank_stuck", [w.ranks[r] for r in faulty], faulty, [],
             f"nvrx {case}: ranks {faulty} never reached the all_to_all; no node evidence says why")
    return s


def fr_nccl_gpu_error(w: World) -> Scene:
    case = w.pick(["gpu_error_1st"], ["gpu_error_2nd"])
    s, faulty, t = _nvrx(w, case)
    nodes = sorted({w.ranks[r] for r in faulty})
    for r in faulty:
        s.klog(w.ranks[r], t + w.secs(0, 5), fk.xid(w, w.gpu_of(r), 79, "GPU has fallen off the bus.", w.pids[r]))
    s.expect("gpu_hardware", nodes, faulty, nodes,
             f"nvrx {case}: ranks {faulty} missing from the collective, and their GPUs fell off the bus (Xid 79)")
    return s


def rank_stuck_stacks(w: World) -> Scene:
    """One rank stuck outside any collective (data loading); its stack dump shows where, the
    others' show them waiting inside all_reduce until the watchdog fires (issue 22 item 5)."""
    s = Scene(w)
    stuck = w.any_rank()
    t = w.start + w.secs(900, 4 * 3600)
    s.training(t)
    timeout = w.pick([600, 1800], [1200])
    tt = t + timedelta(seconds=timeout)
    pid = w.pids[stuck]
    where = w.pick([("torch/utils/data/dataloader.py", 1133, "_try_get_data"), ("/home/alice/train/ckpt.py", 57, "save_shard")],
                   [("multiprocessing/connection.py", 930, "wait")])
    if w.pick([True], [False]):  # faulthandler.dump_traceback_later
        s.say(tt - timedelta(seconds=30), stuck, [f"Timeout (0:{timeout // 60:02d}:00)!", f"Thread 0x00007f{w.rng.getrandbits(24):06x}5740 (most recent call first):",
                                                  f'  File "{where[0]}", line {where[1]} in {where[2]}',
                                                  '  File "/home/alice/train/train.py", line 371 in main',
                                                  '  File "/home/alice/train/train.py", line 412 in <module>'], stream="stderr")
    else:  # py-spy dump --pid
        s.say(tt - timedelta(seconds=30), stuck, [f"Process {pid}: python train.py", "Python v3.11.8 (/usr/bin/python3.11)", "",
                                                  f'Thread {pid} (idle): "MainThread"', f"    {where[2]} ({where[0]}:{where[1]})",
                                                  "    main (train.py:371)", "    <module> (train.py:412)"], stream="stderr")
    seq = w.rng.randint(100, 90_000)
    for r in sorted(w.ranks):
        if r != stuck:
            s.torch_says(tt, r, fmt_job.watchdog_timeout(w, tt, r, seq, "ALLREDUCE", 8388608, timeout * 1000)[:3])
    s.teardown(tt + timedelta(seconds=5), [r for r in w.ranks if r != stuck], "Aborted (core dumped)")
    s.finish(tt + timedelta(seconds=45), "FAILED", 1)
    s.protect_out = True
    # Even unlabelled, the stuck rank is the one whose watchdog never reported ("[Rank N]")
    s.expect("rank_stuck", [w.ranks[stuck]], [stuck], [],
             "one rank's stack is in data loading/checkpointing while every other rank waits in all_reduce")
    return s


CLASSES = {
    "rank_stuck_stacks": ("rank_stuck", rank_stuck_stacks),
    "fr_skip": ("collective_mismatch", fr_skip),
    "fr_size_mismatch": ("collective_mismatch", fr_size_mismatch),
    "fr_subgroup_mismatch": ("collective_mismatch", fr_subgroup_mismatch),
    "fr_op_mismatch": ("collective_mismatch", fr_op_mismatch),
    "fr_stuck_compute": ("rank_stuck", fr_stuck_compute),
    "fr_nccl_stuck": ("rank_stuck", fr_nccl_stuck),
    "fr_nccl_gpu_error": ("gpu_hardware", fr_nccl_gpu_error),
}
