"""The shape of one step's findings document (``finding.<step>.json``, findings.py) as its
readers check it before they use it.

Root's file, written by the step's leading watcher, but by whichever watcher release
runs there, and nothing in it names one: unknown fields are ignored, never refused (a
newer watcher adding a field must not make an older ``sattr`` or analysis drop the
findings). The findings themselves stay the watcher's dicts: the watcher carries the
document on and writes it back whole (watcher.py), so the reader checks the header and
keeps the document as it was.
"""
from __future__ import annotations

from typing import Any, Optional

import msgspec


class StepDoc(msgspec.Struct):
    # required: a document for another job or step, or without a findings list, is not used
    job: str
    step: str
    findings: list[Any]
    # optional: a wrong one reads as absent (jsonshape.lenient), the findings are still used
    coverage: Optional[str] = None
    dumps: list[Any] = []
    notes: list[Any] = []
