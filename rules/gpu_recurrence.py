"""The "lemon GPU": a program-side Xid that keeps coming back on the same GPU.

Xid 13 and 31 usually mean the program faulted (out-of-range address, bad page). NVIDIA's
workflows say: solo or on different GPUs, blame the app; repeating on the same GPU across runs,
suspect the GPU. Here: the same Xid on the same node and GPU in at least 3 unrelated jobs
(counting this one) within 7 days escalates to gpu_hardware, with the earlier jobs as evidence.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from slurm_attr.model import Evidence, Symptom
from slurm_attr.rules.pyrule import HistoryCase, HistoryRule

PROGRAM_XIDS = ("gpu.xid_13", "gpu.xid_31")
WINDOW_S = 7 * 86400
MIN_JOBS = 3  # including this one


def _job_epoch(job: Mapping[str, Any]) -> float:
    for key in ("end_time", "start_time"):
        value = job.get(key)
        if isinstance(value, str) and value:
            try:
                when = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            if when.tzinfo is None:
                when = when.replace(tzinfo=timezone.utc)
            return when.timestamp()
    return datetime.now(timezone.utc).timestamp()


def recurrent_xid(symptoms: Sequence[Symptom], job: Mapping[str, Any], history: Any) -> list[Symptom]:
    """One gpu.xid_recurrent per (node, GPU, Xid) seen in enough other recent jobs."""
    since = _job_epoch(job) - WINDOW_S
    this_job = str(job.get("job_id", ""))
    out: list[Symptom] = []
    seen: set[tuple[str, str, str]] = set()
    for s in symptoms:
        if s.id not in PROGRAM_XIDS or not s.trusted or not s.node or not s.gpu:
            continue
        key = (s.node, s.gpu, s.id)
        if key in seen:
            continue
        seen.add(key)
        others = sorted(history.gpu_symptom_jobs(s.node, s.gpu, s.id, since, this_job) - {this_job})
        if len(others) + 1 < MIN_JOBS:
            continue
        xid = s.id.rsplit("_", 1)[1]
        ev = list(s.evidence[:1]) + [
            Evidence(source="history", text=f"job {j} also logged Xid {xid} on {s.node} GPU {s.gpu}") for j in others[:10]
        ]
        out.append(Symptom(
            id="gpu.xid_recurrent", cause="gpu_hardware", role="root", priority=92, trusted=True,
            node=s.node, gpu=s.gpu, action="drain",
            summary=f"Xid {xid} on {s.node} GPU {s.gpu} in {len(others) + 1} jobs within 7 days: suspect the GPU",
            fields={"xid": int(xid), "jobs": others, "escalates": [s.id]}, evidence=ev,
        ))
    return out


def _x13(node: str = "n1", gpu: str = "0000:3b:00") -> Symptom:
    return Symptom(id="gpu.xid_13", cause="user_error", trusted=True, node=node, gpu=gpu)


HISTORY_RULES = [
    HistoryRule(
        id="gpu.xid_recurrent", cause="gpu_hardware", priority=92, action="drain",
        summary="a program-side Xid recurring on one GPU across jobs",
        description="Xid 13/31 on the same node and GPU in >= 3 unrelated jobs within 7 days: gpu_hardware "
                    "(lemon GPU), drain; the earlier job ids are the evidence.",
        run=recurrent_xid,
        cases=[
            HistoryCase([_x13()], {("n1", "0000:3b:00", "gpu.xid_13"): ["90", "95"]}, ["gpu.xid_recurrent"]),
            HistoryCase([_x13()], {("n1", "0000:3b:00", "gpu.xid_13"): ["90"]}, []),
            HistoryCase([_x13()], {("n1", "0000:5e:00", "gpu.xid_13"): ["90", "95"]}, []),
            HistoryCase([_x13()], {("n1", "0000:3b:00", "gpu.xid_13"): ["100", "95"]}, []),
        ],
    )
]
