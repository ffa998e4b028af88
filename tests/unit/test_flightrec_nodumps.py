"""A bundle with no file where Flight Recorder dumps belong (most jobs: no torch, FR off) is
answered without the loader and the analysis: the same coverage the full path gives, and none
of their modules imported (they were a tenth of a one-log `sattr analyze`). Near miss: one
file in fr/ that is not a dump goes the full path and is reported as such."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from slurm_attr import flightrec
from slurm_attr.bundle import Bundle
from slurm_attr.config import Config
from slurm_attr.flightrec.report import inspect

BUNDLES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"
HEAVY = ("slurm_attr.flightrec.loader", "slurm_attr.flightrec.blame", "slurm_attr.flightrec.safepickle",
         "slurm_attr.flightrec.report")


def _cov(cov):
    return [(c.source, c.node, c.status, c.detail) for c in cov]


def test_no_dump_files_same_answer_as_the_full_path(tmp_path):
    b = Bundle(str(BUNDLES / "oom_slurm"))
    symptoms, cov = flightrec.analyze(b, Config())
    rep = inspect(b, Config())
    assert symptoms == rep.symptoms == []
    assert _cov(cov) == _cov(rep.coverage) == [("fr", None, "missing", "no Flight Recorder dumps found")]


def test_no_dump_files_imports_nothing_of_the_analysis():
    code = ("import sys, json; from slurm_attr import flightrec; from slurm_attr.bundle import Bundle; "
            "from slurm_attr.config import Config; "
            f"flightrec.analyze(Bundle({str(BUNDLES / 'oom_slurm')!r}), Config()); "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_a_file_that_is_no_dump_takes_the_full_path(tmp_path):
    b = tmp_path / "b"
    shutil.copytree(BUNDLES / "oom_slurm", b)
    (b / "nodes" / "cpu-001" / "fr").mkdir()
    (b / "nodes" / "cpu-001" / "fr" / "notes.txt").write_text("not a dump\n")
    symptoms, cov = flightrec.analyze(Bundle(str(b)), Config())
    assert symptoms == []
    assert [(c.status, c.detail) for c in cov] == [
        ("error", "1 file(s) where dumps belong, none named <prefix><rank> as torch names dumps")]


def test_lazy_names_resolve():
    assert flightrec.inspect is inspect
    assert flightrec.loader.DEFAULT_TAIL_ENTRIES == "auto"
    assert {n for n in flightrec.__all__ if n != "analyze"} <= set(flightrec._LAZY)
    for n in flightrec.__all__:
        assert getattr(flightrec, n) is not None
