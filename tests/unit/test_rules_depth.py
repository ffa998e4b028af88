"""Catalog depth (issue 12): the data tables behind the new rules, and whole bundles whose verdict
rests on them. Each positive beside a near-miss built from the same real line formats."""
from __future__ import annotations

import json

import pytest

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.model import Symptom
from slurm_attr.rulebook import nvlink_sxid, xid74
from slurm_attr.rulebook.host_killed import killed_with_137
from slurm_attr.rules import analyze
from slurm_attr.verdict import decide

XID74 = "NVRM: Xid (PCI:0000:b9:00): 74, pid=<unknown>, name=<unknown>, NVLink: fatal error detected on link {link}({regs})"


def regs(r0=0, r2=0, r3=0, r4=0, r1=0):
    return ", ".join(hex(v) for v in (r0, r1, r2, r3, r4, 0, 0))


@pytest.mark.parametrize("values,fault,action", [
    (dict(r0=1 << 16), "hardware", "drain"),             # reseat / diagnostics
    (dict(r0=1 << 21), "signal_integrity", "drain"),
    (dict(r0=1 << 4), "ecc_parity", "none"),             # hardware only if it repeats
    (dict(r2=1 << 13), "hardware", "drain"),
    (dict(r4=1 << 20), "field_diag", "none"),
    (dict(r3=1 << 16), "secondary", "none"),
    (dict(r0=1 | 1 << 30), "ignore", "none"),
    (dict(r0=1 << 2), "unlisted", "none"),               # not in NVIDIA's list: no drain on a guess
    (dict(r0=1 | 1 << 16), "hardware", "drain"),         # the most severe bit decides
    (dict(r1=1 << 16), "none", "none"),                  # register 1 carries nothing on Hopper
])
def test_rules_depth_xid74_register_classes(values, fault, action):
    d = xid74.decode(XID74.format(link=6, regs=regs(**values)))
    assert d is not None and d["link"] == 6
    assert (d["fault"], d["action"]) == (fault, action)


def test_rules_depth_xid74_without_registers_is_left_to_the_table():
    assert xid74.decode("NVRM: Xid (PCI:0000:65:00): 74, pid=<n/a>, name=<unknown>, NVLink: fatal error detected on link 2") is None


def test_rules_depth_sxid_table_codes_override_their_unit():
    assert nvlink_sxid.lookup(20034).action == "reset" and nvlink_sxid.lookup(20034).name == "DLPL_LTSSM_FAULT_UP"
    assert nvlink_sxid.lookup(20009).action == "drain"           # error rate: check the cabling
    fallback = nvlink_sxid.lookup(20020)                           # no row of its own: the unit's range row
    assert (fallback.unit, fallback.lo, fallback.hi) == ("DLPL", 20000, 20999)
    assert nvlink_sxid.lookup(11004).action == "none"            # fabric manager configuration
    assert nvlink_sxid.lookup(9999) is None and nvlink_sxid.lookup(31000) is None


def test_rules_depth_sxid_every_unit_range_is_disjoint():
    spans = sorted((r.lo, r.hi) for r in nvlink_sxid.RANGES)
    assert all(a_hi < b_lo for (_, a_hi), (b_lo, _) in zip(spans, spans[1:]))
    assert all(any(r.lo <= c <= r.hi for r in nvlink_sxid.RANGES) for c in nvlink_sxid.CODES)


def _killed():
    return Symptom(id="host.shell_killed", cause="host_oom", role="context", fields={"comm": "python main.py"})


@pytest.mark.parametrize("job,symptoms,want", [
    ({"job_id": "1", "state": "FAILED", "exit_code": 137}, [_killed()], ["host.killed_exit_137_job"]),
    ({"job_id": "1", "state": "TIMEOUT", "exit_code": 137}, [_killed()], []),    # Slurm's own kill
    ({"job_id": "1", "state": "CANCELLED by 0", "exit_code": 137}, [_killed()], []),
    ({"job_id": "1", "state": "FAILED", "exit_code": 137}, [], []),              # 137 alone: not an OOM
    ({"job_id": "1", "state": "FAILED", "exit_code": 1}, [_killed()], []),       # Killed alone: not an OOM
    ({"job_id": "1", "state": "FAILED", "exit_code": 137},
     [_killed(), Symptom(id="slurm.oom_event", cause="host_oom", role="root")], []),  # already said
])
def test_rules_depth_killed_with_exit_137(job, symptoms, want):
    assert [s.id for s in killed_with_137(symptoms, job, None)] == want


