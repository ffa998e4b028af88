"""Silent data corruption suspected: non-finite values from one rank only, or again and again
from one GPU across jobs.

Training code checks its numbers on every rank (the program is the same on all of them). A loss or
gradient that is NaN/Inf everywhere is the training's own divergence (a learning rate, the data,
the numerics: `train.nonfinite_loss`, user_error). When the program stops on a non-finite value
that only one rank saw while the others kept computing, that rank's GPU may have computed a wrong
result: a suspicion, said beside the verdict (the rank's own data can do the same), and kept in
the store with the GPU's address. The same suspicion on the same GPU in other jobs within 30 days
makes it the verdict: gpu_hardware, suspected silent data corruption, with the earlier jobs as
evidence; still never a drain (the evidence is the jobs' own word: the policy's `silent` list keeps
a clean kernel log from contradicting it, and untrusted evidence never drains).

Rank 0 alone is no such sign: programs commonly check and log on rank 0 only. Megatron's
`found NaN in local grad norm` names a rank-local value, so there even rank 0 counts.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping, Optional, Sequence

from slurm_attr.bundle import parse_ranks
from slurm_attr.model import Evidence, Symptom
from slurm_attr.rules.pyrule import HistoryCase, HistoryRule, JobRefiner, RefinerCase

NONFINITE = ("train.nonfinite_loss",)
ONE_RANK = "train.sdc_one_rank"
RECURRENT = "train.sdc_recurrent"
WINDOW_S = 30 * 86400
MIN_OTHER_JOBS = 1  # this job and one other on the same GPU


def _world(syms: Sequence[Symptom], job: Mapping[str, Any]) -> int:
    ranks = parse_ranks(job.get("ranks"))
    sizes = [s.fields["nranks"] for s in syms if s.id == "nccl.comm_rank" and isinstance(s.fields.get("nranks"), int)]
    return max([len(ranks)] + sizes)


def _bus_id(value: Any) -> Optional[str]:
    """NCCL's busId (``5e000``: domain, bus, device, function as hex digits) as a GPU address."""
    digits = str(value or "").lower()
    if not digits or len(digits) > 16 or any(c not in "0123456789abcdef" for c in digits):
        return None
    d = digits.zfill(9)
    return f"{d[-9:-5]}:{d[-5:-3]}:{d[-3:-1]}"


def _gpu_of(rank: int, node: Optional[str], syms: Sequence[Symptom]) -> Optional[str]:
    """The GPU address of a rank, from NCCL's init line for it in the largest communicator."""
    inits = [s for s in syms if s.id == "nccl.comm_rank" and isinstance(s.fields.get("nranks"), int)]
    if not inits:
        return None
    world = max(s.fields["nranks"] for s in inits)
    found = {_bus_id(s.fields.get("value")) for s in inits if s.rank == rank and s.fields["nranks"] == world}
    found.discard(None)
    return found.pop() if len(found) == 1 else None


def _local(s: Symptom) -> bool:
    text = " ".join(str(s.fields.get(k) or "") for k in ("message", "text"))
    return "local" in text.lower()


def one_rank_suspects(syms: Sequence[Symptom], job: Mapping[str, Any]) -> list[Symptom]:
    """The suspicion, when the program stopped on non-finite values that one rank alone saw."""
    stops = [s for s in syms if s.id in NONFINITE and s.role == "root" and not s.status.earlier]
    ranks = {s.rank for s in stops}
    if len(ranks) != 1 or None in ranks or _world(syms, job) < 2:
        return []
    [rank] = ranks
    first = stops[0]
    if rank == 0 and not any(_local(s) for s in stops):
        return []  # rank 0 is where programs check and log for everyone
    node = first.node or parse_ranks(job.get("ranks")).get(rank)
    gpu = _gpu_of(rank, node, syms)
    where = f"{node}" + (f" GPU {gpu}" if gpu else "") if node else "its GPU"
    return [Symptom(
        id=ONE_RANK, cause="gpu_hardware", role="context", priority=41, trusted=False, node=node, rank=rank,
        gpu=gpu, action="none",
        summary=f"only rank {rank} saw the non-finite values ({where}): suspected silent data corruption there, "
                f"unless that rank's own data explains them",
        fields={"escalates": [s.id for s in stops][:1]},
        evidence=list(first.evidence[:2]) + [Evidence(source="analysis", text=f"non-finite values on rank {rank} only, of "
                                                                                f"{_world(syms, job)} ranks")])]


def mark_one_rank(syms: list[Symptom], job: Mapping[str, Any]) -> None:
    if not any(s.id == ONE_RANK for s in syms):
        syms.extend(one_rank_suspects(syms, job))


def _job_epoch(job: Mapping[str, Any]) -> float:
    for key in ("end_time", "start_time"):
        try:
            when = datetime.fromisoformat(str(job.get(key)).replace("Z", "+00:00"))
        except ValueError:
            continue
        return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()
    return datetime.now(timezone.utc).timestamp()


