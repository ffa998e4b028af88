"""A restart of torchrun's worker group that its default log level does not print.

torchrun's agent reports every failed worker (`failed (exitcode: 1) local_rank: 1 (pid: 13696) of
binary: ...`, at its default level), and when it gives up, its `Root Cause (first observed
failure)` block names the failure of its last attempt, with that worker's pid. Its own "will
restart worker group" line is INFO, which torchrun does not print by default (torch 2.13). So an
agent's failure report whose pid its node's root cause does not name was an earlier attempt's:
the agent restarted the workers after it. That report is marked with a restart finding of its
own (`torch.restart_inferred`, policy `restarts`): what the job printed up to it was survived.
"""
from __future__ import annotations

from typing import Any, Mapping

from slurm_attr.model import Evidence, Symptom
from slurm_attr.rules.pyrule import JobRefiner, RefinerCase

ID = "torch.restart_inferred"
FINAL_IDS = ("torch.root_cause", "torch.failure_entry")


def infer_restarts(syms: list[Symptom], job: Mapping[str, Any]) -> None:
    # the pids of torchrun's last attempt: its root cause and the other entries of its summary
    # (workers on several nodes have pids of their own hosts: a clash across them is improbable)
    final = {s.fields["pid"] for s in syms if s.id in FINAL_IDS and isinstance(s.fields.get("pid"), int)}
    if not final:
        return
    for s in list(syms):
        pid = s.fields.get("pid")
        if s.id != "torch.child_failed" or not isinstance(pid, int) or pid in final:
            continue
        syms.append(Symptom(id=ID, cause="unknown", role="context", priority=5, trusted=False, node=s.node,
                            time=s.time, evidence=list(s.evidence[:1]),
                            summary=f"torchrun restarted its workers after pid {pid} failed: its last attempt's "
                                    f"summary names pid {', '.join(map(str, sorted(final)))}"))


def _case(final_pid: int, other: int = 0) -> list[Symptom]:
    def child(pid: int, line: int) -> Symptom:
        return Symptom(id="torch.child_failed", cause="user_error", role="cascade", node="n1", fields={"pid": pid},
                       evidence=[Evidence("stdout", "output/stdout", line,
                                          f"E1206 12:23:22.897000 13691 torch/distributed/elastic/multiprocessing/"
                                          f"api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: {pid}) of binary: python")])
    root = Symptom(id="torch.root_cause", cause="user_error", role="root", node="n1",
                   fields={"pid": final_pid}, evidence=[Evidence("stdout", "output/stdout", 60, "Root Cause")])
    entry = [Symptom(id="torch.failure_entry", cause="unknown", role="context", fields={"pid": other},
                     evidence=[Evidence("stdout", "output/stdout", 52, "rank")])] if other else []
    return [child(13696, 12), child(13698, 30), root] + entry


JOB_REFINERS = [
    JobRefiner(
        id="torch.restart_inferred",
        description="A torchrun agent's report of a failed worker whose pid its final root cause does not name was "
                    "an earlier attempt's: the agent restarted the workers after it (a restart finding is added).",
        run=infer_restarts,
        cases=[
            RefinerCase(lambda: _case(13698), ["cascade", "cascade", "root", "context"]),  # 13696: an earlier attempt
            RefinerCase(lambda: _case(13696)[:1] + _case(13696)[2:], ["cascade", "root"]),  # the one failure: no restart
            # two workers of the last attempt failed at once: the summary's other entry names the second
            RefinerCase(lambda: _case(13698, other=13696), ["cascade", "cascade", "root", "context"]),
        ],
    ),
]
