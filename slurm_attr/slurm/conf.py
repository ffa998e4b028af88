"""Values of the site's slurm.conf read directly (bounded), for what must not cost an RPC:
the node Prolog's spool dir, the metrics' cluster label."""
from __future__ import annotations

import re

CONF_CAP = 1 << 20


def conf_value(path: str, key: str, default: str = "") -> str:
    """The first ``Key=value`` of slurm.conf (keys are case-insensitive, as Slurm reads them);
    ``default`` when the file is unreadable or has no such line. Include files are not followed."""
    try:
        with open(path, "rb") as f:
            text = f.read(CONF_CAP).decode("utf-8", "replace")
    except OSError:
        return default
    m = re.search(rf"(?mi)^\s*{re.escape(key)}\s*=\s*(\S+)", text)
    return m.group(1) if m else default
