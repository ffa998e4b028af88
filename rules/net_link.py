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
from slurm_attr.reason.timeline import Clock, clock_of, line_time, parse_iso
from slurm_attr.rules.pyrule import JobRefiner, RefinerCase

OUTLIVED_S = 120.0  # the job ran on at least this long after the port came back
DURING_SLACK_S = 30.0  # network errors this soon after the port came back still belong to the outage
DOWN_IDS = ("net.ib_link_down",)
UP_ID = "net.ib_link_up"


def _times(s: Symptom, clock: Clock, port: Optional[tuple[Any, Any]] = None) -> list[float]:
    """Every wall-clock time the symptom's lines carry: a folded finding (one node's lines of a
    rule counted once, its fields the first line's) keeps each occurrence as evidence, and the
    flap's ACTIVE may be the second, of another port than the first. ``port``: (ibdev, port) the
    lines must name ("mlx5_4: Port: 1 Link ...", the kernel's words)."""
    want = f"{port[0]}: Port: {port[1]} " if port else ""
    out = [t for t in (line_time(e.text, clock) for e in s.evidence if e.text and want in e.text) if t is not None]
    if not port or (s.fields.get("ibdev"), s.fields.get("port")) == port:
        t = parse_iso(s.time, clock) if s.time else None
        if t is not None:
            out.append(t)
    return out


def link_recovered(syms: list[Symptom], job: Mapping[str, Any]) -> None:
    clock = clock_of(job)
    ups = [s for s in syms if s.id == UP_ID and s.trusted]
    net_errors = [t for s in syms if not s.trusted and s.cause == "network" for t in _times(s, clock)[:1]]
    end = parse_iso(job.get("end_time"), clock)
    for down in syms:
        if down.id not in DOWN_IDS or down.role != "root":
            continue
        port = (down.fields.get("ibdev"), down.fields.get("port"))
        downs = _times(down, clock, port)
        if not downs:
            continue
        # the port is back only if an ACTIVE follows its last DOWN (a folded DOWN counts each time)
        t0, last = min(downs), max(downs)
        back = min((t for u in ups if u.node == down.node for t in _times(u, clock, port) if t >= last), default=None)
        if back is None:
            continue
        hurt = any(t0 <= t <= back + DURING_SLACK_S for t in net_errors)
        outlived = end is not None and end - back >= OUTLIVED_S
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


def line_of(at: float, dev: str, state: str) -> Evidence:
    stamp = datetime.fromtimestamp(1719667883 + at).strftime("%a %b %d %H:%M:%S %Y")
    return Evidence("kernel", "nodes/n1/kernel.log", 1, f"[{stamp}] mlx5_core 0000:3c:00.0 {dev}: Port: 1 Link {state}")


def _down_again() -> list[Symptom]:
    """DOWN, ACTIVE 30 s later, DOWN again for good (the two DOWN lines folded into one finding)."""
    down, up = _flap(30.0)
    down.evidence = [line_of(0.0, "mlx5_5", "DOWN"), line_of(90.0, "mlx5_5", "DOWN")]
    up.evidence = [line_of(30.0, "mlx5_5", "ACTIVE")]
    return [down, up]


def _folded_flap(other: bool = False) -> list[Symptom]:
    """The node's ACTIVE lines folded into one finding: its time and fields are the first's
    (another port, at boot, before the flap); the ACTIVE that ends the flap is its second line.
    ``other``: that second line names another port too (then nothing ended the flap)."""
    def line(at: float, dev: str) -> Evidence:
        return line_of(at, dev, "ACTIVE")
    down, _up = _flap(24.0)
    down.evidence = [line_of(0.0, "mlx5_5", "DOWN")]
    up = Symptom(id="net.ib_link_up", cause="network", role="context", trusted=True, node="n1",
                 time=datetime.fromtimestamp(1719667883 - 3000).isoformat(), fields={"ibdev": "mlx5_0", "port": 1},
                 evidence=[line(-3000, "mlx5_0"), line(24.0, "mlx5_1" if other else "mlx5_5")])
    return [down, up]

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
            RefinerCase(_folded_flap, ["context", "context"], job=_JOB),  # the ACTIVE after it, folded
            RefinerCase(lambda: _folded_flap(other=True), ["root", "context"], job=_JOB),  # another port's ACTIVE
            RefinerCase(_down_again, ["root", "context"], job=_JOB),  # back, then down again for good
        ],
    ),
]
