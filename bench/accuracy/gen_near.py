"""Near misses: an incident of one class with a look-alike of another beside it. The truth is the
real failure; the look-alike must neither win nor drain (STYLE: "configured wall-time limit is
04:00:00" must not be a time-limit verdict).
"""
from __future__ import annotations

from datetime import timedelta

import os

from . import fmt_job, fmt_kernel as fk
from .gen_fr import FR
from .gen_infra import completed
from .gen_net import comm_hang
from .gen_sched import cancelled, time_limit
from .gen_user import cuda_oom, user_traceback
from .scene import Scene
from .world import HCAS, World


def _culprit(s: Scene) -> str:
    return s.truth.nodes[0] if s.truth.nodes else s.w.nodes[0]


def corrected_ecc_then_traceback(w: World) -> Scene:
    s = user_traceback(w)
    node, t = _culprit(s), s.t_fail
    s.klog(node, t - w.secs(30, 900), [fk.edac_ce(w) for _ in range(w.rng.randint(1, 6))])
    if w.chance(0.5):
        s.klog(node, t - w.secs(5, 60), "mce: [Hardware Error]: Machine check events logged")
    if w.chance(0.5):
        s.klog(node, t - w.secs(5, 60), fk.xid(w, w.gpu_of(s.truth.ranks[0]), 92, "High single-bit ECC error rate"))
    s.protect_kernel.add(node)
    s.truth.why = "corrected ECC (EDAC CE, Xid 92) on the rank's node is not the failure: its traceback is"
    return s


def xid_before_job(w: World) -> Scene:
    s = user_traceback(w)
    node = _culprit(s)
    s.klog(node, w.start - timedelta(minutes=w.rng.randint(45, 180)),
           fk.xid(w, w.gpu_of(s.truth.ranks[0]), 79, "GPU has fallen off the bus.", w.rng.randint(2000, 90_000)))
    s.protect_kernel.add(node)
    s.truth.why = "the Xid 79 is from before this job started (another job's window; the node was rebooted): no drain"
    return s


def time_limit_words(w: World) -> Scene:
    s = completed(w) if w.chance(0.5) else user_traceback(w)
    lines = w.pick([["INFO: configured wall-time limit is 04:00:00; checkpointing every 30 min",
                     "   RunTime=00:00:04 TimeLimit=04:00:00 TimeMin=N/A"]],
                   [["Time limit: 1-00:00:00 (will stop cleanly 10 minutes before)",
                     "WARNING: job will hit the TIME LIMIT soon if throughput stays this low"]])
    s.say(w.start + timedelta(seconds=5), 0, lines)
    s.truth.why = f"{s.truth.why}; the program's words about its time limit are not Slurm's TIME LIMIT"
    return s


def ib_flap_recovered(w: World) -> Scene:
    s = user_traceback(w)
    node, hca = w.any_node(), w.rng.choice(HCAS)
    t = s.t_fail - timedelta(minutes=w.rng.randint(10, 40))
    s.klog(node, t, fk.link(hca, "DOWN"))
    s.klog(node, t + w.secs(3, 30), fk.link(hca, "ACTIVE"))
    s.truth.why = "an IB link flapped and came back long before the rank's own exception"
    return s


def aer_corrected_then_oom(w: World) -> Scene:
    s = cuda_oom(w)
    node = _culprit(s)
    s.klog(node, s.t_fail - w.secs(10, 600), fk.aer_corrected(w))
    s.truth.why = "corrected PCIe AER beside a CUDA OOM"
    return s


def sxid_nonfatal_time_limit(w: World) -> Scene:
    s = time_limit(w)
    node = w.any_node()
    sw = w.rng.randint(0, 3)
    s.klog(node, s.t_fail - w.secs(60, 3000),
           f"nvidia-nvswitch{sw}: SXid (PCI:0000:c{sw}:00.0): 12028, Non-fatal, Link {w.rng.randint(0, 63):02d} egress non-posted PRIV error")
    s.truth.why = "a non-fatal SXid during a job that ran out of time"
    return s


