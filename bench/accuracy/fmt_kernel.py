"""Kernel-log line formats: the prefixes journalctl -k and dmesg -T print, the background
noise of a healthy GPU node, and the hardware families of shared/research/failure-signals.md.

Every message here is a format the kernel or a driver prints (sources: failure-signals.md
§2-4, NVIDIA's open-gpu-kernel-modules comments for Xid 94/95, the Linux mce/EDAC/AER/OOM
printk formats); numbers, ids and addresses are drawn per case.
"""
from __future__ import annotations

from datetime import datetime

from .world import HCAS, World


def prefix(fmt: str, t: datetime, host: str) -> str:
    """The leading timestamp (and host) of one kernel line in the node's log format."""
    if fmt == "journal":  # journalctl -k (short): "May 02 10:00:04 host kernel: "
        return f"{t:%b %d %H:%M:%S} {host} kernel: "
    if fmt == "dmesg_t":  # dmesg -T: "[Thu May  2 10:00:04 2024] "
        return f"[{t:%a %b} {t.day:2d} {t:%H:%M:%S %Y}] "
    if fmt == "iso":  # journalctl -k -o short-iso-precise
        return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond:06d}+0000 {host} kernel: "
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond:06d}+00:00 {host} kernel: "


def xid(w: World, bdf: str, code: int, text: str, pid: int | None = None, comm: str = "python") -> str:
    """An Xid line in the shape this world's driver prints (failure-signals §3.1)."""
    bus = f"PCI:{bdf}" if w.xid_pci else bdf
    if code == 154:  # the recovery-action line carries no process
        return f"NVRM: Xid ({bus}): {code}, {text}"
    who = {"pid": f"pid={pid}, name={comm}, " if pid else "pid='<unknown>', name=<unknown>, ",
           "angle": f"pid={pid}, name={comm}, " if pid else "pid=<unknown>, name=<unknown>, ",
           "none": ""}[w.xid_who]
    return f"NVRM: Xid ({bus}): {code}, {who}{text}"


def noise(w: World, host: str) -> list[str]:
    """Benign lines of a healthy GPU node (boot leftovers, audit, perf, link-up, NFS OK)."""
    r = w.rng
    hca_bdf, hca = r.choice(HCAS)
    pid = r.randint(300, 90_000)
    lines = [
        "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
        f"mlx5_core {hca_bdf} {hca}: Port: 1 Link ACTIVE",
        f'audit: type=1400 audit({r.randint(1_600_000_000, 1_760_000_000)}.{r.randint(100, 999)}:{r.randint(10, 999)}): '
        f'apparmor="DENIED" operation="open" profile="snap.cups" name="/proc/{pid}/mounts" pid={pid} comm="cupsd" '
        'requested_mask="r" denied_mask="r" fsuid=0 ouid=0',
        f"perf: interrupt took too long ({r.randint(2501, 4000)} > 2500), lowering kernel.perf_event_max_sample_rate to 79750",
        f"kauditd_printk_skb: {r.randint(2, 40)} callbacks suppressed",
        "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
        f"nfs: server nfs{r.randint(1, 4):02d}.cluster OK",
        f"TCP: request_sock_TCP: Possible SYN flooding on port {r.choice([29500, 29400, 6000])}. Sending cookies.  Check SNMP counters.",
        f"workqueue: ib_cache_event_task [ib_core] hogged CPU for >10000us {r.randint(4, 64)} times, consider switching to WQ_UNBOUND",
        "nvidia_uvm: module uses symbols nvUvmInterfaceDisableAccessCntr from proprietary module nvidia, inheriting taint.",
        f"NVRM: GPU at PCI:{r.choice(['0000:18:00', '0000:9a:00'])}: GPU-{r.getrandbits(32):08x}-{r.getrandbits(16):04x}-4b1d-9a7e-{r.getrandbits(48):012x}",
        f"systemd-journald[{pid}]: Data hash table of /run/log/journal/{r.getrandbits(64):016x}/system.journal has a fill level at 75.0 "
        "(1535 of 2047 items, 1048576 file size, 683 bytes per hash table item), suggesting rotation.",
        "device ib0 entered promiscuous mode",
        f"nvidia-nvswitch{r.randint(0, 3)}: open (major=509)",
    ]
    return r.sample(lines, r.randint(4, len(lines)))


# -- scary but harmless -----------------------------------------------------------------
def edac_ce(w: World) -> str:
    r = w.rng
    return (f"EDAC MC{r.randint(0, 1)}: 1 CE memory read error on CPU_SrcID#{r.randint(0, 1)}_MC#0_Chan#{r.randint(0, 3)}_DIMM#0 "
            f"(channel:{r.randint(0, 3)} slot:0 page:0x{r.getrandbits(20):x} offset:0x0 grain:32 syndrome:0x0)")


def aer_corrected(w: World) -> list[str]:
    port = w.rng.choice(["0000:17:01.0", "0000:3a:00.0", "0000:97:02.0"])
    return [f"pcieport {port}: AER: Corrected error received: {port}",
            f"pcieport {port}: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
            f"pcieport {port}:   device [8086:347a] error status/mask=00000001/00002000",
            f"pcieport {port}:    [ 0] RxErr                  (First)"]


def link(hca: tuple[str, str], state: str) -> str:
    return f"mlx5_core {hca[0]} {hca[1]}: Port: 1 Link {state}"


