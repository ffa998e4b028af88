"""The GPU check of the native probe under real NCCL (run by hand on a machine with an NVIDIA
GPU and a CUDA build of torch; see DEVELOPERS.md). Not part of `make test`: this machine
has no GPU.

NCCL loads the profiler table of the newest version it knows that the plugin exports
(research/nccl-probe.md: 2.26 -> v3, 2.27 -> v4, 2.28 -> v5, 2.29 to 2.32 -> v6). This
check starts one process with ProcessGroupNCCL on GPU 0 and the probe given the way the
SPANK plugin gives it (NCCL_PROFILER_PLUGIN, SLURM_ATTR_PROBE_DIR), runs a few collectives
and reads the record back with the post-mortem decoder (slurm_attr.probe.record):

- NCCL logged the probe's own start line through its logger (the plugin was loaded);
- the record's communicator was initialised through the table this NCCL should pick;
- from v5 on, every collective call reached the probe as an API event, per function.

One GPU gives a one-rank communicator, which NCCL runs as a local copy without the
Coll/kernel-channel events of a real ring: those are printed, not judged (the harness
checks them against NCCL's event order, spank/tests/probe_harness_*.c).

    python tests/gpu/check_probe_nccl.py     # exit 0: every check passed; 1: one failed;
                                             # 77: no CUDA GPU here (nothing checked)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP = 77
# (first NCCL (major, minor) of a table, the table) newest first: what probe_abi.c exports
TABLES = (((2, 29), 6), ((2, 28), 5), ((2, 27), 4), ((2, 26), 3))
CALLS = {"AllReduce": 5, "AllGather": 3, "Broadcast": 2}


def expected_table(version: tuple[int, ...]) -> int | None:
    for first, table in TABLES:
        if tuple(version[:2]) >= first:
            return table
    return None


def child() -> int:
    """The job's rank: collectives only; the parent judges."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    t = torch.ones(1 << 20, device="cuda")
    out = torch.empty(1 << 20, device="cuda")
    for _ in range(CALLS["AllReduce"]):
        dist.all_reduce(t)
    for _ in range(CALLS["AllGather"]):
        dist.all_gather_into_tensor(out, t)
    for _ in range(CALLS["Broadcast"]):
        dist.broadcast(t, src=0)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return 0


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(f"no CUDA GPU (torch {torch.__version__}): nothing checked")
        return SKIP
    sys.path.insert(0, str(REPO))
    from slurm_attr.probe import layout as L
    from slurm_attr.probe.record import parse

    probe = Path(os.environ.get("SATTR_PROBE_LIB", REPO / "spank" / "build" / "libnccl-profiler-sattr.so"))
    nccl = torch.cuda.nccl.version()
    want = expected_table(nccl)
    print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, nccl))}: expect table v{want}; probe {probe}")
    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)

    if not probe.exists():
        check(False, f"the probe is built ({probe}: make -C spank)")
        return 1
    jobdir = Path(tempfile.mkdtemp(prefix="sattr-gpu-probe-"))
    env = dict(os.environ, SLURM_ATTR_PROBE_DIR=str(jobdir), NCCL_PROFILER_PLUGIN=str(probe),
               NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV", RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29563")
    run = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True,
                         timeout=300)
    log = run.stdout + run.stderr
    (jobdir / "child.log").write_text(log)
    check(run.returncode == 0, f"the rank ran its collectives (exit {run.returncode}; log {jobdir}/child.log)")
    check("probe on:" in log, "NCCL loaded the probe: its start line came through NCCL's logger")
    files = sorted(jobdir.glob("rank0.pid*.probe"))
    check(len(files) == 1, f"one record for the one process: {[p.name for p in files]}")
    if not files:
        return 1
    rec = parse(files[0].read_bytes(), files[0].name)
    slots = [s for s in rec.slots if s.nranks == 1 and s.rank == 0]
    check(rec.api_ver == want and len(slots) >= 1 and all(s.api_ver == want for s in slots),
          f"NCCL initialised the communicator through table v{want}: record v{rec.api_ver}, "
          f"slots {[(s.name, s.api_ver) for s in rec.slots]}")
    if want is not None and want >= 5 and slots:
        s = slots[0]
        calls = {L.func_name(f): n for f, n in enumerate(s.api_func) if n}
        check(all(calls.get(f, 0) >= n for f, n in CALLS.items()) and s.coll_api_enter == s.coll_api_exit,
              f"every collective call reached the probe: {calls} (asked {CALLS}); "
              f"API enter/exit {s.coll_api_enter}/{s.coll_api_exit}")
    for s in rec.slots:
        print("     slot", json.dumps({
            "name": s.name, "state": s.state, "api_ver": s.api_ver, "ops": s.op_count,
            "copy_engine": s.ce_tasks, "launched": {L.func_name(f): n for f, n in enumerate(s.func_seq) if n},
            "kernel_channels": [s.kch_started, s.kch_stopped], "mask": f"{rec.event_mask:#x}"}))
    print(f"{'all checks passed' if not failed else f'{failed} check(s) failed'}; files in {jobdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(child() if sys.argv[1:] == ["--child"] else main())
