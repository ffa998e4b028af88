"""Job-side line formats: PyTorch (watchdog generations, torchrun, tracebacks), NCCL debug
lines, and Slurm's own words in the job's output and daemon logs.

Formats from shared/research/failure-signals.md §5-7 and the real bundles in
tests/fixtures/bundles/ (torch 2.13 Gloo run, the xid79 cascade); values drawn per case.
"""
from __future__ import annotations

from datetime import datetime

from .world import World


def glog(t: datetime, sev: str = "E") -> str:
    """c10's log prefix: month*100+day without padding, nanoseconds ("E502 10:10:03.837761934")."""
    return f"{sev}{t.month * 100 + t.day} {t:%H:%M:%S}.{t.microsecond:06d}{t.microsecond % 997:03d}"


def pg_tag(w: World, rank: int) -> str:
    return f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]" if w.torch_new else f"[Rank {rank}]"


def watchdog_timeout(w: World, t: datetime, rank: int, seq: int, op: str, numel: int, timeout_ms: int) -> list[str]:
    """The watchdog's timeout and the lines that follow it, old or new generation (§6)."""
    ran = timeout_ms + w.rng.randint(5, 900)
    if w.torch_new:
        head = f"[rank{rank}]:[{glog(t)} ProcessGroupNCCL.cpp:{w.rng.choice([616, 632, 1632])}] {pg_tag(w, rank)} "
        work = f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout_ms})"
    else:
        head = f"[E ProcessGroupNCCL.cpp:{w.rng.choice([475, 828])}] [Rank {rank}] "
        work = f"WorkNCCL(SeqNum={seq}, OpType={op}, Timeout(ms)={timeout_ms})"
    return [f"{head}Watchdog caught collective operation timeout: {work} ran for {ran} milliseconds before timing out.",
            f"{head}Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
            "subsequent GPU operations might run on corrupted/incomplete data.",
            f"{head}To avoid data inconsistency, we are taking the entire process down.",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            f"  what():  {pg_tag(w, rank)} Process group watchdog thread terminated with exception: "
            f"[Rank {rank}] Watchdog caught collective operation timeout: {work} ran for {ran} milliseconds before timing out."]


def remote_error(w: World, rank: int, last: str | None = None) -> list[str]:
    """torch's DistBackendError for ncclRemoteError, with NCCL's last error if it kept one."""
    out = [f"torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
           f"{w.rng.choice([1970, 2027, 1275])}, remote process exited or there was a network error, NCCL version {w.nccl_version}",
           "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."]
    if last:
        out += ["Last error:", last]
    return out


def nccl(w: World, node: str, rank: int, src: str, level: str, msg: str, tid: int | None = None) -> str:
    """One NCCL debug line: host:pid:tid [cudaDev] file:line NCCL LEVEL message."""
    dev = w.local_rank(rank) % 8
    where = f" {src}" if src else ""
    host = w.pick([w.short(node)], [node])
    return f"{host}:{w.pids[rank]}:{tid or w.pids[rank] + 60 + dev} [{dev}]{where} NCCL {level} {msg}"


def ib_completion(w: World, peer_ip: str, status: int, local_ip: str) -> str:
    port = w.rng.randint(30_000, 60_000)
    if not w.ib_old_form:
        return (f"NET/IB : Got completion from peer {peer_ip}<{port}> with status={status} opcode=0 len=0 "
                f"vendor err {w.rng.choice([129, 244, 249])} (Send) localGid ::ffff:{local_ip} remoteGids::ffff:{peer_ip}")
    return f"NET/IB : Got completion from peer {peer_ip}<{port}> with error {status}, opcode 0, len 0, vendor err 129 (Recv)"


def traceback(frames: list[tuple[str, int, str, str]], last: str) -> list[str]:
    """A Python traceback: (file, line, function, source) frames, then the exception line."""
    out = ["Traceback (most recent call last):"]
    for path, line, fn, src in frames:
        out += [f'  File "{path}", line {line}, in {fn}', f"    {src}"]
    return out + [last]


def trace_head(frames: list[tuple[str, int, str, str]]) -> list[str]:
    """A traceback's frames without the exception line (the caller adds a multi-line one)."""
    return traceback(frames, "")[:-1]


