"""The fleet page's text: every value from the report escaped, made visible and cut
(jobtext.block, as flightrec/matrixhtml.py does), numbers formatted the one way the page and its
data attributes hold them, and the byte room each long section may fill (html.py)."""
from __future__ import annotations

import html
from typing import Any

from .. import jobtext

MAX_EXAMPLES = 5  # per cause (facts already keeps at most 5; a hand-made dict may not)
MAX_CAUSES = 50  # cause rows (the policy's causes are a closed set of fewer)
MAX_LEMONS = 200  # named in the lemon line (each has its node row too)
MAX_TIMELINE_NODES = 200  # worst nodes first: those get an expandable timeline
MAX_TIMELINE_ROWS = 100  # per node, newest first (facts' own cap)
MAX_EVENT_JOBS = 10  # jobs shown per GPU event
MAX_NODE_NAMES = 8  # node names shown per example job
MAX_DAYS = 120  # days in the daily chart (the newest)
NAME_CAP = 120  # characters of a name or id (a node, a job, a cause), cut after made visible
TEXT_CAP = 400  # characters of a summary, reason or detail
# UTF-8 bytes each long section may take; a section stops at its first row that does not fit
# and says how many it left out. Together with the short sections the page stays < 5 MB even
# when every string is as long and as hostile (each escape several characters) as allowed.
ROOM = {"causes": 500_000, "nodes": 900_000, "timelines": 1_800_000, "gpus": 500_000, "users": 400_000}

# One colour per domain family, so the chart reads the same in every report; causes of one
# domain get shades of it. Text labels carry the cause too: the page reads without colour.
def esc(x: Any, cap: int = NAME_CAP) -> str:
    """Escaped for HTML text and attributes, control characters made visible, cut to ``cap``
    characters after they are (an escape is 4-10 characters: cut before, the cap would not bound)."""
    raw = "" if x is None else x if isinstance(x, str) else str(x)
    s = jobtext.block(raw[:cap + 1])  # block never shortens: the first cap + 1 characters decide
    return html.escape(s[:cap] + jobtext.CUT if len(s) > cap else s, quote=True)


class Room:
    """What one section may still add to the page, in UTF-8 bytes (ROOM)."""

    def __init__(self, section: str):
        self.left, self.cut = ROOM[section], 0

    def full(self) -> bool:
        """True (and one more row counted as left out) once a row did not fit: the caller need
        not build the rest."""
        if self.cut:
            self.cut += 1
        return bool(self.cut)

    def take(self, row: str) -> bool:
        """Whether row fits; once one does not, none after it does (the order is kept)."""
        n = len(row.encode("utf-8"))
        if self.cut or n > self.left:
            self.cut += 1
            return False
        self.left -= n
        return True


def count(x: Any, places: int = 0) -> str:
    """A count (``places`` 0), or GPU-hours and seconds (1: one decimal, whether the report holds
    3 or 3.0), as the page shows it and its data attributes hold; '-' for none."""
    if x is None or isinstance(x, bool):
        return "-"
    try:
        return f"{float(x):.{places}f}" if places else str(int(x))
    except (TypeError, ValueError):
        return esc(x, 40)


def hours(x: Any) -> str:
    """GPU-hours (or seconds) with the digits that matter: one decimal from 10 on, two from 0.1,
    else three significant (a short test job's 0.0056 is not "0.0")."""
    if x is None or isinstance(x, bool):
        return "-"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return esc(x, 40)
    if v == 0 or abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.3g}"


def age(s: Any) -> str:
    """Seconds as a reader wants them: 45 s, 12 min, 3.5 h, 2.1 d."""
    if s is None:
        return "-"
    s = float(s)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.1f} d"
