"""The program's own failures: CUDA OOM, host OOM (kernel OOM killer, Slurm's cgroup line,
DataLoader workers), Python exceptions (with and without a message), C++ aborts, segfaults as
each shell reports them, training divergence (NaN/Inf loss, as the frameworks stop on it), and
illegal memory access with its Xid 13/31.

Messages are those PyTorch, CUDA, fairseq, DeepSpeed, Lightning, Megatron-LM, DETR, JAX, bash and
Slurm print (failure-signals.md §4, §6, §7); the traceback frames are invented paths.
"""
from __future__ import annotations

from datetime import datetime

from . import fmt_job, fmt_kernel as fk
from .gen_hw import ADVICE
from .scene import Scene
from .world import World

TORCH = "/opt/venv/lib/python3.11/site-packages/torch"


def user_fail(w: World, lines: list[str], cause: str = "user_error", what: str = "Exited with exit code 1",
              why: str = "", rank: int | None = None, early: bool = True) -> tuple[Scene, int, datetime]:
    """One rank prints ``lines`` and dies; the others lose it (NCCL errors, watchdog, teardown)."""
    s = Scene(w)
    rank = w.any_rank() if rank is None else rank
    t = w.start + (w.secs(20, 120) if early and w.chance(0.3) else w.secs(300, 5 * 3600))
    s.training(t)
    s.t_fail = t
    s.say(t, rank, lines, stream="stderr")
    s.protect_out = True
    end = s.cascade(t, [rank], what=what)
    s.finish(end, "FAILED", 1)
    s.expect(cause, [w.ranks[rank]], [rank], [], why)
    return s, rank, t


def _frames(w: World) -> list[tuple[str, int, str, str]]:
    return fmt_job.TRAIN_FRAMES + [w.rng.choice([
        ("/home/alice/train/model.py", 144, "forward", "h = self.proj(torch.cat([x, ctx], dim=-1))"),
        ("/home/alice/train/data.py", 88, "collate", "labels = torch.stack([s['labels'] for s in samples])")])]


def cuda_oom(w: World) -> Scene:
    rank = w.any_rank()
    gpu, tot = w.local_rank(rank) % 8, w.rng.choice([79.11, 39.39, 15.78])
    ask = w.rng.choice(["20.00 MiB", "1.50 GiB", "2.00 GiB", "512.00 MiB"])
    msg = w.pick([
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {ask}. GPU {gpu} has a total capacity of {tot} GiB of which "
        f"{w.rng.uniform(0.01, 1):.2f} GiB is free. Including non-PyTorch memory, this process has {tot - 0.5:.2f} GiB memory in use. "
        f"Of the allocated memory {tot - 3:.2f} GiB is allocated by PyTorch, and 1.36 GiB is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        f"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {ask} (GPU {gpu}; {tot} GiB total capacity; "
        f"{tot - 2:.2f} GiB already allocated; 3.44 MiB free; {tot - 1:.2f} GiB reserved in total by PyTorch) If reserved memory is >> "
        "allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
        f"RuntimeError: CUDA out of memory. Tried to allocate {ask} (GPU {gpu}; {tot} GiB total capacity; {tot - 2:.2f} GiB already "
        f"allocated; 3.44 MiB free; {tot - 1:.2f} GiB reserved in total by PyTorch)"],
        ["jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.",
         "RuntimeError: CUDA error: out of memory" + "\n" + ADVICE[0]])
    lines = fmt_job.trace_head(_frames(w)) + msg.split("\n")
    return user_fail(w, lines, "cuda_oom", why="CUDA out of memory on one rank", rank=rank)[0]


def host_oom_kernel(w: World) -> Scene:
    """The kernel's OOM killer picks one rank's process in the job's cgroup; Slurm reports it."""
    s = Scene(w)
    rank = w.any_rank()
    node = w.ranks[rank]
    t = w.start + w.secs(300, 5 * 3600)
    s.training(t)
    s.klog(node, t, fk.oom_kill(w, w.pids[rank], w.job_id, w.uid, w.local_rank(rank)))
    s.slurm_says(t + w.secs(1, 3), w.pick(
        [f"slurmstepd: error: Detected 1 oom-kill event(s) in StepId={w.job_id}.0. Some of your processes may have been killed by the cgroup out-of-memory handler."],
        [f"slurmstepd-{w.short(node)}: error: Detected 1 oom_kill event(s) in StepId={w.job_id}.0. Some of the step tasks have been OOM Killed."]))
    end = s.cascade(t, [rank], what="Out Of Memory")
    oom_state = w.pick([True], [False])
    s.finish(end, "OUT_OF_MEMORY" if oom_state else "FAILED", 0 if oom_state else 1, 125 if oom_state else 0)
    if not oom_state:
        s.protect_out = True
    s.protect_kernel.add(node)
    s.expect("host_oom", [node], [rank], [], "the kernel OOM killer killed a rank in the job's cgroup")
    return s


def host_oom_dataloader(w: World) -> Scene:
    rank = w.any_rank()
    worker = w.rng.randint(2000, 4_000_000)
    lines = fmt_job.traceback(fmt_job.TRAIN_FRAMES + [(f"{TORCH}/utils/data/_utils/signal_handling.py", 67, "handler",
                                                        "_error_if_any_worker_fails()")],
                              f"RuntimeError: DataLoader worker (pid {worker}) is killed by signal: Killed. ")
    s, rank, t = user_fail(w, lines, "host_oom", why="a DataLoader worker OOM-killed by the kernel", rank=rank, early=False)
    node = w.ranks[rank]
    s.klog(node, t - w.secs(0.2, 2), fk.oom_kill(w, worker, w.job_id, w.uid, w.local_rank(rank)))
    s.protect_kernel.add(node)
    return s


def user_traceback(w: World) -> Scene:
    last = w.pick([
        "KeyError: 'labels'",
        "ValueError: Expected input batch_size (32) to match target batch_size (16).",
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x512 and 1024x256)",
        "FileNotFoundError: [Errno 2] No such file or directory: '/home/alice/data/train_shard_017.bin'",
        "ModuleNotFoundError: No module named 'flash_attn'"],
        ["RuntimeError: Error(s) in loading state_dict for GPT:\n\tMissing key(s) in state_dict: \"lm_head.weight\". ",
         "TypeError: forward() got an unexpected keyword argument 'attention_mask'",
         "IndexError: index 50257 is out of bounds for dimension 0 with size 50257"])
    lines = fmt_job.trace_head(_frames(w)) + last.split("\n")
    s, rank, t = user_fail(w, lines, why="a Python exception on one rank")
    if w.chance(0.4):  # torchrun's summary of the same failure
        s.slurm_says(t + w.secs(1, 3), fmt_job.torchrun_root_cause(w, t, w.short(w.ranks[rank]), rank, 1, w.pids[rank]))
    return s


