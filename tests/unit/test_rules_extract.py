"""extract_lines: trust, attribution, multi-line blocks, line ownership, bad input."""
from __future__ import annotations

from slurm_attr.rules import extract_lines, load_catalog

CAT = load_catalog()
XID79 = "[Thu May  2 10:00:03 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python, GPU has fallen off the bus."


def lines(*texts: str, start: int = 1):
    return list(enumerate(texts, start))


def test_rules_trusted_source_carries_the_catalog_action():
    [s] = extract_lines(CAT, "kernel", "n3", "nodes/n3/kernel.log", lines(XID79))
    assert (s.id, s.trusted, s.action, s.node, s.gpu) == ("gpu.xid_79", True, "reboot", "n3", "0000:3b:00")
    assert s.time == "2024-05-02T10:00:03"
    assert s.evidence[0].path == "nodes/n3/kernel.log" and s.evidence[0].line == 1


def test_rules_untrusted_source_never_carries_an_action():
    # The job can print anything; an ECC error it reports may name a rank, never drain a node.
    [s] = extract_lines(CAT, "stdout", None, "output/stdout", lines("[rank6]: RuntimeError: CUDA error: uncorrectable ECC error encountered"))
    assert (s.cause, s.trusted, s.action, s.rank) == ("gpu_hardware", False, "none", 6)


def test_rules_kernel_only_rules_ignore_job_output():
    # An Xid line printed by the job into its own output is not kernel evidence: at most the
    # untrusted "the job saw a lost GPU" rule, without an action.
    syms = extract_lines(CAT, "stdout", None, "output/stdout", lines(XID79))
    assert [(s.id, s.trusted, s.action) for s in syms] == [("gpu.lost_in_output", False, "none")]


def test_rules_line_numbers_come_from_the_caller():
    syms = extract_lines(CAT, "kernel", "n1", "k", [(41, "noise"), (97, XID79)])
    assert syms[0].evidence[0].line == 97


def test_rules_multi_line_block_in_journal_format():
    text = ["Jan 21 10:23:45 n12 kernel: NVRM: The NVIDIA GPU 0000:41:00.0",
            "Jan 21 10:23:45 n12 kernel: NVRM: (PCI ID: 10de:2330) installed in this system has",
            "Jan 21 10:23:45 n12 kernel: NVRM: fallen off the bus and is not responding to commands.",
            "Jan 21 10:23:46 n12 kernel: nvidia: probe of 0000:41:00.0 failed with error -1"]
    [s] = extract_lines(CAT, "kernel", "n12", "k", lines(*text, start=10))
    assert s.id == "gpu.fallen_off_bus" and s.gpu == "0000:41:00"
    assert [e.line for e in s.evidence] == [10, 11, 12]


def test_rules_multi_line_block_split_across_the_window_does_not_match():
    text = ["[ 1.0] NVRM: The NVIDIA GPU 0000:41:00.0", "[ 1.1] unrelated", "[ 1.2] unrelated",
            "[ 1.3] NVRM: fallen off the bus and is not responding to commands."]
    assert [s.id for s in extract_lines(CAT, "kernel", "n", "k", lines(*text))] == []


def test_rules_highest_priority_rule_owns_a_line():
    # The watchdog carries the CUDA error: the CUDA rule (the actual signal) owns the line.
    line = "  what():  NCCL watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered"
    assert [s.id for s in extract_lines(CAT, "stderr", None, "e", lines(line))] == ["cuda.illegal_address"]


def test_rules_repeats_are_folded_with_a_count():
    line = "pcieport 0000:3a:00.0: AER: Corrected error received: 0000:3a:00.0"
    [s] = extract_lines(CAT, "kernel", "n1", "k", lines(*[line] * 50))
    assert s.id == "host.pcie_aer_corrected" and s.fields["occurrences"] == 50 and len(s.evidence) == 5


def test_rules_a_flood_does_not_hide_a_later_finding():
    flood = [f"pcieport 0000:{i % 256:02x}:00.0: AER: Corrected error received: 0000:3a:00.0" for i in range(20000)]
    syms = extract_lines(CAT, "kernel", "n1", "k", lines(*flood, XID79))
    assert "gpu.xid_79" in {s.id for s in syms}


def test_rules_rank_prefixes_of_launchers():
    out = ["3: RuntimeError: CUDA error: an illegal memory access was encountered",
           "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity of 79 GiB",
           "[1,7]<stderr>:ValueError: bad shape"]
    got = sorted((s.id, s.rank) for s in extract_lines(CAT, "stdout", None, "o", lines(*out)))
    assert got == [("cuda.illegal_address", 3), ("cuda.oom", 5), ("python.exception", 7)]


def test_rules_rank_from_torch_prefix_then_default_pg_tag_then_task_label():
    wd = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600009 milliseconds before timing out."
    cases = [
        (f"0: [Rank 12] {wd}", 12),  # srun task 0 runs torchrun: the message names the rank
        (f"[rank9]:[E0502 10:00:00.1 ProcessGroupNCCL.cpp:616] [PG ID 3 PG GUID 3(TP) Rank 1] {wd}", 9),
        (f"3: [PG ID 2 PG GUID 2(DP) Rank 1] {wd}", 3),  # a sub-group's rank is not global: fall back
        (f"[PG ID 0 PG GUID 0(default_pg) Rank 5] {wd}", 5),
    ]
    for line, rank in cases:
        [s] = extract_lines(CAT, "stdout", None, "o", lines(line))
        assert s.rank == rank, line


def test_rules_nccl_prefix_names_host_and_device():
    line = "gpu-017:12345:12400 [3] NCCL WARN NET/IB : Got completion from peer 10.0.0.12<51234> with status=12 opcode=0 len=0 vendor err 129 (Send)"
    [s] = extract_lines(CAT, "nccl", None, "n", lines(line))
    assert (s.fields["host"], s.fields["cuda_dev"], s.cause) == ("gpu-017", 3, "network")


def test_rules_near_misses_from_the_research_do_not_match():
    near = ["INFO: configured wall-time limit is 04:00:00", "slurmstepd: error: Exceeded job memory limit at some point.",
            "/var/spool/slurmd/job1/slurm_script: line 22: 443552 Killed                  python main.py",
            "mlx5_core 0000:53:00.0 mlx5_3: Port: 1 Link ACTIVE", "nfs: server nfs01 OK"]
    syms = extract_lines(CAT, "stdout", None, "o", lines(*near)) + extract_lines(CAT, "kernel", "n", "k", lines(*near))
    assert [s for s in syms if s.role in ("root", "confirmation")] == []


def test_rules_binary_and_invalid_utf8_do_not_crash():
    junk = [b"\x00\xff\xfe\x80garbage\x00".decode("latin-1"), "\udcff\udcfe broken surrogate", "\x00" * 100]
    syms = extract_lines(CAT, "kernel", "n", "k", lines(*junk, XID79))
    assert [s.id for s in syms] == ["gpu.xid_79"]


def test_rules_huge_line_is_cut_not_fatal():
    big = "x" * (2 << 20) + " NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    syms = extract_lines(CAT, "kernel", "n", "k", lines(big, XID79))
    # the hit past the 16 KB cut is not seen (as bundle.lines would cut it); the next line is
    assert [(s.id, s.evidence[0].line) for s in syms] == [("gpu.xid_79", 2)]


def test_rules_entries_with_embedded_newlines_keep_their_numbering():
    syms = extract_lines(CAT, "kernel", "n", "k", [(5, "first\nsecond"), (6, XID79)])
    assert syms[0].evidence[0].line == 6
