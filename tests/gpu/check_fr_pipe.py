"""The GPU check of issue 14's FR debug pipe (run by hand on a machine with an NVIDIA GPU and a
CUDA build of torch; see DEVELOPERS.md). Not part of `make test`: this machine has no GPU.

One process, ProcessGroupNCCL with one rank on GPU 0, the variables the SPANK plugin sets
(TORCH_NCCL_DEBUG_INFO_PIPE_FILE, TORCH_FR_DUMP_TEMP_FILE, TORCH_FR_BUFFER_SIZE) pointing into a
job-dir-shaped temp dir. After a few all_reduce, it waits for ProcessGroupNCCL's FIFO, writes
to it with the watcher's own code (slurm_attr.live.dumps.trigger_pipes) and waits for the
dump, which the post-mortem loader (slurm_attr.flightrec.loader) must read back with those
all_reduce in it. With the probe built (spank/build/libnccl-profiler-sattr.so) NCCL also loads
it and its record must appear.

    python tests/gpu/check_fr_pipe.py        # exit 0: every check passed; 1: one failed;
                                             # 77: no CUDA GPU here (nothing checked)
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP = 77


def wait_for(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.2)
    return False


def main() -> int:
    import torch  # ProcessGroupNCCL reads the variables below when it is created, not at import
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print(f"no CUDA GPU (torch {torch.__version__}): nothing checked")
        return SKIP
    jobdir = Path(tempfile.mkdtemp(prefix="sattr-gpu-"))
    for sub in ("fr", "probe"):
        (jobdir / sub).mkdir()
    # what spank/plugin/envplan.c sets for every task of an enabled job
    os.environ.update({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{jobdir}/fr/pipe_rank_",
                       "TORCH_FR_DUMP_TEMP_FILE": f"{jobdir}/fr/nccl_trace_rank_",
                       "TORCH_FR_BUFFER_SIZE": "2000", "SLURM_ATTR_PROBE_DIR": f"{jobdir}/probe",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561"})
    probe = REPO / "spank" / "build" / "libnccl-profiler-sattr.so"
    if probe.exists():
        os.environ["NCCL_PROFILER_PLUGIN"] = str(probe)
    sys.path.insert(0, str(REPO))
    from slurm_attr.flightrec.loader import load_dumps
    from slurm_attr.live.dumps import trigger_pipes

    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    pipe = jobdir / "fr" / "pipe_rank_0.pipe"
    check(wait_for(pipe, 60), f"ProcessGroupNCCL made its debug pipe {pipe.name}")
    sent = trigger_pipes(str(jobdir), os.getuid())
    check(sent == {0: "sent"}, f"the watcher's trigger_pipes wrote to it: {sent}")
    dump = jobdir / "fr" / "nccl_trace_rank_0"
    check(wait_for(dump, 60), f"a dump appeared: {dump.name}")
    if dump.exists():
        time.sleep(1)  # written in place: let it finish
        ds = load_dumps(str(jobdir / "fr"), tail_entries=None)
        tr = ds.traces.get(0)
        check(tr is not None and tr.n_entries >= 5, f"the loader read rank 0's dump: "
              f"{tr.n_entries if tr else 0} entries, problems {[p.__dict__ for p in ds.problems][:3]}")
    if probe.exists():
        recs = sorted(p.name for p in (jobdir / "probe").iterdir())
        check(any(n.startswith("rank0.") and n.endswith(".probe") for n in recs), f"the probe's record: {recs}")
    dist.destroy_process_group()
    print(f"{'all checks passed' if not failed else f'{failed} check(s) failed'}; files in {jobdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