def recurrent(syms: Sequence[Symptom], job: Mapping[str, Any], history: Any) -> list[Symptom]:
    """This job's one-rank suspicion on a GPU that had the same in other jobs within 30 days."""
    this_job = str(job.get("job_id", ""))
    out = []
    for s in one_rank_suspects(syms, job):
        if not s.node or not s.gpu:
            continue
        others = sorted(history.gpu_symptom_jobs(s.node, s.gpu, ONE_RANK, _job_epoch(job) - WINDOW_S, this_job) - {this_job})
        if len(others) < MIN_OTHER_JOBS:
            continue
        out.append(Symptom(
            id=RECURRENT, cause="gpu_hardware", role="root", priority=60, trusted=False, node=s.node, gpu=s.gpu,
            rank=s.rank, action="none",
            summary=f"non-finite values from {s.node} GPU {s.gpu} alone in {len(others) + 1} jobs within 30 days: "
                    "suspected silent data corruption; test the GPU (DCGM diagnostics) before trusting its results",
            fields={"jobs": others, "escalates": list(s.fields.get("escalates") or [])},
            evidence=list(s.evidence[:1]) + [Evidence(source="history", text=f"job {j}: non-finite values from "
                                                                              f"{s.node} GPU {s.gpu} alone") for j in others[:10]]))
    return out


# ---- cases: a 4-rank job on two nodes, NCCL's init lines giving each rank's GPU ---------------
_JOB = {"job_id": "300", "ranks": {"0": "n1", "1": "n1", "2": "n2", "3": "n2"}, "end_time": "2025-03-02T10:00:00"}


def _stop(rank: int, message: str = "Loss is nan, stopping training") -> Symptom:
    return Symptom(id="train.nonfinite_loss", cause="user_error", role="root", rank=rank, node=_JOB["ranks"][str(rank)],
                   fields={"text": message}, evidence=[Evidence("stdout", "output/stdout", 10 + rank, message)])


def _inits() -> list[Symptom]:
    return [Symptom(id="nccl.comm_rank", cause="unknown", role="context", rank=r, fields={"nranks": 4, "value": f"{0x18 + r:x}000"})
            for r in range(4)]


def _timeouts() -> list[Symptom]:
    return [Symptom(id="torch.watchdog_timeout", cause="comm_hang", role="cascade", rank=r) for r in (0, 1, 3)]


JOB_REFINERS = [
    JobRefiner(
        id=ONE_RANK,
        description="The program stopped on non-finite values that one rank alone saw (not rank 0, where programs "
                    "check for everyone, unless the value is rank-local): silent data corruption on its GPU is "
                    "suspected, said beside the verdict, never its cause by itself and never a drain.",
        run=mark_one_rank,
        status="experimental",
        cases=[
            RefinerCase(lambda: [_stop(2)] + _inits() + _timeouts(), ["root"] + ["context"] * 4 + ["cascade"] * 3 + ["context"],
                        job=_JOB),
            RefinerCase(lambda: [_stop(0)] + _timeouts(), ["root", "cascade", "cascade", "cascade"], job=_JOB),  # rank 0
            RefinerCase(lambda: [_stop(0, "found NaN in local grad norm in backward pass"), *_timeouts()],
                        ["root", "cascade", "cascade", "cascade", "context"], job=_JOB),  # rank-local: counts
            RefinerCase(lambda: [_stop(1), _stop(2)], ["root", "root"], job=_JOB),  # two ranks: the training's own
            RefinerCase(lambda: [_stop(2)], ["root"], job={"job_id": "301", "ranks": {"2": "n2"}}),  # one rank in all
        ],
    ),
]


HISTORY_RULES = [
    HistoryRule(
        id=RECURRENT, cause="gpu_hardware", priority=60, status="experimental",
        summary="non-finite values from one GPU alone, again across jobs: suspected silent data corruption",
        description="This job's one-rank non-finite suspicion on a GPU that had the same in another job within "
                    "30 days: gpu_hardware, suspected silent data corruption, the earlier jobs as evidence; never a "
                    "drain (the jobs' own word).",
        run=recurrent,
        cases=[
            HistoryCase([_stop(2)] + _inits(), {("n2", "0000:1a:00", ONE_RANK): ["250"]}, [RECURRENT], job=_JOB),
            HistoryCase([_stop(2)] + _inits(), {("n2", "0000:1b:00", ONE_RANK): ["250"]}, [], job=_JOB),  # other GPU
            HistoryCase([_stop(2)] + _inits(), {}, [], job=_JOB),  # the first time
            HistoryCase([_stop(0)] + _inits(), {("n1", "0000:18:00", ONE_RANK): ["250"]}, [], job=_JOB),  # rank 0
        ],
    ),
]
