"""The `sattr` command. Each command group lives in its own module and registers on `main`.

Only this package turns core errors into messages and exit codes.

Command modules are imported when a command of theirs runs, not at start: `sattr analyze`
must not pay for the database, Slurm or other commands' code it does not use (reanalysing
10,000 stored jobs is 10,000 start-ups). ``COMMANDS`` says which module holds a command;
a module missing from it (a new one) is still found, because an unknown name, ``--help``
and completion import every module of this package before answering.
"""
from __future__ import annotations

import importlib

import click

from .. import __version__

# command name -> the module of this package that defines it (a shortcut, not the registry)
COMMANDS = {
    "show": "jobs", "analyze": "jobs", "comments": "jobs",
    "fr": "fr", "report": "fr",
    "rules": "rules",
    "list": "ops", "reanalyze": "ops",
    "nodes": "fleet", "metrics": "fleet",
    "drains": "drains", "undrain": "drains", "breaker": "drains",
    "retry": "pending", "gc": "pending", "prune": "prune",
    "live": "live",
}
_NOT_COMMANDS = frozenset({"options"})  # helper modules of this package


def _command_modules() -> list[str]:
    import pkgutil  # here: only help, completion and an unknown name list the modules

    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if not m.name.startswith("_") and m.name not in _NOT_COMMANDS)


class _Commands(dict):
    """click's command registry, complete whenever someone enumerates it (help, docs, tests)
    while a lookup by name (``in``, ``get``) stays cheap and imports nothing itself."""

    loaded = False

    def load_all(self) -> None:
        if not self.loaded:
            self.loaded = True
            for name in _command_modules():
                importlib.import_module(f"{__name__}.{name}")  # registers through main.command

    def __iter__(self):
        self.load_all()
        return super().__iter__()

    def __len__(self) -> int:
        self.load_all()
        return super().__len__()

    def keys(self):
        self.load_all()
        return super().keys()

    def values(self):
        self.load_all()
        return super().values()

    def items(self):
        self.load_all()
        return super().items()


class _LazyJobIdGroup(click.Group):
    """Imports a command's module on first use; `sattr 1234` is short for `sattr show 1234`."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.commands = _Commands(self.commands)

    def _load_all(self) -> None:
        self.commands.load_all()  # type: ignore[attr-defined]

    def get_command(self, ctx, cmd_name):  # type: ignore[override]
        if cmd_name not in self.commands:
            module = COMMANDS.get(cmd_name)
            if module is not None:
                importlib.import_module(f"{__name__}.{module}")
            if cmd_name not in self.commands:
                self._load_all()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):  # type: ignore[override]
        self._load_all()
        return super().list_commands(ctx)

    def resolve_command(self, ctx, args):  # type: ignore[override]
        # A job id (no command name starts with a digit) goes to `show` without loading every module.
        if args and not args[0].startswith("-") and (args[0][:1].isdigit() or self.get_command(ctx, args[0]) is None):
            args = ["show", *args]
        return super().resolve_command(ctx, args)


@click.group(cls=_LazyJobIdGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sattr")
@click.option("--config", "config_path", envvar="SLURM_ATTR_CONFIG", type=click.Path(dir_okay=False),
              help="Config file (default /etc/slurm/slurm_attr.toml, or $SLURM_ATTR_CONFIG).")
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Why did this Slurm job fail? Verdicts with evidence, and safe automatic drains.

    Example:

        sattr 1234            # the verdict for job 1234

        sattr analyze DIR     # analyse an evidence bundle anywhere
    """
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path

