"""Hardware classes: GPU (Xid families), NVLink/NVSwitch/fabric manager, host (MCE, EDAC, AER).

Each fault sits in one node's trusted kernel log (or a root unit's journal); the job's output
shows the rank on that GPU failing, and the healthy ranks cascade (watchdog timeouts, NCCL
socket errors naming the dead peer, srun teardown). Drain expectations follow NVIDIA's Xid
catalog as failure-signals.md §2 summarises it (reset/reboot/drain rows), never the rules.
"""
from __future__ import annotations

from datetime import datetime
from typing import Callable

from . import fmt_job, fmt_kernel as fk
from .scene import Scene
from .world import HCAS, World

ADVICE = ["CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
          "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
          "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."]


def _cuda_failure(s: Scene, t: datetime, rank: int, msg: str) -> None:
    """The rank on the broken GPU: a traceback ending in the CUDA error, then torch's advice."""
    frames = fmt_job.TRAIN_FRAMES + [("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1532,
                                      "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)")]
    s.say(t, rank, fmt_job.traceback(frames, f"RuntimeError: CUDA error: {msg}") + ADVICE, stream="stderr")


Lines = Callable[[str, int], list[str]]  # (the GPU's short BDF, the pid using it) -> kernel lines


def gpu_fault(w: World, lines: Lines, cuda_msg: str | None, drain: bool, cause: str = "gpu_hardware",
              why: str = "", extra_ranks: int = 0) -> Scene:
    """One GPU of one node fails mid-training with ``lines`` in its kernel log."""
    s = Scene(w)
    node = w.any_node()
    rank = w.any_rank(node)
    t = w.start + w.secs(600, 6 * 3600)
    s.training(t)
    s.klog(node, t, lines(w.gpu_of(rank), w.pids[rank]))
    s.protect_kernel.add(node)
    if w.chance(0.5):  # the driver's cleanup of the channels the dead context held
        s.klog(node, t + w.secs(1, 4), fk.xid(w, w.gpu_of(rank), 45, "Ch 00000010", w.pids[rank]))
    ranks = [rank] + [r for r in w.ranks_on(node) if r != rank][:extra_ranks]
    if cuda_msg:
        for r in ranks:
            _cuda_failure(s, t + w.secs(0.2, 3), r, cuda_msg)
    end = s.cascade(t, ranks)
    s.finish(end, "FAILED", 1)
    s.expect(cause, [node], ranks if cuda_msg else [], [node] if drain else [], why)
    return s


