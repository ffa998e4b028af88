"""Spool bytes one hostile job makes root write (issue 11): sparse 2 GiB FR dumps, 1 GiB probe and
NCCL files. The node collector of this checkout against its peer, the collector as it was
before issue 11 (commit 3386f2a, `git show 3386f2a:slurm_attr/collect/node.py`; another with
SATTR_BENCH_PEER=REV), on the same evidence dir in the same run.

    python bench/bench_spool_hostile.py
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from slurm_attr.collect import node as node_now  # noqa: E402
from slurm_attr.config import Config  # noqa: E402


PEER = os.environ.get("SATTR_BENCH_PEER", "3386f2a")


def head_module():
    src = subprocess.run(["git", "-C", REPO, "show", f"{PEER}:slurm_attr/collect/node.py"], capture_output=True,
                         text=True, check=True).stdout
    d = tempfile.mkdtemp(prefix="sattr-bench-")
    path = os.path.join(d, "node_head.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("slurm_attr.collect.node_head", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod, d


def hostile_job(root: str, job: str) -> None:
    d = os.path.join(root, job)
    for k in ("fr", "probe", "nccl"):
        os.makedirs(os.path.join(d, k), exist_ok=True)
    for r in range(4):
        with open(os.path.join(d, "fr", f"nccl_trace_rank_{r}"), "wb") as f:
            f.truncate(2 << 30)
    for rel in ("probe/rank0.probe", "nccl/nccl.n1.1.log"):
        with open(os.path.join(d, rel), "wb") as f:
            f.truncate(1 << 30)


def allocated(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.lstat(os.path.join(root, f)).st_blocks * 512 for f in files)
    return total


def run(mod, base: str, label: str) -> tuple[int, float]:
    cfg = Config()
    cfg.paths.evidence_root = os.path.join(base, f"ev-{label}")
    cfg.paths.spool = os.path.join(base, f"spool-{label}")
    cfg.collect.kernel_source = "file"
    cfg.collect.kernel_file = os.path.join(base, "kern.log")
    open(cfg.collect.kernel_file, "w").close()
    os.makedirs(cfg.paths.evidence_root)
    hostile_job(cfg.paths.evidence_root, "4242")
    t0 = time.monotonic()
    mod.collect_node(cfg, mod.NodeJob(job_id="4242", node="n1", bundle_key="4242"))
    return allocated(cfg.paths.spool), time.monotonic() - t0


def main() -> None:
    head, tmpd = head_module()
    base = tempfile.mkdtemp(prefix="sattr-bench-spool-")
    try:
        before, t_before = run(head, base, "head")
        shutil.rmtree(os.path.join(base, "spool-head"))
        after, t_after = run(node_now, base, "now")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(tmpd, ignore_errors=True)
    mib = 1 << 20
    print(f"hostile job, one node: the collector at {PEER} wrote {before / mib:.1f} MiB in {t_before:.2f}s; "
          f"this checkout {after / mib:.3f} MiB in {t_after:.2f}s "
          f"(ratio {after / before if before else 0:.5f} of its bytes)")


if __name__ == "__main__":
    main()
