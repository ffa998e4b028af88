"""The verdict in the job's accounting comment: ``SATTR1: <cause> ... | <summary>``.

A comment the user set is kept: our part is appended after it behind the
versioned marker and replaced, never duplicated, on re-analysis. Written with
``sacctmgr`` after the job ended (``scontrol update`` is refused by then); when
accounting is down the text waits in the store's queue and is retried.
"""
from __future__ import annotations

import re

from .errors import SlurmError
from .model import Verdict
from .slurm.base import SlurmAccess
from .store import Store

MARKER = "SATTR1:"
# Characters that would break sacctmgr's argument parsing or the one-line field.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f'\"|]")


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", _UNSAFE.sub(" ", text)).strip()


def _compact(items: list, limit: int = 4) -> str:
    shown = ",".join(str(x) for x in items[:limit])
    return shown + (f",+{len(items) - limit}" if len(items) > limit else "")


def verdict_text(v: Verdict, max_len: int) -> str:
    """Our part of the comment, at most max_len characters, marker first."""
    parts = [MARKER, v.cause]
    if v.culprit_nodes:
        parts.append(f"nodes={_compact(v.culprit_nodes)}")
    if v.culprit_gpus:
        parts.append(f"gpus={_compact(v.culprit_gpus)}")
    if v.culprit_ranks:
        parts.append(f"ranks={_compact(v.culprit_ranks)}")
    if v.ambiguous:
        parts.append("ambiguous")
    head = " ".join(parts)
    text = f"{head} - {_clean(v.summary)}" if v.summary else head
    if len(text) > max_len:
        text = text[: max(len(head), max_len - 3)].rstrip() + "..."
    return text[:max_len] if len(head) <= max_len else head[:max_len]


def merge(existing: str | None, ours: str) -> str:
    """The user's comment (without any earlier SATTR1: part) followed by ours."""
    user = (existing or "")
    at = user.find(MARKER)
    if at >= 0:
        user = user[:at]
    user = user.rstrip(" ;")
    return f"{user}; {ours}" if user else ours


def write(slurm: SlurmAccess, store: Store, job_id: str, give_up_after: int = 50) -> tuple[bool, str]:
    """Try to write the queued comment of job_id now. (ok, error)."""
    row = store.comment(job_id)
    if row is None or row["status"] == "written":
        return True, ""
    # Accounting knows array tasks by their own numeric id, not A_T.
    raw_id = row.get("slurm_job_id") or job_id
    field = row["field"]
    try:
        current = slurm.job_comment(raw_id, field)
        if current is None:
            raise SlurmError(f"accounting has no record of job {raw_id} yet")
        slurm.set_job_comment(raw_id, field, merge(current, row["text"]))
    except SlurmError as err:
        store.comment_result(job_id, ok=False, error=str(err), give_up_after=give_up_after)
        return False, str(err)
    store.comment_result(job_id, ok=True)
    return True, ""


def retry_pending(slurm: SlurmAccess, store: Store, give_up_after: int = 50) -> tuple[int, int]:
    """Retry every queued comment; (written, still pending)."""
    ok = bad = 0
    rows = list(store.pending_comments())
    for i, row in enumerate(rows):
        done, err = write(slurm, store, row["job_id"], give_up_after)
        ok += done
        bad += not done
        if not done and "no record" not in err:
            # Accounting is down: every other write would wait out its timeout too.
            return ok, len(rows) - ok
    return ok, bad
