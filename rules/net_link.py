"""A link that went down and came back: the flap the job outlived is context, not its cause.

`mlx5_core <bdf> mlx5_5: Port: 1 Link DOWN` then, seconds later, `... Link ACTIVE` on the same
port is a flap. If the job then ran on (its end, or any later failure, well after the port came
back) and no network error of the job's falls into the outage, the flap did not end the job: the
down line stays as evidence, as context. A flap during which the job's collectives failed, or
one the job did not outlive, stays what the catalog says (a root).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Optional

from slurm_attr.model import Evidence, Symptom
from slurm_attr.rules.pyrule import JobRefiner, RefinerCase

OUTLIVED_S = 120.0  # the job ran on at least this long after the port came back
DURING_SLACK_S = 30.0  # network errors this soon after the port came back still belong to the outage
DOWN_IDS = ("net.ib_link_down",)
UP_ID = "net.ib_link_up"


def _t(s: Symptom) -> Optional[float]:
    up = s.fields.get("uptime")
    if isinstance(up, (int, float)):
        return float(up)
    if s.time:
        try:
            return datetime.fromisoformat(s.time.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _end(job: Mapping[str, Any]) -> Optional[float]:
    try:
        return datetime.fromisoformat(str(job.get("end_time")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def link_recovered(syms: list[Symptom], job: Mapping[str, Any]) -> None:
    ups = [s for s in syms if s.id == UP_ID and s.trusted and _t(s) is not None]
    net_errors = [t for s in syms if not s.trusted and s.cause == "network" for t in [_t(s)] if t is not None]
    end = _end(job)
    for down in syms:
        t0 = _t(down)
        if down.id not in DOWN_IDS or down.role != "root" or t0 is None:
            continue
        key = (down.node, down.fields.get("ibdev"), down.fields.get("port"))
        back = min((t for u in ups if (u.node, u.fields.get("ibdev"), u.fields.get("port")) == key
                    for t in [_t(u)] if t is not None and t >= t0), default=None)
        if back is None:
            continue
        hurt = any(t0 <= t <= back + DURING_SLACK_S for t in net_errors)
        outlived = end is not None and end - back >= OUTLIVED_S and down.time is not None
        if outlived and not hurt:
            down.role, down.status.caused_by = "context", f"recovered: port back ACTIVE {back - t0:.0f} s later"


def _flap(back_s: float, nccl_at: Optional[float] = None) -> list[Symptom]:
    def k(sid: str, role: str, at: float) -> Symptom:
        iso = datetime.fromtimestamp(1719667883 + at).isoformat()
        return Symptom(id=sid, cause="network", role=role, trusted=True, node="n1", time=iso,
                       fields={"ibdev": "mlx5_5", "port": 1}, evidence=[Evidence("kernel", "nodes/n1/kernel.log", 1)])
    out = [k("net.ib_link_down", "root", 0.0), k("net.ib_link_up", "context", back_s)]
    if nccl_at is not None:
        out.append(Symptom(id="nccl.ib_completion_error", cause="network", role="root", node="n2",
                           time=datetime.fromtimestamp(1719667883 + nccl_at).isoformat()))
    return out


_JOB = {"job_id": "7", "end_time": datetime.fromtimestamp(1719667883 + 1800).isoformat()}

JOB_REFINERS = [
    JobRefiner(
        id="net.link_recovered",
        description="A port that went DOWN and came back ACTIVE, which the job outlived by two minutes with none of "
                    "its network errors during the outage, is context: the flap did not end the job.",
        run=link_recovered,
        cases=[
            RefinerCase(lambda: _flap(24.0), ["context", "context"], job=_JOB),
            RefinerCase(lambda: _flap(24.0, nccl_at=10.0), ["root", "context", "root"], job=_JOB),  # errors during it
            RefinerCase(lambda: _flap(1790.0), ["root", "context"], job=_JOB),  # back just before the end
            RefinerCase(lambda: _flap(24.0)[:1], ["root"], job=_JOB),  # never came back
        ],
    ),
]
