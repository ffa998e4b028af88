"""The fast path's drain reason read back as a symptom (pipeline/reconcile.reason_symptoms) when
the node's kernel lines never reached the spool: its GPU is the reason's GPU word, never the
cause word before it (`sattr nodes` showed a GPU named "_hardware")."""
from __future__ import annotations

import pytest

from slurm_attr.model import Action
from slurm_attr.pipeline.reconcile import reason_symptoms


@pytest.mark.parametrize("reason,gpu,xid", [
    ("SATTR: gpu_hardware xid79 gpu3b:00 job 1234", "3b:00", 79),
    ("SATTR: gpu_hardware xid48 gpu0001:3b:00.0 job 7_3", "0001:3b:00.0", 48),
    # near misses: no GPU word at all; the cause word alone must not become one
    ("SATTR: gpu_hardware xid79 job 1234", None, 79),
    ("SATTR: nvlink_hardware sxid12028 job 9", None, None),
])
def test_gpu_and_xid_from_the_reason(reason, gpu, xid):
    syms = reason_symptoms("", [(Action(kind="drain", node="n2", reason=reason, applied=True), "root")])
    assert [(s.node, s.gpu) for s in syms] == [("n2", gpu)]
    assert syms[0].fields.get("xid") == xid


def test_a_drain_not_applied_is_no_evidence():
    act = Action(kind="drain", node="n2", reason="SATTR: gpu_hardware xid79 gpu3b:00 job 1", applied=False)
    assert reason_symptoms("", [(act, "root")]) == []
