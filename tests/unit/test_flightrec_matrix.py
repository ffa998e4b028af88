"""The divergence matrix, its terminal rendering, the HTML report and the two commands."""
from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_attr import flightrec
from slurm_attr.cli import main
from slurm_attr.flightrec.matrixhtml import render_html
from slurm_attr.flightrec.matrix import NOT_REACHED, build_matrix, render_text

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
ANSI = re.compile(r"\x1b\[")


def _fixture(shared: Path, case: str) -> str:
    return str(shared / "flight_recorder" / "gloo" / case)


def test_matrix_marks_culprit_and_divergent_column(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(_fixture(shared_fixtures, "s4_size_mismatch"))
    m = build_matrix(rep.dumps, rep.analysis)
    (p,) = m.panels
    assert (p.pg, p.role, p.divergent_seq) == ("0", "root", 6)
    assert p.seqs == [1, 2, 3, 4, 5, 6]
    assert [r.ranks for r in p.rows] == [[0, 1, 2], [3]]  # identical rows folded
    culprit = [(r.ranks, i) for r in p.rows for i, c in enumerate(r.cells) if c.culprit]
    assert culprit == [([3], p.divergent_col)]
    sym = p.rows[1].cells[-1].sym
    assert m.legend[sym] == "all_reduce [1000] Float"
    assert m.legend[p.rows[0].cells[-1].sym] == "all_reduce [1024] Float"


def test_matrix_not_reached_cells(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(_fixture(shared_fixtures, "s5_stuck_compute"))
    (p,) = build_matrix(rep.dumps, rep.analysis).panels
    stuck = next(r for r in p.rows if r.ranks == [0])
    assert stuck.culprit and stuck.cells[-1].sym == NOT_REACHED and stuck.cells[-1].culprit


def test_render_text_plain_and_color(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(_fixture(shared_fixtures, "s6_subgroup_mismatch"))
    m = build_matrix(rep.dumps, rep.analysis)
    plain = render_text(m, color=False)
    assert not ANSI.search(plain)
    assert "PG 1 (TP0), 2 ranks: root cause" in plain and "B!" in plain and "legend:" in plain
    assert "A = all_reduce [64] Float" in plain and "B = all_reduce [32] Float" in plain
    colored = render_text(m, color=True)
    assert ANSI.search(colored) and "\x1b[0m" in colored
    # the divergent column is marked above the header
    lines = plain.splitlines()
    i = lines.index(next(ln for ln in lines if ln.startswith(" ranks")))
    assert lines[i - 1].strip() == "v"


def test_all_groups_and_healthy(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(_fixture(shared_fixtures, "s1_healthy"))
    assert render_text(build_matrix(rep.dumps, rep.analysis)).startswith("No divergence")
    m = build_matrix(rep.dumps, rep.analysis, all_groups=True)
    assert [p.role for p in m.panels] == ["ok"] and m.panels[0].rows[0].ranks == [0, 1, 2, 3]


def test_big_group_folds_to_two_rows(tmp_path: Path) -> None:
    def entry(seq: int, size: int) -> dict:
        return {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq, "p2p_seq_id": 0,
                "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": seq, "input_sizes": [[size]],
                "output_sizes": [[size]], "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "scheduled",
                "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": False,
                "timeout_ms": 1, "is_p2p": False, "thread_name": "t", "thread_id": "1"}
    for r in range(256):
        data = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(256)))}},
                "pg_status": {}, "entries": [entry(s, 3 if (r == 77 and s == 4) else 4) for s in range(1, 6)]}
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(data, protocol=2))
    rep = flightrec.inspect(str(tmp_path))
    (p,) = build_matrix(rep.dumps, rep.analysis).panels
    assert [r.label for r in p.rows] == ["0-76,78-255", "77"]


def test_html_is_self_contained_and_escaped(shared_fixtures: Path) -> None:
    rep = flightrec.inspect(_fixture(shared_fixtures, "s6_subgroup_mismatch"))
    page = render_html(build_matrix(rep.dumps, rep.analysis), rep.symptoms, rep.coverage, title="t <x>")
    assert page.startswith("<!DOCTYPE html>") and "<title>t &lt;x&gt;</title>" in page
    assert not re.search(r"(src|href)=|https?://|<link|<script", page)
    assert 'class="cell s1 culprit divcol"' in page
    assert '<th class="divergent" title="first divergence">▼ 3</th>' in page
    assert "fr.collective_mismatch" in page and "fr.downstream_hang" in page