# --- whole bundles: the verdict the new rules give, with a near-miss beside each -------------------

def bundle(tmp_path, job, kernel=None, stdout=None, stderr=None, nccl=None):
    root = tmp_path / "b"
    root.mkdir(parents=True)
    (root / "job.json").write_text(json.dumps(job))
    for node, text in (kernel or {}).items():
        (root / "nodes" / node).mkdir(parents=True, exist_ok=True)
        (root / "nodes" / node / "kernel.log").write_text(text)
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        if text is not None:
            (root / "output").mkdir(exist_ok=True)
            (root / "output" / name).write_text(text)
    for node, text in (nccl or {}).items():
        (root / "nodes" / node / "nccl").mkdir(parents=True, exist_ok=True)
        (root / "nodes" / node / "nccl" / f"nccl.{node}.log").write_text(text)
    b = Bundle(str(root))
    symptoms, coverage = analyze(b, Config())
    return decide(b.job, symptoms, coverage), symptoms


JOB = {"job_id": "4242", "nodes": ["n1", "n2"], "ranks": {"0": "n1", "1": "n2"}, "state": "FAILED", "exit_code": 1,
       "start_time": "2025-06-24T09:00:00", "end_time": "2025-06-24T10:30:00"}
OOM_OUT = ("1: [ 8812.301772] Out of memory: Killed process 219904 (python) total-vm:188417236kB, "
           "anon-rss:121800420kB, file-rss:71396kB, shmem-rss:12288kB, UID:1000 pgtables:240012kB oom_score_adj:0\n")


def test_rules_depth_bundle_host_oom_from_job_output(tmp_path):
    v, _ = bundle(tmp_path, JOB, stdout="1: [rank1]: step 4100 | loss 2.113\n" + OOM_OUT)
    assert v.cause == "host_oom"
    assert all(a.get("kind") != "drain" for a in [a if isinstance(a, dict) else a.__dict__ for a in v.actions])


def test_rules_depth_bundle_oom_constraint_line_alone_names_host_oom(tmp_path):
    v, _ = bundle(tmp_path, JOB, stderr="oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,"
                  "oom_memcg=/slurm/uid_1000/job_4242,task_memcg=/slurm/uid_1000/job_4242/step_0/task_1,task=python,pid=219904,uid=1000\n")
    assert v.cause == "host_oom"


def test_rules_depth_bundle_near_miss_bare_killed_is_not_oom(tmp_path):
    v, _ = bundle(tmp_path, {**JOB, "exit_code": 1},
                  stdout="/var/spool/slurmd/job4242/slurm_script: line 22: 443552 Killed                  python main.py\n")
    assert v.cause != "host_oom"


def test_rules_depth_bundle_killed_then_137_is_host_oom(tmp_path):
    v, _ = bundle(tmp_path, {**JOB, "exit_code": 137},
                  stdout="/var/spool/slurmd/job4242/slurm_script: line 22: 443552 Killed                  python main.py\n"
                         "srun: error: n1: task 0: Exited with exit code 137\n")
    assert v.cause == "host_oom"


def test_rules_depth_bundle_mpi_plugin_is_launch_failure(tmp_path):
    v, _ = bundle(tmp_path, JOB, stderr="srun: error: Couldn't find the specified plugin name for mpi/pmix looking at all files\n"
                                         "srun: error: cannot find mpi plugin for mpi/pmix\n")
    assert v.cause == "launch_failure"


def test_rules_depth_bundle_stale_handle_at_import_is_filesystem(tmp_path):
    v, _ = bundle(tmp_path, JOB, stderr=(
        "0: Traceback (most recent call last):\n"
        "0:   File \"/shared/sw/venv/lib/python3.11/site-packages/torch/__init__.py\", line 237, in <module>\n"
        "0: ImportError: /shared/sw/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so: cannot read file data: Input/output error\n"
        "srun: error: n1: task 0: Exited with exit code 1\n"))
    assert v.cause == "filesystem"