def user_assert_bare(w: World) -> Scene:
    frames = _frames(w) + [("/home/alice/train/model.py", 61, "forward", "assert x.shape[-1] == self.d_model")]
    return user_fail(w, fmt_job.traceback(frames, "AssertionError"), why="an AssertionError without a message")[0]


def user_bad_alloc(w: World) -> Scene:
    lines = ["terminate called after throwing an instance of 'std::bad_alloc'", "  what():  std::bad_alloc"]
    return user_fail(w, lines, what="Aborted (core dumped)", why="a C++ std::bad_alloc aborts the program")[0]


def user_segfault(w: World) -> Scene:
    pid = w.rng.randint(2000, 4_000_000)
    shell = w.pick([f"bash: line 1: {pid} Segmentation fault      (core dumped) python train.py", "Segmentation fault (core dumped)"],
                   [f"/var/spool/slurmd/job{w.job_id}/slurm_script: line 22: {pid} Segmentation fault      (core dumped) python train.py",
                    "Segmentation fault"])
    lines = []
    if w.chance(0.5):  # faulthandler's report before the shell's
        lines += ["Fatal Python error: Segmentation fault", "", f"Thread 0x00007f{w.rng.getrandbits(24):06x}4740 (most recent call first):",
                  f'  File "{TORCH}/nn/functional.py", line 2264 in embedding', '  File "/home/alice/train/model.py", line 88 in forward']
    s, rank, t = user_fail(w, lines + [shell], what="Segmentation fault (core dumped)", why="the program segfaulted")
    if w.chance(0.5):  # the kernel's own line (trusted)
        s.klog(w.ranks[rank], t, f"python[{pid}]: segfault at 0 ip 00007f{w.rng.getrandbits(32):08x} sp 00007ffd{w.rng.getrandbits(32):08x} "
                                 f"error 4 in libcustom_ops.so[7f{w.rng.getrandbits(28):07x}000+1d3000]")
    return s


def user_nan(w: World) -> Scene:
    stop = w.pick([
        ["FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding. Try lowering the learning rate, "
         "using gradient clipping or increasing the batch size."],
        ["Loss is nan, stopping training"],
        ["RuntimeError: The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot be clipped. To disable "
         "this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"],
        ["Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."]],
        [["FloatingPointError: gradients are Nan/Inf"],
         ["RuntimeError: Function 'LogSoftmaxBackward0' returned nan values in its 0th output."],
         ["ValueError: Detected nan and/or inf values in `model.layers.11.mlp.fc1.weight`. Check your forward pass for numerically unstable operations."],
         ["AssertionError: Rank {r}: found NaN in local grad norm in backward pass before data-parallel communication collective. Device: 0, node: {h}"]])
    rank = 0 if w.chance(0.6) else w.any_rank()
    text = [l.replace("{r}", str(rank)).replace("{h}", w.short(w.ranks[rank])) for l in stop]
    lines = text if text[0].startswith("Loss is") else fmt_job.trace_head(fmt_job.TRAIN_FRAMES) + text
    s, rank, t = user_fail(w, lines, why="training diverged (non-finite loss/gradients) and the program stopped", rank=rank, early=False)
    for i, loss in enumerate([f"{w.rng.uniform(4, 9):.4f}", f"{w.rng.uniform(20, 900):.4f}", w.pick(["nan"], ["inf", "NaN"])]):
        s.say(t - w.secs(40 - 10 * i, 41 - 10 * i), rank, fmt_job.progress(w, 90_000 + i * 10, loss))
    return s