def xid45_at_cancel(w: World) -> Scene:
    s = cancelled(w)
    for node in w.rng.sample(w.nodes, w.rng.randint(1, len(w.nodes))):
        r = w.ranks_on(node)[0]
        s.klog(node, s.t_fail + w.secs(2, 30), fk.xid(w, w.gpu_of(r), 45, "Ch 00000010", w.pids[r]))
    s.truth.why = "Xid 45 is the driver cleaning up the channels of processes the cancel killed"
    return s


def oom_other_job(w: World) -> Scene:
    s = user_traceback(w)
    node = w.any_node()
    other = str(int(w.job_id) + w.rng.randint(1, 500))
    s.klog(node, s.t_fail - w.secs(60, 1800), fk.oom_kill(w, w.rng.randint(2000, 90_000), other, w.uid + 7, 0))
    s.truth.why = f"the kernel OOM-killed a task of job {other} (its cgroup), not of this job"
    return s


def memory_warning_traceback(w: World) -> Scene:
    s = user_traceback(w)
    s.slurm_says(s.t_fail + w.secs(30, 40), "slurmstepd: error: Exceeded job memory limit at some point.")
    s.truth.why = "'Exceeded job memory limit at some point.' is a warning, not the failure"
    return s


def killed_word_cancel(w: World) -> Scene:
    s = cancelled(w)
    for r in w.rng.sample(sorted(w.ranks), min(3, len(w.ranks))):
        s.say(s.t_fail + w.secs(30, 35), r, w.pick(["Killed"], [f"bash: line 1: {w.pids[r]} Killed                  python train.py"]))
    s.truth.why = "a bare 'Killed' after scancel's SIGKILL is not the OOM killer"
    return s


def completed_with_caught_errors(w: World) -> Scene:
    s = completed(w)
    t = w.start + w.secs(300, 1200)
    s.say(t, 0, ["wandb: Network error (ReadTimeout), entering retry loop.",
                 "Traceback (most recent call last):",
                 '  File "/opt/venv/lib/python3.11/site-packages/wandb/sdk/internal/internal_api.py", line 366, in execute',
                 "    return self.client.execute(*args, **kwargs)  # type: ignore",
                 "requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='api.wandb.ai', port=443): Read timed out. (read timeout=20)",
                 "wandb: Network error resolved after 0:01:12.405512, resuming normal operation."], stream="stderr")
    s.truth.why = "a logged, caught exception in a job that completed"
    return s


