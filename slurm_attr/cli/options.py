"""What every command shares: config loading, error mapping, --json."""
from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable

import click

from .. import config as config_mod
from ..errors import ConfigError, NotFound, PermissionDenied, SattrError

# Exit codes: 1 generic failure, 2 usage (click), 3 config error, 4 not found, 5 permission denied.
EXIT_CONFIG = 3
EXIT_NOT_FOUND = 4
EXIT_DENIED = 5


class _Fail(click.ClickException):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.exit_code = code


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the core's typed errors into one-line messages with distinct exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as err:
            raise _Fail(f"config: {err}", EXIT_CONFIG) from err
        except NotFound as err:
            raise _Fail(str(err), EXIT_NOT_FOUND) from err
        except PermissionDenied as err:
            raise _Fail(str(err), EXIT_DENIED) from err
        except SattrError as err:
            raise _Fail(str(err), 1) from err

    return wrapper


def load_config(ctx: click.Context) -> config_mod.Config:
    root = ctx.find_root()
    path = (root.obj or {}).get("config_path")
    return config_mod.load(path)


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def use_color() -> bool:
    return sys.stdout.isatty()
