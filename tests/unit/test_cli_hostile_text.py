"""Issue 21 item 5: what a job wrote reaches no terminal raw, through every command that shows it.

Every job-derived field of a verdict, a live findings document and a Flight Recorder dump is
filled with escape sequences (CSI, OSC with BEL, 8-bit CSI), bidi controls and newlines; the
bytes each command prints must hold no control character but our own colour codes, show the
injected text visibly escaped, and keep ordinary UTF-8 (``/home/ü/train.py``, CJK) as it is.
"""
from __future__ import annotations

import json
import re
import unicodedata

import pytest
from click.testing import CliRunner

from slurm_attr import access
from slurm_attr.cli import fr as fr_cli
from slurm_attr.cli import jobs as jobs_cli
from slurm_attr.cli import main
from slurm_attr.cli import ops as ops_cli
from slurm_attr.flightrec.matrixhtml import render_html
from slurm_attr.flightrec.matrix import Matrix
from slurm_attr.live import findings
from slurm_attr.live.hang import frdetect
from slurm_attr.live import livespool as live_store
from slurm_attr.model import Action, Coverage, Evidence, Symptom, Verdict, Status
from slurm_attr.store import Store

from test_drain_fakes import FakeSlurm

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
EVIL = "\x1b[2K\x1b[1A\x1b]0;pwned\x07\x9b31m\u202eevil\u2066\r\n" + XID
SGR = re.compile(rb"\x1b\[[0-9;]*m")
UTF8 = "/home/ü/train.py 训练"


def h(tag: str) -> str:
    """A hostile value that says which field it was, so a miss names the field."""
    return f"<{tag}>{EVIL}"


