"""render.verdict_text's colours: click's styles on a terminal, none otherwise."""
from __future__ import annotations

from slurm_attr import render
from slurm_attr.model import Verdict

JOB = {"job_id": "7", "user": "alice", "partition": "debug", "nodes": ["n1"], "state": "FAILED",
       "start_time": "2026-11-30T10:00:00+00:00", "end_time": "2026-11-30T10:12:34+00:00"}


def test_render_colours_the_verdict_by_domain_and_bolds_the_title():
    text = render.verdict_text(Verdict(job_id="7", cause="gpu_hardware", summary="GPU fell off"), JOB, color=True)
    assert "Verdict: \x1b[31mgpu_hardware (hardware)\x1b[0m" in text
    assert "\x1b[1m" + "Job 7: why it ended (slurm-attr)".center(72).rstrip() + "\x1b[0m" in text
    user = render.verdict_text(Verdict(job_id="7", cause="user_error", summary="oops"), JOB, color=True)
    assert "Verdict: \x1b[33muser_error (user)\x1b[0m" in user  # near miss: another domain, another colour


def test_render_without_colour_is_plain_text():
    v = Verdict(job_id="7", cause="gpu_hardware", summary="GPU fell off")
    plain = render.verdict_text(v, JOB)
    assert "\x1b" not in plain and "Verdict: gpu_hardware (hardware)" in plain
    assert render.in_domain_color("x", "network", color=False) == "x"
    assert render.in_domain_color("x", "network") == "\x1b[35mx\x1b[0m"
