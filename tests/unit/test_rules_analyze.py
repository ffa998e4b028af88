"""analyze(): every source of a bundle, bounded and hostile-input safe, with coverage."""
from __future__ import annotations

import json
import os

from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.rules import analyze

XID79 = "[Thu May  2 10:00:03 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python, GPU has fallen off the bus.\n"


def make_bundle(root, job, kernel=None, stdout=None, stderr=None, nccl=None, scheduler=None):
    """A bundle directory as the collectors write it (DESIGN §3)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "job.json").write_text(json.dumps(job))
    for node, text in (kernel or {}).items():
        (root / "nodes" / node).mkdir(parents=True, exist_ok=True)
        (root / "nodes" / node / "kernel.log").write_bytes(text.encode() if isinstance(text, str) else text)
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        if text is not None:
            (root / "output").mkdir(exist_ok=True)
            (root / "output" / name).write_bytes(text.encode() if isinstance(text, str) else text)
    for node, files in (nccl or {}).items():
        (root / "nodes" / node / "nccl").mkdir(parents=True, exist_ok=True)
        for fname, text in files.items():
            (root / "nodes" / node / "nccl" / fname).write_text(text)
    for fname, text in (scheduler or {}).items():
        (root / "scheduler").mkdir(exist_ok=True)
        (root / "scheduler" / fname).write_text(text)
    return Bundle(str(root))


def cov(coverage, source, node=None):
    return [c for c in coverage if c.source == source and c.node == node]


def test_rules_analyze_reads_every_source_with_its_trust(tmp_path):
    b = make_bundle(tmp_path / "b", {"job_id": "7", "nodes": ["n1", "n2"], "ranks": {"0": "n1", "1": "n2"},
                                      "state": "FAILED", "exit_code": 1},
                    kernel={"n1": "noise\n", "n2": XID79},
                    stdout="[rank1]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, remote process exited or there was a network error, NCCL version 2.19.3\n",
                    nccl={"n1": {"nccl.n1.1234.log": "n1:1234:1300 [0] NCCL WARN NET/IB : Got async event : port error\n"}},
                    scheduler={"slurmctld.log": "[2024-05-02T10:00:01.123] Killing JobId=7 on failed node n2\n"})
    syms, coverage = analyze(b, Config())
    by_id = {s.id: s for s in syms}
    assert by_id["gpu.xid_79"].node == "n2" and by_id["gpu.xid_79"].trusted and by_id["gpu.xid_79"].action == "reboot"
    assert by_id["nccl.remote_error"].node == "n2" and not by_id["nccl.remote_error"].trusted  # rank 1 -> n2
    assert by_id["nccl.ib_async_event"].node == "n1" and by_id["nccl.ib_async_event"].action == "none"
    assert by_id["slurm.node_failure"].trusted and by_id["slurm.node_failure"].evidence[0].source == "scheduler"
    assert by_id["job.failed_exit"].cause == "user_error"
    assert {c.status for c in coverage} == {"ok"}
    assert cov(coverage, "kernel", "n1") and cov(coverage, "stdout")


def test_rules_analyze_maps_nccl_hosts_in_stdout_to_nodes(tmp_path):
    b = make_bundle(tmp_path / "b", {"job_id": "7", "nodes": ["gpu-017", "gpu-012"]},
                    stdout="gpu-017.cluster.local:12345:12400 [3] NCCL WARN NET/IB : Got completion from peer 10.0.0.12<51234> with status=12 opcode=0 len=0 vendor err 129 (Send)\n")
    syms, _ = analyze(b, Config())
    [s] = [s for s in syms if s.id == "nccl.ib_completion_error"]
    assert s.node == "gpu-017" and s.fields["cuda_dev"] == 3


def test_rules_analyze_missing_sources_are_coverage_not_errors(tmp_path):
    b = make_bundle(tmp_path / "b", {"job_id": "8", "nodes": ["n1", "n2"]}, kernel={"n1": XID79})
    syms, coverage = analyze(b, Config())
    assert [c.status for c in cov(coverage, "kernel", "n2")] == ["missing"]
    assert [c.status for c in cov(coverage, "stdout")] == ["missing"]
    assert not cov(coverage, "stderr")  # merged into stdout: not a gap
    assert "gpu.xid_79" in {s.id for s in syms}


def test_rules_analyze_refuses_a_symlinked_kernel_log(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(XID79)
    b = make_bundle(tmp_path / "b", {"job_id": "9", "nodes": ["n1"]}, stdout="")
    (tmp_path / "b" / "nodes" / "n1").mkdir(parents=True)
    os.symlink(secret, tmp_path / "b" / "nodes" / "n1" / "kernel.log")
    syms, coverage = analyze(b, Config())
    assert [c.status for c in cov(coverage, "kernel", "n1")] == ["error"]
    assert "symlink" in cov(coverage, "kernel", "n1")[0].detail
    assert not [s for s in syms if s.id.startswith("gpu.")]


def test_rules_analyze_reads_the_tail_of_an_oversized_file(tmp_path):
    cfg = Config()
    cfg.collect.kernel_cap_bytes = 64 << 10
    head = "[Thu May  2 09:00:00 2024] NVRM: Xid (PCI:0000:5e:00): 48, DBE ECC error\n"
    noise = "[Thu May  2 09:30:00 2024] audit: type=1400 apparmor=\"DENIED\" operation=\"open\"\n" * 3000
    b = make_bundle(tmp_path / "b", {"job_id": "10", "nodes": ["n1"]}, kernel={"n1": head + noise + XID79}, stdout="")
    syms, coverage = analyze(b, cfg)
    [c] = cov(coverage, "kernel", "n1")
    assert c.status == "truncated" and "of" in c.detail
    ids = {s.id for s in syms}
    assert "gpu.xid_79" in ids and "gpu.xid_48" not in ids  # the end of the window is what matters


def test_rules_analyze_survives_binary_junk_and_huge_lines(tmp_path):
    junk = os.urandom(200_000).replace(b"\n", b"") + b"\n" + b"\xff\xfe\x00" * 1000 + b"\n"
    huge = b"A" * (2 << 20) + b"\n"
    b = make_bundle(tmp_path / "b", {"job_id": "11", "nodes": ["n1"]},
                    kernel={"n1": junk + huge + XID79.encode()},
                    stdout=b"\x00\x01\x02" * 100 + b"\n" + b"[rank0]: RuntimeError: CUDA error: out of memory\n")
    syms, coverage = analyze(b, Config())
    assert {"gpu.xid_79", "cuda.oom_error"} <= {s.id for s in syms}
    assert all(c.status in ("ok", "truncated") for c in coverage)


def test_rules_analyze_truncated_last_line_is_harmless(tmp_path):
    b = make_bundle(tmp_path / "b", {"job_id": "12", "nodes": ["n1"]},
                    kernel={"n1": XID79 + "[Thu May  2 10:00:04 2024] NVRM: Xid (PCI:0000:3b"}, stdout="")
    syms, _ = analyze(b, Config())
    assert [s.id for s in syms if s.id.startswith("gpu.")] == ["gpu.xid_79"]


def test_rules_analyze_applies_job_state_rules(tmp_path):
    b = make_bundle(tmp_path / "b", {"job_id": "13", "state": "TIMEOUT", "exit_code": 0, "signal": 15}, stdout="")
    syms, _ = analyze(b, Config())
    assert [(s.id, s.cause, s.trusted) for s in syms] == [("job.timeout", "time_limit", True)]


def test_rules_analyze_uses_the_site_rules_of_the_config(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "site.burn_failed.toml").write_text(
        'id = "site.burn_failed"\nstatus = "stable"\npriority = 50\nrole = "root"\ncause = "user_error"\n'
        'sources = ["stdout"]\nkeywords = ["gpu_burn"]\nregex = \'gpu_burn: FAULTY\'\n'
        '[[cases]]\nmatch = "gpu_burn: FAULTY GPU 1"\n[[cases]]\nnomatch = "gpu_burn: OK"\n')
    cfg = Config()
    cfg.analysis.extra_rules = str(site)
    b = make_bundle(tmp_path / "b", {"job_id": "14"}, stdout="gpu_burn: FAULTY GPU 1\n")
    syms, _ = analyze(b, cfg)
    assert [s.id for s in syms] == ["site.burn_failed"]
