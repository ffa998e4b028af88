"""Benchmark: rule extraction over a large mixed log corpus, against grep -E with the same patterns.

Not a test. Generates a corpus (kernel logs in journalctl/dmesg -T formats, training stdout with
rank prefixes and progress bars; mostly noise, some real failure lines) into a temporary
directory, then times

  1. slurm_attr extraction with the full catalog (each file read whole, as analyze() does), and
  2. `grep -E -c -f patterns` over the same files, the patterns being the catalog's regexes
     converted to POSIX ERE (first line of multi-line rules; lookarounds dropped),

and prints MB/s for both and the ratio.

With ``--corpus DIR`` it reads an evidence bundle instead (the shared workload: the bundle made by
``../shared/bench/gen_log_corpus.py``; its kernel logs, stdout and stderr, each whole), and also
times ``grep -E -c -f`` with the shared ``grep_patterns.txt`` (``--patterns``) in the same run.

    python bench/bench_rules.py [--mb 120] [--keep DIR]
    python bench/bench_rules.py --corpus /var/tmp/sattr-bench/corpus
"""
from __future__ import annotations

import argparse
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from slurm_attr.rules import load_catalog
from slurm_attr.rules.extract import extract_buffer

KERNEL_NOISE = [
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib{a}: link becomes ready",
    "audit: type=1400 audit({t}.{b}:{c}): apparmor=\"DENIED\" operation=\"open\" profile=\"snap.{w}\" name=\"/proc/{c}/mounts\" pid={c} comm=\"{w}\"",
    "mlx5_core 0000:{h}:00.0 mlx5_{a}: Port: 1 Link ACTIVE",
    "nvidia-nvswitch{a}: Link {b}: ACTIVE",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.{b}.05  Thu Aug 24 20:44:52 UTC 2023",
    "EXT4-fs (nvme0n1p{a}): mounted filesystem with ordered data mode. Quota mode: none.",
    "systemd[1]: Started Session {c} of User {w}.",
    "nfs: server nfs{a} OK",
    "perf: interrupt took too long ({c} > {b}), lowering kernel.perf_event_max_sample_rate to {c}",
    "pcieport 0000:{h}:02.0: AER: Corrected error received: 0000:{h}:00.0",
    "bond0: (slave enp{b}s0f0np0): link status definitely up, 100000 Mbps full duplex",
    "device-mapper: uevent: version 1.0.3",
    "Lustre: scratch-OST000{a}-osc-ffff9a5c6b2e0800: Connection restored to 10.0.{a}.{b}@o2ib (at 10.0.{a}.{b}@o2ib)",
    "kauditd_printk_skb: {b} callbacks suppressed",
    "nvidia-peermem: Nvidia peer memory module loaded, version {a}.{b}",
]
STDOUT_NOISE = [
    "[rank{r}]: step {c} | loss {f} | lr {f}e-4 | grad_norm {f} | tokens/s {c} | mem {b}.{a}GB",
    "{r}: iteration {c}/ 100000 | consumed samples: {c} | elapsed time per iteration (ms): {f} | learning rate: {f}E-05",
    "[rank{r}]: Epoch {a}:  {b}%|{bar}| {c}/{c} [01:{b}<02:{b},  {f}it/s, loss={f}]",
    "{r}: [2024-05-02 10:{b}:{b}] INFO train.py:{b} - saving checkpoint to /shared/ckpt/step_{c}",
    "[rank{r}]:[W502 10:{b}:{b}.{c} ProcessGroupNCCL.cpp:{c}] [PG ID 0 PG GUID 0(default_pg) Rank {r}] using GPU {a} to perform barrier",
    "{host}:{c}:{c} [{a}] NCCL INFO Channel {b}/32 :    0   1   2   3   4   5   6   7",
    "{host}:{c}:{c} [{a}] NCCL INFO comm 0x{x} rank {r} nranks 64 cudaDev {a} busId {h}000 - Init COMPLETE",
    "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:557: UserWarning: This DataLoader will create {b} worker processes in total.",
    "{r}: validation error rate {f} (best {f})",
]
HITS_KERNEL = [
    "NVRM: Xid (PCI:0000:{h}:00): 79, pid={c}, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:{h}:00): 13, pid={c}, name=python, Graphics SM Warp Exception on (GPC {a}, TPC {a}, SM 0): Out Of Range Address",
    "mlx5_core 0000:{h}:00.0 mlx5_{a}: Port: 1 Link DOWN",
    "Out of memory: Killed process {c} (python) total-vm:{c}kB, anon-rss:{c}kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:{c}kB oom_score_adj:0",
    "nfs: server nfs{a} not responding, still trying",
    "pcieport 0000:{h}:02.0: AER: Uncorrected (Fatal) error received: 0000:{h}:00.0",
]
HITS_STDOUT = [
    "[rank{r}]:[E0502 10:{b}:{b}.{c} ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={c}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600009 milliseconds before timing out.",
    "[rank{r}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.19.3",
    "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {a} has a total capacity of 79.11 GiB of which 1.02 GiB is free.",
    "slurmstepd: error: *** JOB {c} ON node{a} CANCELLED AT 2024-05-02T10:00:01 DUE TO TIME LIMIT ***",
    "{host}:{c}:{c} [{a}] NCCL WARN NET/IB : Got completion from peer 10.0.0.{b}<{c}> with status=12 opcode=0 len=0 vendor err 129 (Send)",
    "[rank{r}]: ValueError: Expected input batch_size ({b}) to match target batch_size ({a}).",
]


