"""Where the catalog's rules come from: the TOML files of the built-in rule book (the
repository's rules/, installed as the package slurm_attr.rulebook) and of a site's rule
directory, and the names of the rule book's Python modules. catalog.py validates them.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Iterator, Optional

from ..errors import RuleError

RULEBOOK = "slurm_attr.rulebook"
POLICY_FILE = "policy.toml"  # the cause policy beside the rules (reason/policy.py), not a rule


def toml_files(root: Any) -> Iterator[tuple[str, bytes]]:
    """(display path, bytes) of every *.toml below a Traversable or directory, sorted."""
    stack = [(root, "")]
    found = []
    while stack:
        node, rel = stack.pop()
        for child in node.iterdir():
            name = child.name
            if name.startswith((".", "_")):
                continue
            if child.is_dir():
                stack.append((child, f"{rel}{name}/"))
            elif name.endswith(".toml"):
                found.append((f"{rel}{name}", child))
    for rel, child in sorted(found, key=lambda t: t[0]):
        yield rel, child.read_bytes()


def rulebook_root() -> Any:
    """The built-in catalog's directory: the package's own path when it is a directory (as
    installed, or editable), without importing importlib.resources' readers (~10 ms of every
    start); its Traversable otherwise (a zipped install)."""
    pkg = importlib.import_module(RULEBOOK)
    for path in getattr(pkg, "__path__", None) or ():
        if os.path.isdir(path):
            return Dir(path)
    from importlib import resources

    return resources.files(RULEBOOK)


def rule_files(extra_dir: Optional[str]) -> list[tuple[str, bytes]]:
    """(display path, bytes) of every TOML rule: the built-in catalog (not its cause policy,
    reason/policy.py's table), then the site's."""
    files = [(f"rules/{rel}", raw) for rel, raw in toml_files(rulebook_root()) if rel != POLICY_FILE]
    if extra_dir:
        if not os.path.isdir(extra_dir):
            raise RuleError(f"{extra_dir}: site rule directory does not exist")
        # Site rules are declarative only: a config path must never make root run Python.
        label = extra_dir.rstrip("/")
        files += [(f"{label}/{rel}", raw) for rel, raw in toml_files(Dir(extra_dir))]
    return files


def module_names() -> list[str]:
    """The Python rule modules of the built-in catalog (``rules/*.py``), by name, sorted."""
    return sorted(c.name[:-3] for c in rulebook_root().iterdir() if c.name.endswith(".py") and not c.name.startswith("_"))


class Dir:
    """A plain directory with the little of importlib's Traversable that toml_files uses."""

    def __init__(self, path: str):
        self.path = path
        self.name = os.path.basename(path.rstrip("/"))

    def iterdir(self) -> Iterator["Dir"]:
        for name in sorted(os.listdir(self.path)):
            yield Dir(os.path.join(self.path, name))

    def is_dir(self) -> bool:
        return os.path.isdir(self.path) and not os.path.islink(self.path)

    def read_bytes(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read(1 << 20)
