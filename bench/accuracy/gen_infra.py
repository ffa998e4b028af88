"""Infrastructure and end states: shared-filesystem failures (at start-up and mid-run),
launch failures (container, prolog, fabric manager not ready, MPI plugin), a completed job with
scary-but-harmless noise, and a failed job that left no evidence.

Filesystem lines: NFS/Lustre kernel messages and the errno strings Python prints (§4); launch:
pyxis/enroot, Slurm prolog, CUDA 802, srun's MPI plugin errors (§3.5, §7).
"""
from __future__ import annotations

from datetime import timedelta

from . import fmt_job, fmt_kernel as fk
from .scene import Scene
from .world import HCAS, World

LUSTRE_OSC = "scratch-OST0004-osc-ffff9a5c6b2e0800"


def _fs_kernel(w: World, pid: int) -> list[str]:
    nid = f"10.{w.rng.randint(0, 40)}.0.{w.rng.randint(2, 9)}@o2ib"
    return w.pick([
        [f"nfs: server nfs0{w.rng.randint(1, 4)}.cluster not responding, still trying"] + fk.hung_task(pid),
        [f"LustreError: 11-0: {LUSTRE_OSC}: operation ost_read to node {nid} failed: rc = -107",
         f"Lustre: {LUSTRE_OSC}: Connection to scratch-OST0004 (at {nid}) was lost; in progress operations using this service "
         "will wait for recovery to complete"]],
        [[f"Lustre: 2451:0:(client.c:2133:ptlrpc_expire_one_request()) @@@ Request sent has failed due to network error: "
          f"[sent {w.rng.randint(1_600_000_000, 1_760_000_000)}/real 0]  req@ffff9a5c6b2e0800 x1780000000000/t0(0) "
          f"o4->{LUSTRE_OSC}@{nid}:6/4 lens 488/448 e 0 to 1 dl 0 ref 2 fl Rpc:eXQr/0/ffffffff rc 0/-1 job:'python.{w.job_id}'"]])


def _fs_failure(w: World, early: bool) -> Scene:
    s = Scene(w)
    t = w.start + (w.secs(15, 90) if early else w.secs(1800, 6 * 3600))
    s.training(t)
    victims = sorted(w.rng.sample(sorted(w.ranks), min(len(w.ranks), w.rng.randint(1, 4))))
    if early:
        last = w.pick(["ImportError: /shared/sw/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so: cannot read file data: Input/output error",
                       "OSError: [Errno 5] Input/output error: '/lustre/scratch/alice/data/shard-00012.bin'"],
                      ["OSError: [Errno 116] Stale file handle: '/shared/home/alice/train/config.yaml'"])
    else:
        last = w.pick([f"OSError: [Errno 116] Stale file handle: '/shared/ckpt/step_{w.rng.randint(1, 90) * 1000}/model_rank{victims[0]}.pt'",
                       "OSError: Caught OSError in DataLoader worker process 3.\nOriginal Traceback (most recent call last):\n"
                       '  File "/home/alice/train/data.py", line 61, in __getitem__\n    with open(self.paths[i], "rb") as f:\n'
                       "OSError: [Errno 5] Input/output error"],
                      ["OSError: [Errno 107] Transport endpoint is not connected: '/gpfs/data/laion/shard-00412.tar'"])
    for r in victims:
        s.say(t + w.secs(0, 2), r, fmt_job.trace_head(fmt_job.TRAIN_FRAMES) + last.split("\n"), stream="stderr")
    for node in sorted({w.ranks[r] for r in victims}):
        if w.chance(0.7):
            s.klog(node, t - w.secs(1, 60), _fs_kernel(w, w.pids[victims[0]]))
    s.protect_out = True
    end = s.cascade(t, victims)
    s.finish(end, "FAILED", 1)
    s.expect("filesystem", why="the shared filesystem failed under the job (" + ("start-up" if early else "mid-run") + ")")
    return s


def fs_startup(w: World) -> Scene:
    return _fs_failure(w, True)


def fs_midrun(w: World) -> Scene:
    return _fs_failure(w, False)


def _launch(w: World, lines: list[str], why: str, node: str | None = None, per_rank: bool = False,
            what: str = "Exited with exit code 1") -> Scene:
    s = Scene(w)
    t = w.start + w.secs(2, 40)
    if per_rank and node:
        for r in w.ranks_on(node):
            s.say(t, r, lines, stream="stderr")
    else:
        s.slurm_says(t, lines)
    s.protect_out = True
    s.teardown(t + w.secs(1, 3), w.ranks_on(node) if node else [0], what)
    s.finish(t + w.secs(5, 40), "FAILED", 1)
    s.expect("launch_failure", [node] if node else [], [], [], why)
    return s