def _fill(template: str, rnd: random.Random) -> str:
    return template.format(
        a=rnd.randint(0, 9), b=rnd.randint(10, 99), c=rnd.randint(1000, 999999), f=f"{rnd.random() * 10:.4f}",
        h=f"{rnd.randint(0, 255):02x}", x=f"{rnd.getrandbits(48):012x}", r=rnd.randint(0, 63),
        w=rnd.choice(["firefox", "cups", "snapd", "slurmd", "munge"]), t=rnd.randint(1714000000, 1715000000),
        host=f"gpu-{rnd.randint(1, 64):03d}", bar="#" * rnd.randint(1, 9) + " " * rnd.randint(0, 9),
    )


def _kernel_prefix(rnd: random.Random, n: int) -> str:
    if n % 2:
        return f"May  2 10:{rnd.randint(10, 59)}:{rnd.randint(10, 59)} gpu-{rnd.randint(1, 64):03d} kernel: "
    return f"[Thu May  2 10:{rnd.randint(10, 59)}:{rnd.randint(10, 59)} 2024] "


def generate(root: str, total_mb: int, seed: int = 7) -> list[tuple[str, str]]:
    """Write the corpus; return (path, source) pairs. About 1 line in 2000 is a real failure line."""
    rnd = random.Random(seed)
    files: list[tuple[str, str]] = []
    per_file = 8 << 20
    n_files = max(2, (total_mb << 20) // per_file)
    for i in range(n_files):
        kernel = i % 2 == 0
        path = os.path.join(root, f"{'kernel' if kernel else 'stdout'}_{i:03d}.log")
        noise, hits = (KERNEL_NOISE, HITS_KERNEL) if kernel else (STDOUT_NOISE, HITS_STDOUT)
        size = 0
        lines = []
        while size < per_file:
            tpl = rnd.choice(hits) if rnd.random() < 0.0005 else rnd.choice(noise)
            line = (_kernel_prefix(rnd, len(lines)) if kernel else "") + _fill(tpl, rnd)
            lines.append(line)
            size += len(line) + 1
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        files.append((path, "kernel" if kernel else "stdout"))
    return files


_CLASS_MAP = {r"\d": "0-9", r"\s": "[:space:]", r"\w": "[:alnum:]_", r"\S": "[:graph:]", r"\n": ""}
_CLASS = re.compile(r"\[\^?\]?(?:\\.|[^\]\\])*\]")


def to_ere(pattern: str) -> str:
    """A Python regex as a POSIX ERE for grep -E: same shape and cost, good enough for timing.

    Multi-line rules keep their first line; lookarounds are dropped, lazy quantifiers made greedy,
    large counted repetitions unbounded, escapes spelled as POSIX classes.
    """
    out, depth, i = [], 0, 0
    while i < len(pattern):
        m = _CLASS.match(pattern, i)
        if m:  # a character class: translate its escapes, drop newlines (grep is line-based)
            body = m.group(0)
            neg = body.startswith("[^")
            inner = body[2 if neg else 1:-1]
            bracket = r"\]" in inner  # POSIX: a literal ] must come first in the class
            inner = inner.replace(r"\]", "")
            for py, posix in _CLASS_MAP.items():
                inner = inner.replace(py, posix)
            inner = ("]" if bracket else "") + inner.replace(r"\-", "-").replace(r"\[", "[")
            out.append("." if neg and not inner else ("[^" if neg else "[") + inner + "]")
            i = m.end()
            continue
        two = pattern[i:i + 2]
        if two == r"\n":
            break  # the rest matches later lines
        if pattern.startswith("(?P<", i):
            i = pattern.index(">", i) + 1
            out.append("(")
            depth += 1
            continue
        if pattern.startswith("(?:", i):
            out.append("(")
            depth += 1
            i += 3
            continue
        if two in ("(?=", "(?!") or pattern.startswith(("(?<=", "(?<!"), i):
            close = pattern.index(")", i)  # our rules keep lookarounds flat
            i = close + 1
            continue
        if two in (r"\d", r"\s", r"\S", r"\w", r"\W", r"\'"):
            out.append({r"\d": "[0-9]", r"\s": "[[:space:]]", r"\S": "[^[:space:]]", r"\w": "[[:alnum:]_]",
                        r"\W": "[^[:alnum:]_]", r"\'": "'"}[two])
            i += 2
            continue
        if pattern[i] == "\\":
            out.append(two)
            i += 2
            continue
        if pattern[i] in "*+?}" and pattern[i + 1:i + 2] == "?":
            out.append(pattern[i])  # lazy -> greedy
            i += 2
            continue
        if pattern[i] == "(":
            depth += 1
        elif pattern[i] == ")":
            depth -= 1
        out.append(pattern[i])
        i += 1
    text = "".join(out)
    # Bounds like {1,64} guard Python's backtracking matcher against hostile lines; grep's DFA
    # needs no guard and pays dearly for counted repetition, so it gets the unbounded form.
    text = re.sub(r"\{(\d+),(\d+)\}", lambda m: m.group(0) if int(m.group(2)) <= 8 else ("+" if m.group(1) != "0" else "*"), text)
    text = re.sub(r"\|\)", ")", text).rstrip("|")
    return text + ")" * max(depth, 0)


SHARED_PATTERNS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                                "bench", "grep_patterns.txt"))


