"""One node on other software than the rest of the job: an infrastructure cause on the odd node.

Each node says which NVIDIA driver it runs (the kernel module's banner, or its
/proc/driver/nvidia/version read by the node collector: trusted) and which NCCL its processes
loaded (NCCL's own `NCCL version 2.21.5+cuda12.4` line: the job's word). When at least three
nodes report a version and every node but a few agrees on one, each node that differs is odd
(`infra.version_skew`, launch_failure, on that node):

- the job failed at launch on the odd node (a launch-failure root there: the driver refusing its
  user-space library, CUDA not initialising, ...): the skew is that failure's cause, a root. Kernel
  evidence for both (the node's version and its failure) drains the node: it will fail every job
  it gets (the policy's `drain_beyond_hardware`);
- otherwise the skew is said beside the verdict (the policy's `suspicions`) and decides nothing:
  sites upgrade drivers node by node, and mixed versions often work.

Two versions in two halves name no odd node; neither does one node's two versions (a reload).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Optional

from slurm_attr.model import Evidence, Symptom
from slurm_attr.rules.pyrule import JobRefiner, RefinerCase

SKEW = "infra.version_skew"
SOFTWARE = {"gpu.driver_version": "NVIDIA driver", "nccl.version": "NCCL"}
MIN_NODES = 3


def _versions(syms: list[Symptom], rule_id: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in syms:
        v = s.fields.get("value")
        if s.id == rule_id and s.node and isinstance(v, str) and not s.status.earlier:
            out.setdefault(s.node, set()).add(v)
    return out


def _odd(per_node: Mapping[str, set[str]]) -> tuple[Optional[str], list[str]]:
    """(the version the clear majority runs, the nodes on another one)."""
    single = {n: next(iter(v)) for n, v in per_node.items() if len(v) == 1}
    if len(single) < MIN_NODES:
        return None, []
    counts = Counter(single.values()).most_common()
    if len(counts) < 2:
        return None, []
    common, n_common = counts[0]
    odd = sorted(n for n, v in single.items() if v != common)
    if n_common < 2 or len(odd) * 2 >= n_common:  # no clear majority: a split, not an odd node
        return None, []
    return common, odd


def version_skew(syms: list[Symptom], job: Mapping[str, Any]) -> None:
    if any(s.id == SKEW for s in syms):
        return
    for rule_id, label in SOFTWARE.items():
        per_node = _versions(syms, rule_id)
        common, odd = _odd(per_node)
        for node in odd:
            facts = [s for s in syms if s.id == rule_id and s.node == node]
            trusted = all(s.trusted for s in facts)
            failed = [s for s in syms if s.role == "root" and s.cause == "launch_failure" and s.node == node
                      and s.id not in SOFTWARE and s.id != SKEW]
            others = sorted(n for n in per_node if n not in odd)
            version = next(iter(per_node[node]))
            majority = next(s for s in syms if s.id == rule_id and s.node == others[0])
            syms.append(Symptom(
                id=SKEW, cause="launch_failure", role="root" if failed else "context", priority=64,
                trusted=trusted, node=node, action="drain" if trusted and any(f.trusted for f in failed) else "none",
                summary=f"{node} runs {label} {version}, the job's other {len(others)} nodes {common}",
                fields={"software": label, "value": version, "common": common, "nodes": others[:16]},
                evidence=[*facts[0].evidence[:1], *majority.evidence[:1],
                          Evidence(source="analysis", text=f"{label}: {node} {version}; {', '.join(others[:8])} {common}")]))


def _ver(node: str, v: str, trusted: bool = True) -> Symptom:
    src = "kernel" if trusted else "stdout"
    return Symptom(id="gpu.driver_version" if trusted else "nccl.version", cause="launch_failure", role="context",
                   trusted=trusted, node=node, fields={"value": v},
                   evidence=[Evidence(src, f"nodes/{node}/software.log" if trusted else "output/stdout", 1, f"version {v}")])


def _refused(node: str, trusted: bool = True) -> Symptom:
    return Symptom(id="gpu.driver_api_mismatch" if trusted else "cuda.driver_mismatch", cause="launch_failure",
                   role="root", trusted=trusted, node=node, evidence=[Evidence("kernel" if trusted else "stderr", "x", 1)])


def _fleet(odd_version: str = "550.54.15", n: int = 4) -> list[Symptom]:
    return [_ver(f"n{i}", "535.104.05") for i in range(1, n)] + [_ver(f"n{n}", odd_version)]


JOB_REFINERS = [
    JobRefiner(
        id=SKEW,
        description="A node whose NVIDIA driver or NCCL differs from the version every other node of the job "
                    "runs (three or more nodes, a clear majority): the cause of a launch failure there (kernel "
                    "evidence of both drains it), otherwise said beside the verdict.",
        run=version_skew,
        status="experimental",
        cases=[
            RefinerCase(lambda: _fleet() + [_refused("n4")], ["context"] * 4 + ["root", "root"]),
            RefinerCase(lambda: _fleet(), ["context"] * 5),  # no failure there: beside the verdict
            RefinerCase(lambda: _fleet("535.104.05"), ["context"] * 4),  # near miss: one version
            RefinerCase(lambda: [_ver("n1", "535"), _ver("n2", "535"), _ver("n3", "550"), _ver("n4", "550")],
                        ["context"] * 4),  # near miss: two halves, no odd node
            RefinerCase(lambda: _fleet(n=2), ["context"] * 2),  # near miss: two nodes cannot tell which is odd
            RefinerCase(lambda: [_ver(f"n{i}", "2.21.5", trusted=False) for i in range(1, 4)]
                        + [_ver("n4", "2.18.3", trusted=False), _refused("n4", trusted=False)],
                        ["context"] * 4 + ["root", "root"]),  # NCCL, the job's word: a root that cannot drain
        ],
    ),
]