def launch_container(w: World) -> Scene:
    n = w.short(w.nodes[0])
    lines = w.pick([["slurmstepd: error: pyxis: container start failed with error code: 1",
                     "slurmstepd: error: pyxis: printing enroot log file:",
                     "slurmstepd: error: pyxis:     [ERROR] /etc/enroot/hooks.d/98-nvidia.sh exited with return code 1",
                     "slurmstepd: error: pyxis: couldn't start container",
                     "slurmstepd: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1",
                     "slurmstepd: error: Failed to invoke spank plugin stack"]],
                   [["FATAL:   container creation failed: mount /proc/self/fd/3->/var/apptainer/mnt/session/rootfs error: while mounting "
                     "image /proc/self/fd/3: failed to find loop device: could not attach image file to loop device: no loop devices available"],
                    [f"slurmstepd-{n}: error: pyxis: couldn't start container",
                     f"slurmstepd-{n}: error: spank: required plugin spank_pyxis.so: task_init() failed with rc=-1"]])
    return _launch(w, lines, "the container runtime could not start the job's container")


def launch_prolog(w: World) -> Scene:
    bad = w.any_node()
    s = _launch(w, [f"srun: error: Task launch for StepId={w.job_id}.0 failed on node {bad}: Job prolog failed"],
                "the prolog failed on one node", node=bad, what="")
    s.ctld(w.start + timedelta(seconds=2), f"error: [job {w.job_id}] prolog failed status=1:0", daemon=f"slurmd-{w.short(bad)}")
    return s


def launch_fm_not_ready(w: World) -> Scene:
    bad = w.any_node()
    lines = fmt_job.trace_head(fmt_job.TRAIN_FRAMES[:1]) + [
        w.pick(["RuntimeError: CUDA error: system not yet initialized"],
               ["RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
                "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized"])]
    return _launch(w, lines, "the node's fabric manager was not running: CUDA 802 on every rank there", node=bad, per_rank=True)


def launch_mpi(w: World) -> Scene:
    plug = w.pick(["pmix_v4", "pmix"], ["pmi2"])
    return _launch(w, [f"srun: error: Couldn't find the specified plugin name for mpi/{plug} looking at all files",
                       f"srun: error: cannot find mpi plugin for mpi/{plug}",
                       f"srun: error: MPI: Cannot create context for mpi/{plug}",
                       "srun: error: MPI: Unable to load any plugin"], "srun's MPI plugin is not installed")


def completed(w: World) -> Scene:
    """A job that ran to the end and exited 0."""
    s = Scene(w)
    end = w.start + w.secs(1800, 10 * 3600)
    s.training(end - timedelta(seconds=20))
    s.t_fail = end
    s.say(end - timedelta(seconds=5), 0, "Training complete.")
    s.finish(end, "COMPLETED", 0, 0)
    s.expect("none", why="the job completed")
    return s


def completed_noisy(w: World) -> Scene:
    """A job that finished, with the noise that scares people: corrected ECC and AER, a link
    flap that came back, a pending row remap, memory-limit and loss-scale warnings."""
    s = completed(w)
    end = s.t_fail
    for _ in range(w.rng.randint(2, 4)):
        node, t = w.any_node(), w.start + w.secs(60, (end - w.start).total_seconds() - 60)
        kind = w.rng.choice(["ce", "aer", "flap", "remap", "oom_warn", "overflow"])
        if kind == "ce":
            s.klog(node, t, [fk.edac_ce(w) for _ in range(w.rng.randint(1, 5))])
        elif kind == "aer":
            s.klog(node, t, fk.aer_corrected(w))
        elif kind == "flap":
            hca = w.rng.choice(HCAS)
            s.klog(node, t, fk.link(hca, "DOWN"))
            s.klog(node, t + w.secs(2, 20), fk.link(hca, "ACTIVE"))
        elif kind == "remap":
            s.klog(node, t, fk.xid(w, w.gpu_of(w.ranks_on(node)[0]), 63, "Row Remapper: New row (0x000000000001e6a4) Marked for Remapping, reset gpu to activate."))
        elif kind == "oom_warn":
            s.slurm_says(end, "slurmstepd: error: Exceeded job memory limit at some point.")
        else:
            s.say(t, 0, "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768")
    s.truth.why = "the job completed; corrected errors and a recovered flap are not a failure"
    return s


def unknown_no_evidence(w: World) -> Scene:
    """FAILED with an exit code and nothing that says why: no output collected, clean or missing
    kernel logs. (Progress lines and then a silent non-zero exit is left out: with complete
    coverage, "the program exited on its own" is a defensible answer too.)"""
    s = Scene(w)
    end = w.start + w.secs(300, 5 * 3600)
    for n in w.nodes:
        if w.chance(0.3):
            s.absent.add(n)
    s.finish(end, "FAILED", w.rng.choice([1, 2, 255]), 0)
    s.expect("unknown", why="failed with no evidence of why: the verdict must not guess")
    return s


CLASSES = {
    "fs_startup": ("filesystem", fs_startup),
    "fs_midrun": ("filesystem", fs_midrun),
    "launch_container": ("launch_failure", launch_container),
    "launch_prolog": ("launch_failure", launch_prolog),
    "launch_fm_not_ready": ("launch_failure", launch_fm_not_ready),
    "launch_mpi_plugin": ("launch_failure", launch_mpi),
    "completed_noisy": ("none", completed_noisy),
    "unknown_no_evidence": ("unknown", unknown_no_evidence),
}
