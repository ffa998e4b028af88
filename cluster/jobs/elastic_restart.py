"""A torchrun job whose worker group fails twice (tests/integration/test_verdicts_cluster.py):
attempt 0, local rank 1 runs out of CUDA memory (torch's own exception, raised here on a CPU
build); torchrun restarts the group (with --max-restarts >= 1); attempt 1, local rank 0 fails on
the program's own error. The other rank of each attempt waits until the agent stops it."""
import os
import time

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ["RANK"])
if attempt == 0 and rank == 1:
    import torch

    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity "
                                 "of 79.11 GiB of which 3.44 MiB is free.")
if attempt >= 1 and rank == 0:
    raise ValueError("too many values to unpack (expected 2)")
time.sleep(60)
