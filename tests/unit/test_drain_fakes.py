"""An in-memory Slurm (SlurmAccess) that behaves as research/slurm.md §6 verified, plus builders.

The drain, fast-path and ops tests import from here; the tests below pin the fake's
behaviour to what the real scontrol does, so a test passing against the fake means
something against Slurm.
"""
from __future__ import annotations

import time
from typing import Any

import pytest

from slurm_attr.config import Config
from slurm_attr.errors import SlurmError
from slurm_attr.model import Evidence, Symptom, Verdict


class FakeSlurm:
    """Nodes as `scontrol -o show node` records: NodeName, State (BASE+FLAG), Reason, Partitions."""

    def __init__(self, nodes: dict[str, list[str]] | None = None, reboot_program: bool = False):
        nodes = nodes or {f"n{i}": ["debug"] for i in range(1, 5)}
        self.recs: dict[str, dict[str, str]] = {
            n: {"NodeName": n, "State": "IDLE", "Partitions": ",".join(parts)} for n, parts in nodes.items()}
        self.reboot_program = reboot_program
        self.calls: list[tuple[str, ...]] = []
        self.fail_drain = False
        self.unreachable = False

    # -- test set-up ------------------------------------------------------------------
    def admin_drain(self, node: str, reason: str, user: str = "admin") -> None:
        self._set_flag(node, "DRAIN")
        self.recs[node]["Reason"] = f"{reason} [{user}@2026-01-01T00:00:00]"

    def set_state(self, node: str, state: str, reason: str | None = None) -> None:
        self.recs[node]["State"] = state
        if reason is None:
            self.recs[node].pop("Reason", None)
        else:
            self.recs[node]["Reason"] = f"{reason} [root@2026-01-01T00:00:00]"

    def state(self, node: str) -> str:
        return self.recs[node]["State"]

    def reason(self, node: str) -> str:
        return self.recs[node].get("Reason", "")

    def drained(self) -> list[str]:
        return sorted(n for n, r in self.recs.items() if "DRAIN" in r["State"].split("+"))

    def _set_flag(self, node: str, flag: str) -> None:
        words = self.recs[node]["State"].split("+")
        if flag not in words:
            words.append(flag)
        self.recs[node]["State"] = "+".join(words)

    def _check(self) -> None:
        if self.unreachable:
            raise SlurmError("scontrol show node: Unable to contact slurm controller")

    # -- SlurmAccess ----------------------------------------------------------------------
    def show_node(self, node: str) -> dict[str, str] | None:
        self.calls.append(("show_node", node))
        self._check()
        rec = self.recs.get(node)
        return dict(rec) if rec else None

    def nodes(self) -> list[dict[str, Any]]:
        self.calls.append(("nodes",))
        self._check()
        return [dict(r) for r in self.recs.values()]

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))
        self._check()
        if not reason:
            raise SlurmError("You must specify a reason when DOWNING or DRAINING a node. Request denied")
        if node not in self.recs:
            raise SlurmError(f"Invalid node name specified {node}")
        if self.fail_drain:
            raise SlurmError("slurm_update error: Access/permission denied")
        self._set_flag(node, "DRAIN")
        self.recs[node]["Reason"] = f"{reason} [root@{time.strftime('%Y-%m-%dT%H:%M:%S')}]"

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        self._check()
        words = self.recs[node]["State"].split("+")
        if not {"DRAIN", "DOWN", "REBOOT_REQUESTED"} & set(words):
            raise SlurmError("slurm_update error: Invalid node state specified")
        words = [w for w in words if w not in ("DRAIN", "REBOOT_REQUESTED")]
        if words[0] == "DOWN":
            words[0] = "IDLE"
        self.recs[node]["State"] = "+".join(words)
        self.recs[node].pop("Reason", None)

    def reboot(self, node: str, reason: str, nextstate: str = "DOWN") -> None:
        self.calls.append(("reboot", node, reason, nextstate))
        self._check()
        if not self.reboot_program:
            raise SlurmError("scontrol reboot: RebootProgram isn't defined")
        self._set_flag(node, "DRAIN")
        self._set_flag(node, "REBOOT_REQUESTED")
        self.recs[node]["Reason"] = f"{reason} [root@{time.strftime('%Y-%m-%dT%H:%M:%S')}]"

    # Unused by the drain code; present so the fake is a whole SlurmAccess.
    def show_job(self, job_id: str) -> None:
        return None

    def sacct_job(self, job_id: str) -> None:
        return None

    def job_comment(self, job_id: str, field: str) -> None:
        return None

    def set_job_comment(self, job_id: str, field: str, text: str) -> None:
        raise SlurmError("no accounting in the fake")


XID79 = "2026-11-30T10:00:00+00:00 host kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def xid_symptom(node: str = "n2", xid: int = 79, action: str = "reboot", trusted: bool = True,
                cause: str = "gpu_hardware", role: str = "root", gpu: str | None = "0000:3b:00",
                source: str | None = None, priority: int = 95) -> Symptom:
    src = source or ("kernel" if trusted else "stdout")
    path = f"nodes/{node}/kernel.log" if src == "kernel" else "output/stdout"
    return Symptom(id=f"gpu.xid_{xid}", cause=cause, role=role, priority=priority, trusted=trusted, node=node, gpu=gpu,
                   action=action if trusted else "none", summary=f"Xid {xid} on {node}", fields={"xid": xid},
                   evidence=[Evidence(source=src, path=path, line=3, text=XID79)])


def hw_verdict(job_id: str = "1234", node: str = "n2", **kw: Any) -> Verdict:
    s = xid_symptom(node=node, **kw)
    return Verdict(job_id=job_id, cause=s.cause, summary="GPU fell off the bus", culprit_nodes=[node],
                   culprit_gpus=[s.gpu] if s.gpu else [], symptoms=[s])


def drain_cfg(**drain: Any) -> Config:
    cfg = Config()
    cfg.drain.max_partition_percent = 100.0
    for k, v in drain.items():
        setattr(cfg.drain, k, v)
    return cfg


# -- the fake against verified Slurm behaviour ------------------------------------------------


def test_fake_refuses_drain_without_reason_and_resume_of_idle_node():
    s = FakeSlurm()
    with pytest.raises(SlurmError, match="specify a reason"):
        s.drain("n1", "")
    with pytest.raises(SlurmError, match="Invalid node state"):
        s.resume("n1")


def test_fake_drain_keeps_reason_with_stamp_and_resume_clears_it():
    s = FakeSlurm()
    s.drain("n1", "SATTR: x job 1")
    assert s.state("n1") == "IDLE+DRAIN"
    assert s.reason("n1").startswith("SATTR: x job 1 [root@")
    s.resume("n1")
    assert s.state("n1") == "IDLE" and s.reason("n1") == ""


def test_fake_reboot_needs_reboot_program():
    with pytest.raises(SlurmError, match="RebootProgram"):
        FakeSlurm().reboot("n1", "SATTR: r")
    s = FakeSlurm(reboot_program=True)
    s.reboot("n1", "SATTR: r job 1")
    assert set(s.state("n1").split("+")) >= {"DRAIN", "REBOOT_REQUESTED"}