def user_illegal_access(w: World) -> Scene:
    lines = fmt_job.traceback(_frames(w), "RuntimeError: CUDA error: an illegal memory access was encountered") + ADVICE
    s, rank, t = user_fail(w, lines, why="illegal memory access; the Xid 13/31 on its GPU is the program's (no drain)")
    bdf, pid = w.gpu_of(rank), w.pids[rank]
    xid = w.pick([fk.xid(w, bdf, 13, f"Graphics SM Warp Exception on (GPC {w.rng.randint(0, 7)}, TPC {w.rng.randint(0, 8)}, SM 0): Out Of Range Address", pid)],
                 [fk.xid(w, bdf, 31, "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2f_c0000000. "
                                     "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ", pid)])
    s.klog(w.ranks[rank], t - w.secs(0.1, 1), xid)
    if w.chance(0.4):
        s.klog(w.ranks[rank], t + w.secs(2, 6), fk.xid(w, bdf, 43, "Ch 00000008", pid))
    return s


def _restart_line(w: World, t: datetime) -> str:
    """torchrun's agent restarting its worker group (failure-signals.md §7), either logger."""
    left, limit = w.rng.randint(1, 3), 3
    what = w.pick([f"[default] Worker group FAILED. {left}/{limit} attempts left; will restart worker group"],
                  [f"[default] Worker group UNHEALTHY. {left}/{limit} attempts left; will restart worker group",
                   "[default] Detected 1 new nodes from group_rank=0; will restart worker group"])
    return w.pick([f"INFO:torch.distributed.elastic.agent.server.api:{what}"],
                  [f"{fmt_job.glog(t, 'I')} {w.rng.randint(100000, 999999)} torch/distributed/elastic/agent/server/api.py:"
                   f"{w.rng.choice([688, 723])}] {what}"])


def _survived_then(w: World, oom_last: bool) -> Scene:
    """Two failures on two ranks with torchrun's restart of the worker group between them: the
    first was survived (the job went on), the second ended the job. ``oom_last``: a program error,
    the restart, then a CUDA OOM that ends it; else a CUDA OOM, the restart, then the error."""
    s = Scene(w)
    a, b = w.any_rank(), w.any_rank()
    t1 = w.start + w.secs(300, 3600)
    s.training(t1)
    oom = fmt_job.trace_head(_frames(w)) + [
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {w.rng.choice(['20.00 MiB', '1.50 GiB'])}. "
        f"GPU {w.local_rank(a) % 8} has a total capacity of 79.11 GiB of which 3.44 MiB is free."]
    err = fmt_job.traceback(_frames(w), w.pick(["ValueError: too many values to unpack (expected 2)"],
                                               ["KeyError: 'input_ids'"]))
    first, last = (err, oom) if oom_last else (oom, err)
    who_first, who_last = (b, a) if oom_last else (a, b)
    s.say(t1, who_first, first, stream="stderr")
    t2 = t1 + w.secs(5, 40)
    s.say(t2, None, _restart_line(w, t2), stream="stderr")
    t3 = t2 + w.secs(600, 3600)
    s.say(t3, who_last, last, stream="stderr")
    s.protect_out = True
    end = s.cascade(t3, [who_last])
    s.finish(end, "FAILED", 1)
    s.expect("cuda_oom" if oom_last else "user_error", [w.ranks[who_last]], [who_last], [],
             "the failure after torchrun's last restart ended the job; the one before it was survived")
    return s


def elastic_restart_survived(w: World) -> Scene:
    return _survived_then(w, oom_last=False)


def elastic_restart_then_oom(w: World) -> Scene:
    return _survived_then(w, oom_last=True)


CLASSES = {
    "elastic_restart_survived": ("user_error", elastic_restart_survived),
    "elastic_restart_then_oom": ("cuda_oom", elastic_restart_then_oom),
    "cuda_oom": ("cuda_oom", cuda_oom),
    "host_oom_kernel": ("host_oom", host_oom_kernel),
    "host_oom_dataloader": ("host_oom", host_oom_dataloader),
    "user_traceback": ("user_error", user_traceback),
    "user_assert_bare": ("user_error", user_assert_bare),
    "user_bad_alloc": ("user_error", user_bad_alloc),
    "user_segfault": ("user_error", user_segfault),
    "user_nan_divergence": ("user_error", user_nan),
    "user_illegal_access": ("user_error", user_illegal_access),
}