def completed_loss_scale_skips(w: World) -> Scene:
    s = completed(w)
    for i in range(w.rng.randint(2, 6)):
        t = w.start + w.secs(60, 1200)
        scale = 2 ** w.rng.randint(10, 16)
        s.say(t, 0, w.pick([f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}, reducing to {scale // 2}"],
                           [f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {float(scale // 2)}",
                            f"| WARNING: overflow detected, setting loss scale to: {float(scale // 2)}"]))
    s.truth.why = "mixed-precision loss-scale overflows skip a step; the run recovered and completed"
    return s


def completed_nfs_recovered(w: World) -> Scene:
    s = completed(w)
    node = w.any_node()
    t = w.start + w.secs(300, 1200)
    srv = f"nfs0{w.rng.randint(1, 4)}.cluster"
    s.klog(node, t, f"nfs: server {srv} not responding, still trying")
    s.klog(node, t + w.secs(120, 130), fk.hung_task(w.pids[w.ranks_on(node)[0]]))
    s.klog(node, t + w.secs(140, 400), f"nfs: server {srv} OK")
    s.truth.why = "NFS stalled and came back; the job completed"
    return s


def fr_healthy_dump(w: World) -> Scene:
    """Real dumps of a healthy run (every collective completed on every rank), written by the
    program's exception handler; one rank raised between collectives."""
    w.relayout(4)
    s = user_traceback(w)
    src = os.path.join(FR, "gloo", "s1_healthy")
    for r in range(4):
        s.fr.setdefault(w.ranks[r], []).append((os.path.join(src, f"nccl_trace_rank_{r}"), f"nccl_trace_rank_{r}"))
    s.protect_kernel.update(w.nodes)
    s.truth.why = "healthy Flight Recorder dumps (no mismatch, nothing stuck) beside one rank's exception"
    return s


def stacks_all_in_collective(w: World) -> Scene:
    """Every rank's faulthandler stack is inside all_reduce: nobody is stuck outside it."""
    s = comm_hang(w)
    t = max(l.t for l in s.out)
    for r in sorted(w.ranks):
        s.say(t, r, ["Timeout (0:10:00)!", f"Thread 0x00007f{w.rng.getrandbits(24):06x}5740 (most recent call first):",
                     '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce',
                     '  File "/home/alice/train/train.py", line 371 in main'], stream="stderr")
    s.truth.why = "all ranks wait inside the same all_reduce (their stacks say so): a hang, no stuck rank"
    return s


def cuda_oom_recovered(w: World) -> Scene:
    s = completed(w)
    t = w.start + w.secs(60, 600)
    s.say(t, 0, ["WARNING:root:micro-batch 16 does not fit, retrying with 8: CUDA out of memory. Tried to allocate 2.00 GiB. "
                 "GPU 0 has a total capacity of 79.11 GiB of which 1.06 GiB is free.", "INFO:root:micro-batch size set to 8"],
          stream="stderr")
    s.truth.why = "the program caught a CUDA OOM while probing its batch size, and completed"
    return s


def xid79_in_teardown(w: World) -> Scene:
    """Rank N's exception ends the job; minutes later, during teardown, another node's GPU falls
    off the bus. The cause is the exception; that node still must not take the next job."""
    s = user_traceback(w)
    # torchrun's timed line is what orders the exception before the Xid (the traceback has no time)
    s.slurm_says(s.t_fail + w.secs(0.5, 2), fmt_job.torchrun_failed(w, s.t_fail, s.truth.ranks[0]))
    other = w.any_node(s.truth.nodes)
    r = w.ranks_on(other)[0]
    # inside srun's kill window (KillWait 30 s + 2), when the peers are being torn down
    s.klog(other, s.end - w.secs(5, 30), fk.xid(w, w.gpu_of(r), 79, "GPU has fallen off the bus.", w.pids[r]))
    s.protect_kernel.add(other)
    s.truth.drain = [other]
    s.truth.why = "an Xid 79 during teardown, after the rank's exception: not the cause, but its node drains (issue 12 item 7)"
    return s


def xid_echo_in_output(w: World) -> Scene:
    """The job script runs `dmesg -T | grep Xid` at start: an old Xid reaches the job's output
    (untrusted), while the node's kernel log for the job's window has none."""
    s = user_traceback(w)
    t = w.start - timedelta(minutes=w.rng.randint(60, 600))
    s.say(w.start + timedelta(seconds=2), None,
          f"[{t:%a %b} {t.day:2d} {t:%H:%M:%S %Y}] " + fk.xid(w, w.rng.choice(["0000:3a:00", "0000:9a:00"]), 79, "GPU has fallen off the bus.", 4242))
    s.truth.why = "an old Xid line echoed by the job script into its output is no kernel evidence: no drain"
    return s


CLASSES = {
    "nm_xid79_in_teardown": ("user_error", xid79_in_teardown),
    "nm_xid_echo_in_output": ("user_error", xid_echo_in_output),
    "nm_fr_healthy_dump": ("user_error", fr_healthy_dump),
    "nm_stacks_all_in_collective": ("comm_hang", stacks_all_in_collective),
    "nm_cuda_oom_recovered": ("none", cuda_oom_recovered),
    "nm_corrected_ecc_traceback": ("user_error", corrected_ecc_then_traceback),
    "nm_xid_before_job": ("user_error", xid_before_job),
    "nm_time_limit_words": ("none|user_error", time_limit_words),
    "nm_ib_flap_recovered": ("user_error", ib_flap_recovered),
    "nm_aer_corrected_oom": ("cuda_oom", aer_corrected_then_oom),
    "nm_sxid_nonfatal_time_limit": ("time_limit", sxid_nonfatal_time_limit),
    "nm_xid45_at_cancel": ("cancelled", xid45_at_cancel),
    "nm_oom_other_job": ("user_error", oom_other_job),
    "nm_memory_warning": ("user_error", memory_warning_traceback),
    "nm_killed_word_cancel": ("cancelled", killed_word_cancel),
    "nm_completed_caught_errors": ("none", completed_with_caught_errors),
    "nm_completed_loss_scale_skips": ("none", completed_loss_scale_skips),
    "nm_completed_nfs_recovered": ("none", completed_nfs_recovered),
}
