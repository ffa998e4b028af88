"""`sattr rules`: check the rule catalog against its examples, and document it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import click

from . import main
from .options import handle_errors, load_config

# In a checkout the real-format log fixtures sit beside the package.
_CHECKOUT_FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "logs"


def _extra_dir(ctx: click.Context, extra: Optional[str]) -> Optional[str]:
    if extra:
        return extra
    return load_config(ctx).analysis.extra_rules or None


@main.group("rules")
def rules_group() -> None:
    """The rule catalog: test it against its examples, list it.

    Example:

        sattr rules test

        sattr rules list --format markdown > docs/rules.md
    """


@rules_group.command("test")
@click.option("--extra", "extra", type=click.Path(file_okay=False, exists=True),
              help="Site rule directory (default: [analysis] extra_rules of the config).")
@click.option("--fixtures", "fixtures", multiple=True, type=click.Path(file_okay=False, exists=True),
              help="Directory of marked log fixtures; repeatable (default: tests/fixtures/logs of a checkout).")
@click.option("-v", "--verbose", is_flag=True, help="Print every case, not only failures.")
@click.pass_context
@handle_errors
def test_cmd(ctx: click.Context, extra: Optional[str], fixtures: tuple[str, ...], verbose: bool) -> None:
    """Run every rule's inline cases and every fixture; exit 1 if any fails.

    Example:

        sattr rules test --extra /etc/slurm/slurm_attr.rules.d
    """
    from ..rules import build_catalog
    from ..rules.selftest import run_all

    catalog = build_catalog(_extra_dir(ctx, extra), check=False)  # run_all reports every case, not the first
    dirs = list(fixtures) or ([str(_CHECKOUT_FIXTURES)] if _CHECKOUT_FIXTURES.is_dir() else [])
    results = run_all(catalog, dirs)
    failed = [r for r in results if not r.ok]
    for r in results if verbose else failed:
        status = "ok  " if r.ok else "FAIL"
        click.echo(f"{status} {r.name} ({os.path.relpath(r.path) if os.path.isabs(r.path) else r.path})"
                   + (f": {r.detail}" if r.detail else ""))
    click.echo(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if failed:
        ctx.exit(1)


@rules_group.command("list")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown"]), default="text", show_default=True,
              help="A terminal table, or the Markdown catalog (docs/rules.md).")
@click.option("--extra", "extra", type=click.Path(file_okay=False, exists=True),
              help="Site rule directory (default: [analysis] extra_rules of the config).")
@click.pass_context
@handle_errors
def list_cmd(ctx: click.Context, fmt: str, extra: Optional[str]) -> None:
    """List every rule; the Markdown form is the generated catalog document.

    Example:

        sattr rules list --format markdown > docs/rules.md
    """
    from ..rules import build_catalog
    from ..rules.catalogdoc import render_markdown, render_text

    catalog = build_catalog(_extra_dir(ctx, extra), check=True)
    click.echo(render_markdown(catalog) if fmt == "markdown" else render_text(catalog), nl=False)