def test_cli_fr_and_json(shared_fixtures: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["fr", _fixture(shared_fixtures, "s2_skip")])
    assert res.exit_code == 0, res.output
    assert "[root] rank 2 skipped all_reduce [1] Float" in res.output
    assert "first differing frame:" in res.output and not ANSI.search(res.output)
    res = runner.invoke(main, ["fr", _fixture(shared_fixtures, "s2_skip"), "--json"])
    data = json.loads(res.output)
    assert [(s["id"], s["rank"]) for s in data["symptoms"]] == [("fr.collective_mismatch", 2)]
    panel = data["matrix"]["panels"][0]
    assert panel["divergent_seq"] == 7 and [r["ranks"] for r in panel["rows"]] == [[0, 1, 3], [2]]
    assert panel["rows"][1]["cells"][-1].endswith("!")


def test_cli_resolves_job_ids_through_the_spool(shared_fixtures: Path, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    shutil.copytree(_fixture(shared_fixtures, "s3_op_mismatch"), spool / "bundles" / "1234")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\nspool = "{spool}"\n')
    runner = CliRunner()
    res = runner.invoke(main, ["--config", str(cfg), "fr", "1234"])
    assert res.exit_code == 0, res.output
    assert "rank 1 called all_gather" in res.output
    res = runner.invoke(main, ["--config", str(cfg), "fr", "999"])
    assert res.exit_code == 4 and "no bundle for job 999" in res.output


def test_cli_report_html(shared_fixtures: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", _fixture(shared_fixtures, "s4_size_mismatch"), "--html", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert re.findall(r'class="(cell[^"]*culprit[^"]*)"', page) == ["cell s3 culprit divcol", "cell culprit"]  # the cell, the legend
    assert "No verdict: not a bundle" in page


def test_commands_have_help() -> None:
    for cmd in ("fr", "report"):
        res = CliRunner().invoke(main, [cmd, "--help"])
        assert res.exit_code == 0 and "Example:" in res.output


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: cannot render the HTML report headless")
def test_culprit_cell_is_highlighted_in_a_browser(shared_fixtures: Path, tmp_path: Path) -> None:
    """Render the report in headless Chromium; read computed colours back through the DOM."""
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", _fixture(shared_fixtures, "s6_subgroup_mismatch"), "--html", str(out)])
    assert res.exit_code == 0, res.output
    probe = """<script>
    const cul = document.querySelector('td.cell.culprit');
    const ok = document.querySelector('td.cell:not(.culprit)');
    const th = document.querySelector('th.divergent');
    document.body.dataset.culpritBg = getComputedStyle(cul).backgroundColor;
    document.body.dataset.normalBg = getComputedStyle(ok).backgroundColor;
    document.body.dataset.divergentBg = getComputedStyle(th).backgroundColor;
    document.body.dataset.culpritText = cul.textContent;
    </script>"""
    probed = tmp_path / "probed.html"
    probed.write_text(out.read_text().replace("</body>", probe + "</body>"))
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                               "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                               "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', proc.stdout))
    assert attrs["culprit-bg"] == "rgb(227, 74, 51)"  # the culprit fill, not the signature colour
    assert attrs["normal-bg"] != attrs["culprit-bg"]
    assert attrs["divergent-bg"] == "rgb(255, 243, 196)"
    assert attrs["culprit-text"] == "B"


def test_report_on_a_bundle_includes_the_verdict(shared_fixtures: Path, tmp_path: Path, monkeypatch) -> None:
    from slurm_attr.cli import fr as fr_cli
    b = tmp_path / "b"
    (b / "nodes" / "n1" / "fr").mkdir(parents=True)
    for r in range(4):
        shutil.copy(Path(_fixture(shared_fixtures, "s4_size_mismatch")) / f"nccl_trace_rank_{r}", b / "nodes" / "n1" / "fr")
    (b / "job.json").write_text(json.dumps({"job_id": "31", "ranks": {str(r): "n1" for r in range(4)}}))
    seen = []

    def fake(path, cfg):
        seen.append(path)
        return {"job_id": "31", "cause": "collective_mismatch", "domain": "user", "summary": "rank 3 <b>size</b>",
                "culprit": {"nodes": ["n1"], "ranks": [3], "gpus": []}}, ""

    monkeypatch.setattr(fr_cli, "_verdict", fake)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(b), "--html", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert seen == [str(b)]
    assert "<title>slurm-attr report: 31</title>" in page
    assert '<p class="verdict"><b>collective_mismatch</b> (user): rank 3 &lt;b&gt;size&lt;/b&gt;</p>' in page
    assert "Culprit nodes: n1; ranks: 3" in page


def test_verdict_failure_leaves_the_fr_report(monkeypatch, tmp_path: Path) -> None:
    import slurm_attr.bundleanalysis as pipeline
    from slurm_attr.cli import fr as fr_cli
    from slurm_attr.config import Config

    def boom(path, cfg, history=None):
        raise RuntimeError("store offline")

    monkeypatch.setattr(pipeline, "run_bundle", boom)
    verdict, why = fr_cli._verdict(str(tmp_path), Config())
    assert verdict is None and "RuntimeError: store offline" in why
