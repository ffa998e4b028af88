"""Job-level commands: show, analyze. (Filled in by the foundation work.)"""
from __future__ import annotations

from . import main  # noqa: F401