def bundle_files(bundle: str) -> list[tuple[str, str]]:
    """(path, source) of an evidence bundle's kernel logs, stdout and stderr."""
    files = []
    nodes = os.path.join(bundle, "nodes")
    for node in sorted(os.listdir(nodes)) if os.path.isdir(nodes) else []:
        path = os.path.join(nodes, node, "kernel.log")
        if os.path.isfile(path):
            files.append((path, "kernel"))
    for name in ("stdout", "stderr"):
        path = os.path.join(bundle, "output", name)
        if os.path.isfile(path):
            files.append((path, name))
    return files


def run_grep(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one grep run."""
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "LC_ALL": "C"})
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode > 1:
        raise SystemExit(f"grep failed: {proc.stderr.strip()[:500]}")
    return wall, (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime), proc.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=120, help="corpus size in MB (default 120)")
    ap.add_argument("--keep", help="write the corpus here and keep it")
    ap.add_argument("--corpus", help="an evidence bundle to read instead of generating a corpus (the shared workload)")
    ap.add_argument("--patterns", default=SHARED_PATTERNS, help="grep -E patterns of the shared workload")
    args = ap.parse_args()
    catalog = load_catalog()
    root = args.keep or tempfile.mkdtemp(prefix="sattr-bench-")
    os.makedirs(root, exist_ok=True)
    try:
        t0 = time.perf_counter()
        files = bundle_files(args.corpus) if args.corpus else generate(root, args.mb)
        total = sum(os.path.getsize(p) for p, _ in files)
        print(f"corpus: {len(files)} files, {total / 1e6:.1f} MB in {args.corpus or root} "
              f"({'the shared bundle' if args.corpus else f'generated in {time.perf_counter() - t0:.1f} s'})")

        for p, _ in files:  # warm the page cache for both contenders
            with open(p, "rb") as f:
                f.read()
        # Wall time and CPU time: on a shared machine the CPU time is the steadier figure.
        t0, c0 = time.perf_counter(), time.process_time()
        found = 0
        for path, source in files:
            with open(path, "rb") as f:
                data = f.read()
            found += len(extract_buffer(catalog, source, None, path, data))
        ours, ours_cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"slurm_attr: {len(catalog.rules)} rules, {found} symptoms, {ours:.2f} s wall ({total / 1e6 / ours:.1f} MB/s), "
              f"{ours_cpu:.2f} s CPU ({total / 1e6 / ours_cpu:.1f} MB/s)")

        patterns = os.path.join(root, "patterns.ere")
        with open(patterns, "w") as f:
            f.write("\n".join(to_ere(r.regex.pattern) for r in catalog.rules) + "\n")
        cmd = ["grep", "-E", "-c", "-f", patterns] + [p for p, _ in files]
        t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        grep_s = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        grep_cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
        if proc.returncode > 1:
            print(f"grep failed: {proc.stderr.strip()[:500]}", file=sys.stderr)
            return 1
        lines = sum(int(x.rsplit(":", 1)[1]) for x in proc.stdout.split())
        print(f"grep -E -f ({len(catalog.rules)} patterns): {lines} matching lines, {grep_s:.2f} s wall "
              f"({total / 1e6 / grep_s:.1f} MB/s), {grep_cpu:.2f} s CPU ({total / 1e6 / grep_cpu:.1f} MB/s)")
        kw = os.path.join(root, "keywords.txt")
        with open(kw, "w") as f:
            f.write("\n".join(sorted({k.lower() for r in catalog.rules for k in r.keywords})) + "\n")
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["grep", "-F", "-i", "-c", "-f", kw] + [p for p, _ in files], capture_output=True, check=False)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        kw_cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
        print(f"(for reference, grep -F -i -f of the {len(catalog.rules)} rules' literal keywords only: {kw_cpu:.2f} s CPU, "
              f"{total / 1e6 / kw_cpu:.1f} MB/s)")
        print(f"ratio: slurm_attr takes {ours / grep_s:.2f}x grep -E's wall time, {ours_cpu / grep_cpu:.2f}x its CPU time "
              f"(goal: within 3x)")
        if args.corpus and os.path.isfile(args.patterns):
            sw, sc, _out = run_grep(["grep", "-E", "-c", "-f", args.patterns] + [p for p, _ in files])
            print(f"shared grep_patterns.txt (grep -E -c -f, LC_ALL=C): {sw:.2f} s wall, {sc:.2f} s CPU; "
                  f"slurm_attr extraction is {ours / sw:.2f}x its wall time, {ours_cpu / sc:.2f}x its CPU time")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
