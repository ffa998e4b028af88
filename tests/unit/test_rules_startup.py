"""Start-up: `sattr analyze` imports only what it uses; commands load on first use."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

from slurm_attr.cli import COMMANDS, main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "xid79_cascade"
HEAVY = ("sqlite_utils", "slurm_attr.store", "slurm_attr.rules.selftest", "slurm_attr.cli.ops", "slurm_attr.cli.drains",
         "slurm_attr.cli.fr",
         "slurm_attr.cli.rules", "slurm_attr.cli.pending")


def _loaded_after(args):
    code = (
        "import io, json, sys, contextlib\n"
        "from slurm_attr.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    try: main({args!r}, standalone_mode=False)\n"
        "    except SystemExit: pass\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({HEAVY!r}))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_rules_analyze_loads_no_database_or_other_commands():
    assert _loaded_after(["analyze", str(FIXTURE), "--json"]) == []


def test_rules_other_commands_still_load_their_module():
    # near miss of the above: the same probe does see a command module that was used
    assert "slurm_attr.cli.drains" in _loaded_after(["breaker", "--help"])


def test_rules_command_map_matches_the_modules():
    ctx = click.Context(main)
    names = main.list_commands(ctx)
    assert len(names) >= 10
    for name in names:
        cmd = main.get_command(ctx, name)
        module = (cmd.callback.__module__ if cmd.callback else "").rsplit(".", 1)[-1]
        if name in COMMANDS:
            assert COMMANDS[name] == module, name


def test_rules_job_id_still_means_show():
    ctx = click.Context(main)
    name, cmd, rest = main.resolve_command(ctx, ["1234", "--json"])
    assert (name, rest) == ("show", ["1234", "--json"])
    assert main.resolve_command(ctx, ["analyze", "x"])[0] == "analyze"
