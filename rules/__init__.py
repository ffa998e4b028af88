"""The built-in rule catalog: TOML rules, their Python refiners and the tables they read."""
from __future__ import annotations

import os


def read_table(name: str) -> str:
    """A table shipped beside these modules (xid.tsv, ...), read from the package's directory
    when it is one (installed or editable) without importing importlib.resources' readers
    (a few ms of every start); through them otherwise (a zipped install)."""
    path = os.path.join(os.path.dirname(__file__), name)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    from importlib import resources

    return resources.files(__name__).joinpath(name).read_text("utf-8")
