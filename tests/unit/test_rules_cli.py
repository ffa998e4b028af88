"""`sattr rules test` and `sattr rules list`, and the generated docs/rules.md."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from slurm_attr.cli import main
from slurm_attr.rules import build_catalog
from slurm_attr.rules.catalogdoc import render_markdown

REPO = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_rules_cli_test_passes_on_the_catalog():
    res = run("rules", "test")
    assert res.exit_code == 0, res.output
    last = res.output.strip().splitlines()[-1]
    passed, failed = last.split(" passed, ")
    assert int(passed) > 400 and failed == "0 failed"


def test_rules_cli_test_fails_on_a_broken_site_rule(tmp_path):
    (tmp_path / "site.bad.toml").write_text(
        'id = "site.bad"\nstatus = "stable"\npriority = 50\nrole = "root"\ncause = "user_error"\n'
        'sources = ["stdout"]\nkeywords = ["widget"]\nregex = \'widget broke\'\n'
        '[[cases]]\nmatch = "widget fine"\n[[cases]]\nnomatch = "gadget broke"\n')
    res = run("rules", "test", "--extra", str(tmp_path))
    assert res.exit_code == 1
    assert "FAIL site.bad case 1 (match)" in res.output and res.output.strip().endswith("1 failed")


def test_rules_cli_test_runs_fixture_dirs(tmp_path):
    (tmp_path / "x.log").write_text("#@ source: kernel\nnfs: server a not responding, still trying\n#@ expect fs.lustre_error\n")
    res = run("rules", "test", "--fixtures", str(tmp_path))
    assert res.exit_code == 1 and "x.log" in res.output


def test_rules_cli_list_text_names_every_rule():
    res = run("rules", "list")
    assert res.exit_code == 0
    for rid in ("gpu.xid", "torch.watchdog_timeout", "job.timeout", "gpu.xid_recurrent"):
        assert rid in res.output


def test_rules_docs_are_generated_and_up_to_date():
    # docs/rules.md is never edited by hand: regenerate with `sattr rules list --format markdown > docs/rules.md`
    doc = (REPO / "docs" / "rules.md").read_text()
    assert doc == render_markdown(build_catalog(check=False))
    res = run("rules", "list", "--format", "markdown")
    assert res.output == doc


def test_rules_cli_commands_have_help():
    for cmd in (["rules"], ["rules", "test"], ["rules", "list"]):
        res = run(*cmd, "--help")
        assert res.exit_code == 0 and "Example:" in res.output