def gpu_xid79(w: World) -> Scene:
    def lines(bdf: str, pid: int) -> list[str]:
        out = [fk.xid(w, bdf, 79, "GPU has fallen off the bus.", pid)]
        if w.chance(0.6):
            out.append(f"NVRM: GPU {bdf}.0: GPU has fallen off the bus.")
        if w.chance(0.5):
            out.append(fk.xid(w, bdf, 154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"))
        return out
    msg = w.pick(["unknown error"], ["unspecified launch failure"])
    return gpu_fault(w, lines, msg, True, why="Xid 79: the GPU fell off the bus (RESTART_BM)")


def gpu_offbus_block(w: World) -> Scene:
    def lines(bdf: str, pid: int) -> list[str]:
        return [f"NVRM: The NVIDIA GPU {bdf}.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\n"
                "NVRM: fallen off the bus and is not responding to commands."]
    return gpu_fault(w, lines, "unknown error", True,
                     why="fallen off the bus without an Xid line (newer drivers' 3-line block, section 3.2)")


def _dbe(w: World, bdf: str, pid: int | None) -> str:
    part = w.rng.randint(0, 11)
    text = w.pick([f"An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition {part}, subpartition 0."],
                  [f"Ch 00000010, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition {part}, subpartition 1."])
    return fk.xid(w, bdf, 48, text, pid)


def gpu_xid48_dbe(w: World) -> Scene:
    def lines(bdf: str, pid: int) -> list[str]:
        out = [_dbe(w, bdf, pid)]
        if w.chance(0.5):
            out.append(fk.xid(w, bdf, 63, f"Row Remapper: New row (0x{w.rng.getrandbits(40):016x}) Marked for Remapping, reset gpu to activate."))
        if w.chance(0.4):
            out.append(fk.xid(w, bdf, 154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"))
        return out
    return gpu_fault(w, lines, "uncorrectable ECC error encountered", True, why="Xid 48: double-bit ECC error (WORKFLOW_XID_48)")


def gpu_xid64_remap(w: World) -> Scene:
    def lines(bdf: str, pid: int) -> list[str]:
        return [_dbe(w, bdf, None),
                fk.xid(w, bdf, 64, f"Row Remapper: Failed to mark row (0x{w.rng.getrandbits(40):016x}) for remapping", pid)]
    return gpu_fault(w, lines, "uncorrectable ECC error encountered", True, why="Xid 64: row remapping failed (RMA path)")


def gpu_xid95(w: World) -> Scene:
    unit = w.pick(["Uncontained: FBHUB. RST: Yes, D-RST: No"], ["Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No"])

    def lines(bdf: str, pid: int) -> list[str]:
        out = [fk.xid(w, bdf, 95, unit, pid)]
        if w.chance(0.5):
            out.append(fk.xid(w, bdf, 154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"))
        return out
    return gpu_fault(w, lines, "uncorrectable ECC error encountered", True, why="Xid 95: uncontained memory error (RESET_GPU)")


def gpu_xid94_contained(w: World) -> Scene:
    unit = w.pick(["Contained: SM (0x1). RST: No, D-RST: No"], ["Contained: CE User Channel (0x9). RST: No, D-RST: No"])
    return gpu_fault(w, lambda bdf, pid: [fk.xid(w, bdf, 94, unit, pid)], "uncorrectable ECC error encountered", False,
                     why="Xid 94: contained memory error: the app restarts, the GPU stays in service (RESTART_APP)")


def gpu_xid119_gsp(w: World) -> Scene:
    def lines(bdf: str, pid: int) -> list[str]:
        out = [fk.xid(w, bdf, 119, f"Timeout after {w.rng.choice([6, 45])}s of waiting for RPC response from GPU{w.rng.randint(0, 7)} GSP! "
                      f"Expected function {w.rng.choice([76, 10])} (GSP_RM_CONTROL) (0x20802a02 0x8).", pid)
               for _ in range(w.rng.randint(1, 3))]
        if w.chance(0.5):
            out.append(fk.xid(w, bdf, 154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"))
        return out
    msg = "unspecified launch failure" if w.chance(0.5) else None  # or the rank just hangs
    return gpu_fault(w, lines, msg, True, why="Xid 119: GSP RPC timeout (RESET_GPU)")


# -- NVLink ------------------------------------------------------------------------------
NVLINK_MSG = "uncorrectable NVLink error detected during the execution"


def nvlink_xid74(w: World) -> Scene:
    bit = w.rng.choice([0x100, 0x200, 0x1000, 0x10000, 0x20000, 0x1000000, 0x10000000])  # "possible hardware" bits
    link_no = w.rng.randint(0, 17)
    hopper = w.pick([True], [False])

    def lines(bdf: str, pid: int) -> list[str]:
        if hopper:
            regs = f"0x{bit:x}, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0"
            return [fk.xid(w, bdf, 74, f"NVLink: fatal error detected on link {link_no}({regs})", pid)]
        # NVLink5 (Blackwell) grammar, a Fatal link event
        return [fk.xid(w, bdf, 149, f"NETIR_LINK_EVT Fatal XC0 i0 Link {link_no:02d} (0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")]
    return gpu_fault(w, lines, NVLINK_MSG, True, cause="nvlink",
                     why="a fatal NVLink error in the node's kernel log confirms the rank's NVLink error (issue 22)")


def nvlink_sxid(w: World) -> Scene:
    return gpu_fault(w, lambda bdf, pid: fk.sxid_fatal(w), NVLINK_MSG, True, cause="nvlink",
                     why="NVSwitch SXid Fatal on the node", extra_ranks=w.rng.randint(0, 2))


def nvlink_fabric_manager(w: World) -> Scene:
    s = gpu_fault(w, lambda bdf, pid: [], NVLINK_MSG, True, cause="nvlink",
                  why="the fabric manager (a root unit: trusted journal) reports an NVSwitch fatal error")
    node = s.truth.nodes[0]
    t = min((l.t for l in s.out if "NVLink" in l.text), default=w.start)
    s.jlog(node, t - w.secs(0.1, 1), f"nv-fabricmanager[{w.rng.randint(1500, 4000)}]",
           f"detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 0 port {w.rng.randint(0, 63)}")
    return s


# -- host --------------------------------------------------------------------------------
def host_fault(w: World, lines_for: Callable[[int], list[str]], what: str, why: str) -> Scene:
    """A host fault on one node kills the rank whose memory it hit (SIGBUS) or the node's NIC."""
    s = Scene(w)
    node = w.any_node()
    rank = w.any_rank(node)
    t = w.start + w.secs(600, 6 * 3600)
    s.training(t)
    s.klog(node, t, lines_for(rank))
    s.protect_kernel.add(node)
    end = s.cascade(t, [rank], what=what)
    s.finish(end, "FAILED", 1)
    s.expect("host_hardware", [node], [], [node], why)
    return s


def host_mce(w: World) -> Scene:
    return host_fault(w, lambda r: fk.mce_memory_failure(w, w.pids[r]), "Bus error",
                      "uncorrected memory error (MCE) killed the rank's process")


def host_edac_ue(w: World) -> Scene:
    def lines(r: int) -> list[str]:
        return fk.edac_ue(w) + (fk.mce_memory_failure(w, w.pids[r])[2:3] if w.chance(0.6) else [])
    return host_fault(w, lines, "Bus error", "EDAC uncorrectable memory error")


def host_aer_fatal(w: World) -> Scene:
    port, dev = w.rng.choice([("0000:17:01.0", HCAS[0][0]), ("0000:97:02.0", HCAS[4][0])])
    return host_fault(w, lambda r: fk.aer_fatal(w, port, dev), "Exited with exit code 1",
                      "fatal PCIe AER on the NIC's root port")


CLASSES = {
    "gpu_xid79": ("gpu_hardware", gpu_xid79),
    "gpu_offbus_block": ("gpu_hardware", gpu_offbus_block),
    "gpu_xid48_dbe": ("gpu_hardware", gpu_xid48_dbe),
    "gpu_xid64_remap": ("gpu_hardware", gpu_xid64_remap),
    "gpu_xid95_uncontained": ("gpu_hardware", gpu_xid95),
    "gpu_xid94_contained": ("gpu_hardware", gpu_xid94_contained),
    "gpu_xid119_gsp": ("gpu_hardware", gpu_xid119_gsp),
    "nvlink_xid74": ("nvlink", nvlink_xid74),
    "nvlink_sxid_fatal": ("nvlink", nvlink_sxid),
    "nvlink_fabric_manager": ("nvlink", nvlink_fabric_manager),
    "host_mce_memory": ("host_hardware", host_mce),
    "host_edac_ue": ("host_hardware", host_edac_ue),
    "host_pcie_aer_fatal": ("host_hardware", host_aer_fatal),
}
