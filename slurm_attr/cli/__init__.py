"""The `sattr` command. Each command group lives in its own module and registers on `main`.

Only this package turns core errors into messages and exit codes.
"""
from __future__ import annotations

import click

from .. import __version__


class _JobIdGroup(click.Group):
    """`sattr 1234` is short for `sattr show 1234`."""

    def resolve_command(self, ctx, args):  # type: ignore[override]
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["show", *args]
        return super().resolve_command(ctx, args)


@click.group(cls=_JobIdGroup, context_settings={"help_option_names": ["-h", "--help"]})
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


# Command modules register themselves on import.
from . import fr, jobs, ops, rules  # noqa: E402,F401
