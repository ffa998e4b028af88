"""Issue 21 item 7: with slurmdbd stopped, the pyslurm backend says so once per outage, not per call.

pyslurm 22.5's accounting calls raised ``TypeError: an integer is required`` on every call while
slurmdbd was stopped (99 warnings in one run); each still falls back to the CLI.
"""
from __future__ import annotations

import logging

import pytest

from slurm_attr.slurm import outages
from slurm_attr.slurm import pyslurm_backend as pb

from test_slurm_backend import FakeJobs, FakeNode, backend, finished_job, node


@pytest.fixture
def fresh(monkeypatch, caplog):
    """A process that has seen no outage yet, its log captured from DEBUG up."""
    tracker = outages.Outages()
    monkeypatch.setattr(pb, "OUTAGES", tracker)
    caplog.set_level(logging.DEBUG, logger="slurm_attr")
    return tracker


def _lines(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and "pyslurm" in r.getMessage()]


def _dbd_down(flt):
    raise TypeError("an integer is required")


def test_one_warning_per_outage_and_one_line_when_it_ends(fresh, caplog, monkeypatch):
    b, cli = backend()
    working = FakeJobs.__dict__["load"]
    monkeypatch.setattr(FakeJobs, "load", classmethod(lambda cls, flt: _dbd_down(flt)))
    for i in range(99):
        b.sacct_job(str(40 + i))
    assert len(cli.calls) == 99 and cli.calls[0] == ("sacct_job", "40")  # every call still answered by the CLI
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert "accounting calls fail" in warnings[0] and "TypeError: an integer is required" in warnings[0]
    assert len(_lines(caplog, logging.DEBUG)) == 98
    assert _lines(caplog, logging.INFO) == []
    # slurmdbd is back: one line says so, with how many calls failed
    monkeypatch.setattr(FakeJobs, "load", working)
    FakeJobs.rows = [finished_job(41)]
    assert b.sacct_job("41")["JobIDRaw"] == "41"
    infos = _lines(caplog, logging.INFO)
    assert len(infos) == 1 and "accounting calls work again, after 99 failure(s)" in infos[0], infos
    # a second outage is a new one: logged again, once
    monkeypatch.setattr(FakeJobs, "load", classmethod(lambda cls, flt: _dbd_down(flt)))
    b.sacct_job("41")
    b.sacct_job("41")
    assert len(_lines(caplog, logging.WARNING)) == 2


def test_near_miss_calls_that_work_log_nothing(fresh, caplog):
    b, _cli = backend()
    FakeJobs.rows = [finished_job(41)]
    FakeNode.table = {"n1": node("n1", "IDLE")}
    for _ in range(5):
        assert b.sacct_job("41")["JobIDRaw"] == "41"
        assert b.show_node("n1")["NodeName"] == "n1"
    assert [r for r in caplog.records if "pyslurm" in r.getMessage()] == []


def test_controller_and_accounting_outages_are_told_apart(fresh, caplog, monkeypatch):
    """slurmctld's calls failing says nothing about slurmdbd's, and the other way round."""
    b, _cli = backend()
    monkeypatch.setattr(FakeNode, "load", classmethod(lambda cls, name: (_ for _ in ()).throw(TypeError("bad"))))
    b.show_node("n1")
    b.show_node("n1")
    FakeJobs.rows = [finished_job(41)]
    b.sacct_job("41")  # accounting works: no recovery line for the controller's outage
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 1 and "controller calls fail" in warnings[0]
    assert _lines(caplog, logging.INFO) == []