def no_raw(text: str) -> None:
    """No character a terminal would act on or hide: C0, DEL, C1, bidi and format controls."""
    raw = sorted({f"U+{ord(c):04X}" for c in text if c not in "\n\t"
                  and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")})
    assert raw == [], raw


def check(out: bytes, color: bool, shown: bool = True) -> str:
    """The printed bytes hold no control character but our SGR colours (present exactly when
    colour is on), and, where ``shown``, the injected text as visible escapes. Returns the text."""
    assert bool(SGR.findall(out)) == color, out[:300]
    text = SGR.sub(b"", out).decode("utf-8")
    no_raw(text)
    if shown:
        assert "\\x1b[2K\\x1b[1A\\x1b]0;pwned\\x07\\x9b31m\\u202eevil\\u2066\\r\\n" in text
    return text


@pytest.fixture
def env(tmp_path, monkeypatch):
    cfg = tmp_path / "slurm_attr.toml"
    cfg.write_text(f'[paths]\ndatabase = "{tmp_path / "sattr.db"}"\nspool = "{tmp_path / "spool"}"\n'
                   f'evidence_root = "{tmp_path / "ev"}"\n[intake]\nqueue_dir = "{tmp_path / "pending"}"\n')
    monkeypatch.setattr(access, "caller", lambda: (0, "root"))
    monkeypatch.setattr(ops_cli, "default_backend", lambda *a, **k: FakeSlurm())
    monkeypatch.setattr(access, "default_backend", lambda *a, **k: FakeSlurm())  # accounting: no such job
    (tmp_path / "spool").mkdir()

    def run(*args: str, color: bool) -> bytes:
        for mod in (jobs_cli, fr_cli, ops_cli):  # what `sattr` decides from isatty()
            monkeypatch.setattr(mod, "use_color", lambda: color)
        res = CliRunner().invoke(main, ["--config", str(cfg), *args], color=color, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return res.stdout_bytes

    return type("Env", (), {"run": staticmethod(run), "tmp": tmp_path, "db": str(tmp_path / "sattr.db")})


def hostile_verdict(job_id: str) -> Verdict:
    root = Symptom(id="python.exception", cause="user_error", role="root", node=h("node"), rank=3, gpu=h("gpu"),
                   summary=h("summary"), status=Status(claim="contradicted", claim_note=h("claim_note")),
                   evidence=[Evidence(source="stdout", path=h("path") + UTF8, line=7, text=h("text"))])
    cascade = Symptom(id="torch.nccl_error", cause="network", role="cascade", node=h("cnode"), summary=h("csum"),
                      evidence=[Evidence(source="stderr", path="out", text=h("ctext"))])
    conf = Symptom(id="gpu.xid", cause="gpu_hardware", role="confirmation", node="n1", summary=h("xsum"),
                   status=Status(earlier=h("earlier")), evidence=[Evidence(source="kernel", path="k", text=h("ktext"))])
    return Verdict(job_id=job_id, cause="user_error", summary=h("vsummary"), culprit_nodes=[h("culprit")],
                   culprit_ranks=[3], culprit_gpus=[h("cgpu")], alternatives=[{"cause": "network", "why": h("why")}],
                   symptoms=[root, conf, cascade], coverage=[Coverage(source="stdout", node=h("covnode"),
                                                                      status="missing", detail=h("detail"))],
                   actions=[Action(kind="drain", node=h("anode"), reason=h("reason"), blocked_by=h("blocked"))])


def hostile_job(job_id: str) -> dict:
    return {"job_id": job_id, "user": h("user"), "uid": 0, "partition": h("part"), "nodes": [h("n")], "state": h("st"),
            "exit_code": 1, "signal": 0, "start_time": "2026-11-30T10:00:00+00:00",
            "end_time": "2026-11-30T10:12:34+00:00"}


@pytest.mark.parametrize("color", [True, False])
def test_verdict_of_sattr_job_and_the_operators_tables(env, color):
    v = hostile_verdict("41")
    store = Store(env.db)
    store.save(hostile_job("41"), v)
    store.record_actions("41", v.actions, path="central")
    out = env.run("41", color=color)
    text = check(out, color)
    for tag in ("vsummary", "summary", "claim_note", "path", "text", "culprit", "cgpu", "why", "detail", "covnode",
                "reason", "blocked", "anode", "user", "part", "st", "earlier", "ktext", "node", "gpu", "cnode"):
        assert f"<{tag}>\\x1b[2K" in text, tag
    assert UTF8 in text  # near miss: ordinary UTF-8 passes unchanged
    assert (b"\x1b[33muser_error (user)\x1b[0m" in out) == color  # our colour, on the data made printable
    assert not any(ln.lstrip().startswith("NVRM") for ln in text.splitlines())  # never a line of its own
    list_text = check(env.run("list", color=color), color, shown=False)  # the summary column is cut at 90
    assert "<vsummary>\\x1b[2K\\x1b[1A" in list_text and "<user>\\x1b[2K" in list_text
    for table, tag in (("drains", "reason"), ("nodes", "culprit")):  # tables with no colour of ours
        assert f"<{tag}>\\x1b[2K" in check(env.run(table, color=color), False, shown=False), table


def hostile_live_doc(job: str) -> dict:
    ranks = {0: {"enq": 6, "comp": 6, "pend": None, "node": "n1"},
             1: {"enq": 7, "comp": 6, "pend": f"{h('gloo:all_reduce')} #7", "node": "n2"}}
    fr = frdetect.finding(job, h("pg"), ranks, 9.0, 5.0, 1_700_000_000_000_000_000)
    stacks = [{"rank": 0, "node": h("snode"), "at": f"{h('/x/file')}:12 in {h('func')}", "inner": h("inner")},
              {"rank": 1, "node": "n2", "at": f"{UTF8}:3 in <module>"}]
    fr.update(stacks=stacks, behind={"class": "H1", "label": h("blabel"), "ranks": [1]},
              dumps={"requested": "2026-12-01T14:02:10+00:00", "reason": h("dreason"), "nodes_answered": 1, "nodes": 2},
              cancel={"done": False, "why": h("cwhy"), "ras": h("ras")})
    probe = {"class": "H0", "what": h("what"), "label": h("label"), "detected": "2026-12-01T14:02:10+00:00"}
    slow = {"kind": "slow", "title": h("title"), "what": h("swhat"), "class": "S1"}
    return {"job": job, "step": "0", "findings": [fr, probe, slow], "coverage": h("coverage"),
            "dumps": [{"requested": "2026-12-01T14:02:11+00:00", "reason": "end", "stacks": stacks}]}


@pytest.mark.parametrize("color", [True, False])
def test_live_findings_of_sattr_live_and_sattr_job(env, color):
    live_store.ensure_job_dir(str(env.tmp / "spool"), "52")
    findings.save(str(env.tmp / "spool"), "52", "0", hostile_live_doc("52"), gid=None)
    for args in (("live", "52"), ("52",)):  # a running job: `sattr JOB` shows the live lines
        text = check(env.run(*args, color=color), False)  # these lines carry no colour of ours
        for tag in ("pg", "snode", "/x/file", "func", "blabel", "dreason", "cwhy", "ras", "what", "label", "title",
                    "swhat", "coverage"):
            assert f"<{tag}>\\x1b[2K" in text, (tag, args)
        assert f"is at {UTF8}" not in text  # near miss below: a path with a space is quoted whole,
        assert f'is at "{UTF8}":3 in <module>' in text  # its UTF-8 as it is, <module> a bare token
        headline = next(ln for ln in text.splitlines() if "never entered" in ln)
        # the FR name is the job's words, in quotes on the headline's own line: never a line of ours
        assert 'never entered "<gloo:all_reduce>\\x1b[2K' in headline and headline.startswith("job 52: hang detected")
        assert not any(ln.startswith(("NVRM", "job 52: NVRM")) for ln in text.splitlines())


def test_plain_fr_names_stay_as_they_were():
    """Near miss: the quoting leaves the usual names and stack lines exactly as before."""
    ranks = {0: {"enq": 3, "comp": 3, "pend": None, "node": "n1"},
             1: {"enq": 4, "comp": 3, "pend": "gloo:all_reduce #4", "node": "n2"}}
    f = frdetect.finding("9", "0", ranks, 9.0, 5.0, 1_700_000_000_000_000_000)
    assert f["what"] == "never entered gloo:all_reduce #4" and f["label"] == "pg 0 (Flight Recorder)"
    f["stacks"] = [{"rank": 0, "node": "n1", "at": "/home/ü/train.py:9 in <module>"}]
    assert findings.stack_lines(f["stacks"]) == ["rank 0 (n1) is at /home/ü/train.py:9 in <module>"]


def _fr_entry(seq: int, name: str, desc: str) -> dict:
    return {"record_id": seq, "pg_id": 0, "process_group": ["0", desc], "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": name, "time_created_ns": 1000 + seq, "input_sizes": [[4]],
            "output_sizes": [[4]], "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "completed",
            "retired": True, "timeout_ms": 1000, "is_p2p": False, "thread_name": "python", "thread_id": "1"}


def write_fr_dumps(d) -> None:
    """Three ranks; rank 2 calls a collective named with escape sequences where the others reduce."""
    d.mkdir(parents=True)
    for rank in range(3):
        name = h("nccl:all_gather") if rank == 2 else "nccl:all_reduce"
        entries = [_fr_entry(1, "nccl:all_reduce", h("desc")), _fr_entry(2, name, h("desc"))]
        doc = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": h("desc"), "ranks": "[0, 1, 2]"}},
               "pg_status": {"0": {"last_enqueued_collective": 2, "last_started_collective": -1,
                                   "last_completed_collective": 2}}, "entries": entries}
        (d / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("color", [True, False])
def test_fr_matrix_of_a_hostile_dump(env, color):
    d = env.tmp / "dumps"
    write_fr_dumps(d)
    text = check(env.run("fr", str(d), "--all", color=color), color, shown=False)
    # the finding and its matrix are still shown; the job's names in the finding are its words
    finding = text.splitlines()[0]
    assert finding.startswith('[root] rank 2 called "all_gather>?[2K?[1A?]0;pwned'), finding  # FR's clean(): ?
    assert 'of PG 0 ("<desc>\\x1b[2K' in finding and "called all_reduce (collective #2)" in finding, finding
    assert "legend:" in text and re.search(r"\n +A +\= all_reduce \[4\] Float\n", text), text


def test_html_report_holds_no_raw_control_character():
    v = hostile_verdict("41").to_dict()
    s = Symptom(id="fr.collective_mismatch", cause="collective_mismatch", rank=2, node=h("frnode"), summary=h("frsum"),
                fields={"culprit_stack": [h("frame")], "first_differing_frame": {"culprit": h("fc"), "majority": "m"}},
                evidence=[Evidence(source="fr", path=h("frpath"), text=h("frtext"))])
    page = render_html(Matrix(legend={"A": h("legend")}), [s], [Coverage(source="fr", detail=h("cov"))],
                       title=h("title"), verdict=v)
    assert "\x1b" not in page and "\x07" not in page and "\u202e" not in page and "\x9b" not in page
    assert "&lt;frame&gt;\\x1b[2K" in page and "&lt;legend&gt;\\x1b[2K" in page and "&lt;title&gt;\\x1b[2K" in page
    assert "<pre>&lt;frame&gt;\\x1b[2K" in page  # a stack keeps its lines (block), only the controls are escaped