# -- hardware families ------------------------------------------------------------------
def mce_memory_failure(w: World, pid: int) -> list[str]:
    r = w.rng
    page = r.getrandbits(24)
    return ["mce: [Hardware Error]: Machine check events logged",
            f"mce: Uncorrected hardware memory error in user-access at {page:x}000",
            w.pick([f"Memory failure: 0x{page:x}: Killing python:{pid} due to hardware memory corruption"],
                   [f"Memory failure: 0x{page:x}: Sending SIGBUS to python:{pid} due to hardware memory corruption"]),
            f"Memory failure: 0x{page:x}: recovery action for dirty LRU page: Recovered"]


def mce_fatal(w: World) -> list[str]:
    r = w.rng
    cpu = r.randint(0, 111)
    return [f"mce: [Hardware Error]: CPU {cpu}: Machine Check Exception: 5 Bank {r.randint(1, 20)}: b2000000{r.getrandbits(32):08x}",
            f"mce: [Hardware Error]: RIP !INEXACT! 10:<ffffffff{r.getrandbits(32):08x}> {{intel_idle+0x87/0x130}}",
            f"mce: [Hardware Error]: TSC 0 ADDR {r.getrandbits(36):x} MISC 86",
            f"mce: [Hardware Error]: PROCESSOR 0:806f8 TIME {r.randint(1_600_000_000, 1_760_000_000)} SOCKET {cpu // 56} APIC {r.randint(0, 200)} microcode 2b000461",
            "mce: [Hardware Error]: Run the above through 'mcelog --ascii'"]


def edac_ue(w: World) -> list[str]:
    r = w.rng
    mc, ch = r.randint(0, 3), r.randint(0, 3)
    return ["mce: [Hardware Error]: Machine check events logged",
            f"EDAC skx MC{mc}: HANDLING MCE MEMORY ERROR",
            f"EDAC MC{mc}: 1 UE memory read error on CPU_SrcID#{mc // 2}_MC#{mc % 2}_Chan#{ch}_DIMM#0 (channel:{ch} slot:0 "
            f"page:0x{r.getrandbits(24):x} offset:0x0 grain:32 - err_code:0x0000:0x0090 SystemAddress:0x{r.getrandbits(36):x} "
            "ProcessorSocketId:0x0 MemoryControllerId:0x0 ChannelAddress:0x0 ChannelId:0x0 RankAddress:0x0 PhysicalRankId:0x0 "
            "DimmSlotId:0x0 Row:0x0 Column:0x0 Bank:0x0 BankGroup:0x0 ChipSelect:0x0 ChipId:0x0)"]


def aer_fatal(w: World, port: str, dev: str) -> list[str]:
    return [f"pcieport {port}: AER: Uncorrected (Fatal) error received: {dev}",
            f"pcieport {port}: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
            f"pcieport {port}:   device [8086:347a] error status/mask=00004000/00000000",
            f"pcieport {port}:    [14] CmpltTO                (First)",
            f"mlx5_core {dev}: mlx5_pci_err_detected Device state = 2 health sensors: 1 pci_status: 0. Exit, result = 4, need reset"]


def sxid_fatal(w: World) -> list[str]:
    r = w.rng
    sw, link_no = r.randint(0, 3), r.randint(0, 63)
    code, text = r.choice([(20034, "LTSSM Fault Up"), (20009, "RX Short Error Rate")])  # DLPL errors NVSwitch reports Fatal
    bdf = r.choice(["0000:c6:00.0", "0000:c7:00.0", "0000:86:00.0"])
    head = f"nvidia-nvswitch{sw}: SXid (PCI:{bdf}): {code}"
    return [f"{head}, Fatal, Link {link_no:02d} {text}",
            f"{head}, Severity 5 Engine instance {link_no:02d} Sub-engine instance 00",
            f"{head}, Data {{0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}}"]


def oom_kill(w: World, pid: int, job_id: str, uid: int, task: int, step: str = "0") -> list[str]:
    """The kernel's OOM-killer block for a task of a Slurm cgroup (v1 or v2 paths)."""
    r = w.rng
    if w.pick([True], [False]):
        memcg = f"/slurm/uid_{uid}/job_{job_id}"
        task_cg = f"{memcg}/step_{step}/task_{task}"
    else:  # cgroup v2 under slurmstepd.scope
        memcg = f"/system.slice/slurmstepd.scope/job_{job_id}"
        task_cg = f"{memcg}/step_{step}/user/task_{task}"
    vm, rss = r.randint(80, 900) * 1_000_000, r.randint(60, 500) * 1_000_000
    killed = w.pick([f"Memory cgroup out of memory: Killed process {pid} (python)"], [f"Out of memory: Killed process {pid} (python)"])
    return ["python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
            f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,oom_memcg={memcg},"
            f"task_memcg={task_cg},task=python,pid={pid},uid={uid}",
            f"{killed} total-vm:{vm}kB, anon-rss:{rss}kB, file-rss:{r.randint(0, 90_000)}kB, shmem-rss:0kB, UID:{uid} "
            f"pgtables:{r.randint(1000, 900_000)}kB oom_score_adj:0",
            f"oom_reaper: reaped process {pid} (python), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB"]


def hung_task(pid: int, comm: str = "python") -> list[str]:
    return [f"INFO: task {comm}:{pid} blocked for more than 122 seconds.",
            "      Tainted: P           OE     5.15.0-105-generic #115-Ubuntu",
            '"echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.']
