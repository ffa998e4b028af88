import time

from slurm_attr.collect import kernel


def _iso(t):
    s = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))
    return s[:-2] + ":" + s[-2:]


def test_window_keeps_lines_in_range_and_untimed(tmp_path):
    now = time.time()
    text = (f"{_iso(now - 7200)} h kernel: old line\n"
            f"{_iso(now - 10)} h kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
            "no timestamp here\n").encode()
    out = kernel.filter_window(text, now - 60, now + 60)
    assert b"old line" not in out and b"Xid" in out and b"no timestamp" in out


def test_dmesg_T_and_syslog_formats():
    t = time.mktime((2026, 11, 30, 16, 0, 0, 0, 0, -1))
    assert kernel.line_time("[Mon Nov 30 16:00:00 2026] NVRM: Xid", 2026) == t
    assert kernel.line_time("Nov 30 16:00:00 host kernel: x", 2026) == t
    assert kernel.line_time("2026-11-30T16:00:00+00:00 host kernel: x", 2026) == 1796054400.0
    assert kernel.line_time("[ 1234.5678] x", 2026) is None


def test_file_source_missing_is_coverage(tmp_path):
    w = kernel.read_window("file", str(tmp_path / "%n.log"), "n9", 0, time.time(), 1000, 5)
    assert w.status == "missing" and w.text == b""


def test_file_source_cap(tmp_path):
    (tmp_path / "n1.log").write_bytes(b"line\n" * 1000)
    w = kernel.read_window("file", str(tmp_path / "%n.log"), "n1", 0, time.time(), 100, 5)
    assert w.status == "truncated" and len(w.text) <= 100