TRAIN_FRAMES = [("/home/alice/train/train.py", 412, "<module>", "main(args)"),
                ("/home/alice/train/train.py", 371, "main", "loss = train_step(model, batch)")]


def torchrun_root_cause(w: World, t: datetime, host: str, rank: int, exitcode: int, pid: int) -> list[str]:
    """torchrun's ChildFailedError summary block (elastic), as it ends a failed launch."""
    trace = (f"Signal {-exitcode} (SIGKILL) received by PID {pid}" if exitcode < 0
             else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    return ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "============================================================", "train.py FAILED",
            "------------------------------------------------------------", "Failures:", "  <NO_OTHER_FAILURES>",
            "------------------------------------------------------------", "Root Cause (first observed failure):", "[0]:",
            f"  time      : {t:%Y-%m-%d_%H:%M:%S}", f"  host      : {host}",
            f"  rank      : {rank} (local_rank: {w.local_rank(rank)})", f"  exitcode  : {exitcode} (pid: {pid})",
            "  error_file: <N/A>", f"  traceback : {trace}", "============================================================"]


def torchrun_failed(w: World, t: datetime, rank: int, exitcode: int = 1) -> str:
    """torchrun's (elastic agent's) timed report of the worker that failed first (torch >= 2.4)."""
    return (f"E{t:%m%d %H:%M:%S}.{t.microsecond:06d} {w.rng.randint(100000, 200000)} torch/distributed/elastic/multiprocessing/api.py:869] "
            f"failed (exitcode: {exitcode}) local_rank: {w.local_rank(rank)} (pid: {w.pids[rank]}) of binary: /usr/bin/python3")


def torchrun_sigterm(w: World, t: datetime, pid: int) -> str:
    if w.torch_new:
        return f"W{t:%m%d %H:%M:%S}.{t.microsecond:06d} {w.rng.randint(100000, 200000)} torch/distributed/elastic/multiprocessing/api.py:897] Sending process {pid} closing signal SIGTERM"
    return f"WARNING:torch.distributed.elastic.multiprocessing.api:Sending process {pid} closing signal SIGTERM"


def progress(w: World, step: int, loss: float | str) -> str:
    loss_s = loss if isinstance(loss, str) else f"{loss:.4f}"
    return (f"step {step} | loss {loss_s} | lr 3.0e-4 | grad_norm {w.rng.uniform(0.05, 1.0):.3f} | "
            f"tokens/s {w.rng.randint(100_000, 200_000)}")


# -- Slurm ------------------------------------------------------------------------------
def cancel_banner(w: World, node: str, t: datetime, reason: str = "", step: bool = False) -> str:
    what = f"STEP {w.job_id}.0" if step else f"JOB {w.job_id}"
    due = f" DUE TO {reason}" if reason else ""
    who = w.pick(["slurmstepd: error: "], [f"slurmstepd-{node}: error: "])
    return f"{who}*** {what} ON {node} CANCELLED AT {t:%Y-%m-%dT%H:%M:%S}{due} ***"


def srun_tasks(w: World, node: str, ranks: list[int], what: str) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"srun: error: {node}: task {ranks[0]}: {what}"  # Slurm's node name, as slurm.conf has it
    spans, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            spans.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return f"srun: error: {node}: tasks {','.join(spans)}: {what}"


def ctld(t: datetime, msg: str) -> str:
    return f"[{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}] {msg}"


def hostlist(nodes: list[str]) -> str:
    """Slurm's compressed host list (n[1-3,7]) when the names share a prefix and end in a number."""
    import re

    parts = [re.fullmatch(r"(.*?)(\d+)", n) for n in nodes]
    if not all(parts) or len({m.group(1) for m in parts}) != 1:
        return ",".join(nodes)
    prefix, width = parts[0].group(1), len(parts[0].group(2))
    nums = sorted(int(m.group(2)) for m in parts)
    spans, start = [], nums[0]
    for a, b in zip(nums, nums[1:] + [None]):
        if b != a + 1:
            spans.append(f"{start:0{width}d}-{a:0{width}d}" if a != start else f"{a:0{width}d}")
            start = b
    return f"{prefix}[{','.join(spans)}]"