def test_rules_depth_bundle_near_miss_missing_library_is_not_filesystem(tmp_path):
    v, _ = bundle(tmp_path, JOB, stderr="0: ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory\n"
                                         "srun: error: n1: task 0: Exited with exit code 1\n")
    assert v.cause not in ("filesystem", "launch_failure")


def test_rules_depth_bundle_nic_link_down_localises_the_network_fault(tmp_path):
    socket_err = ("{h}:5512:5603 [0] misc/socket.cc:71 NCCL WARN socketProgress: Connection closed by remote peer "
                  "{p}<52110>\n")
    v, _ = bundle(tmp_path, JOB,
                  kernel={"n1": "[Tue Jun 24 09:40:00 2025] mlx5_core 0000:18:00.0 mlx5_0: Port: 1 Link ACTIVE\n",
                          "n2": "[Tue Jun 24 10:14:02 2025] bnxt_en 0000:3b:00.0 enp59s0f0np0: NIC Link is Down\n"},
                  nccl={"n1": socket_err.format(h="n1", p="n2"), "n2": socket_err.format(h="n2", p="n1")})
    assert v.cause == "network" and v.culprit_nodes == ["n2"]


def test_rules_depth_bundle_near_miss_management_nic_down_does_not_localise(tmp_path):
    v, _ = bundle(tmp_path, JOB, kernel={"n2": "[Tue Jun 24 10:14:02 2025] e1000e 0000:00:1f.6 eno1: NIC Link is Down\n"})
    assert v.cause != "network"


def test_rules_depth_bundle_xid74_hardware_bits_drain_but_ignore_bits_do_not(tmp_path):
    line = "[Tue Jun 24 09:52:19 2025] " + XID74.format(link=6, regs=regs(r0=1 << 16)) + "\n"
    v, _ = bundle(tmp_path, JOB, kernel={"n2": line})
    assert v.cause == "nvlink" and v.culprit_nodes == ["n2"]
    ignore = "[Tue Jun 24 09:52:19 2025] " + XID74.format(link=3, regs=regs(r0=1 | 1 << 23)) + "\n"
    v2, syms = bundle(tmp_path / "x", JOB, kernel={"n2": ignore})
    assert v2.cause != "nvlink" and [s.role for s in syms if s.id == "gpu.xid_74"] == ["context"]


def test_rules_depth_every_peer_and_address_stays_a_finding_of_its_own():
    # The verdict votes over failing connections and maps addresses to hosts: folding repeats
    # must not fold two peers (or two hosts' addresses) into the first one.
    from slurm_attr.rules import load_catalog
    from slurm_attr.rules.extract import extract_lines

    lines = [
        "gpu-a03:5512:5512 [0] NCCL INFO Bootstrap : Using ib0:10.20.6.13<0>",
        "gpu-a07:6612:6612 [0] NCCL INFO Bootstrap : Using ib0:10.20.6.17<0>",
        "gpu-a03:5512:5630 [0] transport/net_ib.cc:1712 NCCL WARN NET/IB : Got completion from peer 10.20.6.17<50826> "
        "with status=12 opcode=0 len=0 vendor err 129 (Send)",
        "gpu-a03:5512:5630 [0] transport/net_ib.cc:1712 NCCL WARN NET/IB : Got completion from peer 10.20.6.21<41302> "
        "with status=12 opcode=0 len=0 vendor err 129 (Send)",
        "gpu-a03:5512:5630 [0] transport/net_ib.cc:1712 NCCL WARN NET/IB : Got completion from peer 10.20.6.21<41302> "
        "with status=12 opcode=0 len=0 vendor err 129 (Send)",
    ]
    syms = extract_lines(load_catalog(), "stdout", None, "stdout", list(enumerate(lines, 1)))
    assert sorted(s.fields["ip"] for s in syms if s.id == "nccl.bootstrap_address") == ["10.20.6.13", "10.20.6.17"]
    ib = {s.fields["peer_ip"]: s.fields.get("occurrences", 1) for s in syms if s.id == "nccl.ib_completion_error"}
    assert ib == {"10.20.6.17": 1, "10.20.6.21": 2}  # a repeat of one connection is still folded
