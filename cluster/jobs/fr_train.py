"""A tiny data-parallel training job with a collective bug, for the local cluster.

    srun -N2 -n4 python cluster/jobs/fr_train.py --fault size --rank 3 --step 3

Each Slurm task is one rank of a torch.distributed (Gloo, CPU) job on localhost.
Every step all_reduces gradients [1024] and the loss [1]; the faulty rank
all_reduces 1000 gradients instead at the faulty step (``--fault size``), or
sleeps before it (``--fault stuck``). The Flight Recorder records every rank's
collectives; each rank writes its dump where the SPANK plugin pointed
TORCH_FR_DUMP_TEMP_FILE (prefix + global rank), as NCCL's watchdog does on a
timeout. Gloo has no watchdog, so the script dumps right after issuing each
collective, before waiting in it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault", choices=("none", "size", "stuck"), default="size")
    ap.add_argument("--rank", type=int, default=3)
    ap.add_argument("--step", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()

    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    port = int(os.environ.get("MASTER_PORT", "29555"))
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=8))
    store = dist.distributed_c10d._get_default_store()

    def dump() -> None:
        if not prefix:
            return
        data = torch._C._distributed_c10d._dump_fr_trace()
        tmp = f"{prefix}{rank}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, f"{prefix}{rank}")

    def allreduce(t: torch.Tensor, faulty: bool = False, gate: bool = False) -> None:
        # The faulty rank goes first so Gloo's size check aborts only the peers' view, not
        # a random rank before every dump is written.
        if gate:
            store.wait(["fault_issued"], timedelta(seconds=30))
        work = dist.all_reduce(t, async_op=True)
        dump()
        if faulty:
            store.set("fault_issued", "1")
        work.wait()

    grads, loss = torch.ones(1024), torch.ones(1)
    try:
        for step in range(1, args.steps + 1):
            print(f"[rank{rank}] step {step}", flush=True)
            here = step == args.step and args.fault != "none"
            if here and rank == args.rank and args.fault == "size":
                allreduce(torch.ones(1000), faulty=True)
            elif here and rank == args.rank and args.fault == "stuck":
                time.sleep(60)
            else:
                allreduce(grads, gate=here and args.fault == "size")
            allreduce(loss)
        dist.barrier()
        dump()
        dist.destroy_process_group()
        return 0
    except Exception as err:  # what a user's training script does: print and die
        print(f"[rank{rank}] RuntimeError: {err}".splitlines()[0], file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
