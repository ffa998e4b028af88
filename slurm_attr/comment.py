"""The verdict in the job's accounting comment: ``<user's text>; SATTR1: <cause> ... - <summary>``.

The Comment is free text the user fills (``sbatch --comment``), so it is never
read back as a verdict (users read theirs from a root-written copy, usercopy.py).
What this module guarantees about the field:

- Our part is recognised only when it is, case-insensitively (sacctmgr lowercases
  on 22.05), a text this store itself wrote for the job; anything else that looks
  like our marker, in any case and anywhere, is the user's and is neutralised
  (``sattr1:`` -> ``(sattr1):``) so no reader can take it for ours.
- The user's text is kept whole (newlines included), only truncated, visibly,
  when the whole field would exceed ``max_len``.
- After a write the field is read back; ``verify_recent`` re-applies our part
  where Slurm dropped it (a slurmctld restart resets a finished job's Comment to
  the user's own text while the job is still in its memory).
"""
from __future__ import annotations

import re
import sqlite3
import time
from typing import Any, Iterable

from . import jobtext
from .errors import SlurmError
from .model import Verdict
from .slurm.base import SlurmAccess, set_comments_each
from .store import Store

MARKER = "SATTR1:"
# Case-insensitive and Unicode-aware on purpose: whatever a case-insensitive reader could
# take for our marker (including U+017F, which folds to 's') is neutralised in user text.
_MARKER_RE = re.compile(re.escape(MARKER), re.IGNORECASE)
SEP = "; "
TRUNCATED = "...[truncated]"
# When the user's text is long, it keeps at least this many characters before our summary
# is shortened: both parts stay recognisable.
USER_MIN = 64
# Characters that would break sacctmgr's argument parsing or the one-line field.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f'\"|]")
_ARRAY_TASK = re.compile(r"\d+_\d+")
# AdminComment is the admins' field and other tools keep machine-read data there (Princeton's
# jobstats writes "JS1:<base64 gzip>" and decodes the whole rest): a part appended to it would
# break that reader. Ours goes in only where the field is empty or ours alone; otherwise the
# entry ends "skipped" with this detail (the Comment still carries the verdict).
ADMIN_FIELD = "AdminComment"
FOREIGN = "AdminComment holds another tool's data: left as it is"


def _clean(text: str) -> str:
    """Our part on one line: whitespace runs a space, every other control character (ESC, C1,
    bidi, zero-width: the summary quotes the job's words) a visible escape, sacctmgr's
    delimiters a space. Every reader of the Comment (sacct in a terminal) gets printable text."""
    one_line = jobtext.line(re.sub(r"\s+", " ", text))
    return re.sub(r" {2,}", " ", _UNSAFE.sub(" ", one_line)).strip()


def _compact(items: list, limit: int = 4) -> str:
    shown = ",".join(str(x) for x in items[:limit])
    return shown + (f",+{len(items) - limit}" if len(items) > limit else "")


def _shorten(ours: str, max_len: int) -> str:
    """Our part cut to max_len: the summary loses its end first, the marker and cause stay."""
    if len(ours) <= max_len:
        return ours
    head, sep, _summary = ours.partition(" - ")
    if sep and max_len - 3 > len(head) + len(sep):
        return ours[: max_len - 3].rstrip() + "..."
    return head[:max_len]


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
    head = _clean(" ".join(parts))
    text = f"{head} - {_clean(v.summary)}" if v.summary else head
    return _shorten(text, max_len)


def fields(cfg: Any) -> list[str]:
    """The accounting fields a verdict goes into: [comment] field, and AdminComment too with
    [actions] admin_comment (where users cannot change it)."""
    out = [cfg.comment.field]
    if cfg.actions.admin_comment and ADMIN_FIELD not in out:
        out.append(ADMIN_FIELD)
    return out


def queue_verdict(cfg: Any, store: Store, verdict: Verdict, slurm_job_id: str) -> None:
    """Queue the verdict's line for each of its fields (written by write_many)."""
    text = verdict_text(verdict, cfg.comment.max_len)
    for field in fields(cfg):
        store.queue_comment(verdict.job_id, slurm_job_id, field, text)


def neutralise(user: str) -> str:
    """The user's text with every marker look-alike broken, so it never reads as ours.

    Idempotent: ``(sattr1):`` holds no marker, so a second pass changes nothing.
    """
    return _MARKER_RE.sub(lambda m: f"({m.group(0)[:-1]}):", user)


def has_marker(text: str | None) -> bool:
    return bool(text) and _MARKER_RE.search(text or "") is not None


def split(existing: str | None, known: Iterable[str] = ()) -> tuple[str, str | None]:
    """(the user's part, our part or None) of a Comment as accounting holds it.

    Our part must be the tail after the last marker and equal, case-insensitively, one of
    ``known`` (texts we wrote for this job). A look-alike the user typed — even the exact
    text of a verdict — is not in ``known`` unless we wrote it, and then it is ours anyway.
    """
    text = existing or ""
    keys = {k.strip().casefold() for k in known if k and k.strip()}
    last = None
    for last in _MARKER_RE.finditer(text):
        pass
    if last is None or not keys:
        return text, None
    tail = text[last.start():]
    if tail.strip().casefold() not in keys:
        return text, None
    user = text[: last.start()]
    if user.endswith(SEP):
        user = user[: -len(SEP)]
    elif user.endswith(SEP.strip()):
        user = user[:-1]
    return user, tail.strip()


def fit(user: str, ours: str, max_len: int) -> tuple[str, str]:
    """(whole field, our part as written): at most max_len, the user's part cut visibly.

    Our summary gives way first (down to marker, cause and culprits) so the user keeps at
    least USER_MIN characters; the user's part is then cut and ends in TRUNCATED.
    """
    ours = _shorten(ours, max_len)
    if not user:
        return ours, ours
    was_cut = user.endswith(TRUNCATED)
    if was_cut:
        user = user[: -len(TRUNCATED)]  # cut by an earlier write: cut again, marked once
    if not was_cut and len(user) + len(SEP) + len(ours) <= max_len:
        return f"{user}{SEP}{ours}", ours
    head = ours.partition(" - ")[0]
    keep = min(len(user), USER_MIN) + len(TRUNCATED)
    ours = _shorten(ours, max(max_len - len(SEP) - keep, len(head)))
    room = max_len - len(SEP) - len(ours)
    if room <= len(TRUNCATED):
        return ours, ours  # max_len too small for both: ours alone
    if not was_cut and len(user) <= room:
        return f"{user}{SEP}{ours}", ours
    cut = user[: room - len(TRUNCATED)].rstrip()
    return f"{cut}{TRUNCATED}{SEP}{ours}", ours


def compose(existing: str | None, ours: str, known: Iterable[str] = (), max_len: int = 400) -> tuple[str, str]:
    """The field to write over ``existing`` and our part as it will be written."""
    user, _old = split(existing, known)
    return fit(neutralise(user), ours, max_len)


def merge(existing: str | None, ours: str, known: Iterable[str] = (), max_len: int = 400) -> str:
    """The user's comment (neutralised, without a part of ours in ``known``) followed by ours."""
    return compose(existing, ours, known, max_len)[0]


def carries(current: str | None, ours: str) -> bool:
    """Whether accounting's field ends with our part (case-insensitively: sacctmgr lowercases)."""
    return bool(current) and bool(ours) and (current or "").rstrip().casefold().endswith(ours.strip().casefold())


def _known(row: dict) -> list[str]:
    return [t for t in (row.get("text"), row.get("written")) if t]


def write(slurm: SlurmAccess, store: Store, job_id: str, give_up_after: int = 50,
          max_len: int = 400) -> tuple[bool, str]:
    """Try to write the queued comment of job_id now, then read it back. (ok, error)."""
    return write_many(slurm, store, [job_id], give_up_after, max_len)[job_id]


def write_many(slurm: SlurmAccess, store: Store, job_ids: list[str], give_up_after: int = 50,
               max_len: int = 400) -> dict[str, tuple[bool, str]]:
    """Write the queued comments of ``job_ids`` and read them back: {job id: (ok, error)}.

    Per field, one read of the current values, one write of those that change (one slurmdbd
    connection where the backend batches, ``set_job_comments``) and one read back: a worker's
    batch of verdicts costs three Slurm calls, not three per job."""
    out: dict[str, tuple[bool, str]] = {j: (True, "") for j in job_ids}
    by_field: dict[str, dict[str, dict]] = {}  # field -> job -> queued row
    for job_id in job_ids:
        for row in store.job_comments(job_id):
            if row["status"] != "written":
                by_field.setdefault(row["field"], {})[job_id] = row
    down = ""
    for field, rows in by_field.items():
        ids = list(rows)
        for at in range(0, len(ids), 200):  # bounded work per Slurm call
            chunk = ids[at:at + 200]
            if down:  # accounting is down: every further chunk would wait out the same timeout
                got = {j: (False, down) for j in chunk}
            else:
                got = _write_field(slurm, store, field, {j: rows[j] for j in chunk}, max_len)
                errs = {d for ok, d in got.values() if not ok}
                if len(errs) == 1 and not any(ok for ok, _d in got.values()) and "no record" not in next(iter(errs)):
                    down = next(iter(errs))
            for job_id, (ok, detail) in got.items():  # detail: our part as written, or the error
                _record(store, job_id, field, ok, detail, give_up_after)
                if not ok and out[job_id][0]:  # a job is written when every one of its fields is
                    out[job_id] = (False, detail)
    return out


def _write_field(slurm: SlurmAccess, store: Store, field: str, rows: dict[str, dict],
                 max_len: int) -> dict[str, tuple[bool, str]]:
    # Accounting lists array tasks by their own numeric id (read by it), but a write must name
    # an array task as A_T: by number, the task whose id is the array's selects every task.
    raw = {j: str(r.get("slurm_job_id") or j) for j, r in rows.items()}
    wid = {j: j if _ARRAY_TASK.fullmatch(j) else raw[j] for j in rows}
    out: dict[str, tuple[bool, str]] = {}
    try:
        current = _current_comments(slurm, list(raw.values()), field)
    except SlurmError as err:
        return {j: (False, str(err)) for j in rows}
    writes: dict[str, tuple[str, str]] = {}  # job -> (field as written, our part)
    for j, row in rows.items():
        now = current.get(raw[j])
        if now is None:
            out[j] = (False, f"accounting has no record of job {raw[j]} yet")
            continue
        full, ours = compose(now, row["text"], _known(row), max_len)
        if field == ADMIN_FIELD and split(now, _known(row))[0].strip():
            out[j] = (True, FOREIGN)
            continue
        if now == full:
            out[j] = (True, ours)  # already there (an earlier write whose result was lost)
        else:
            writes[j] = (full, ours)
    if writes:
        try:
            errs = _set_comments(slurm, [(wid[j], field, full) for j, (full, _o) in writes.items()])
            back = _current_comments(slurm, [raw[j] for j in writes if errs.get(wid[j]) is None], field)
        except SlurmError as err:
            return {**out, **{j: (False, str(err)) for j in writes}}
        for j, (_full, ours) in writes.items():
            err = errs.get(wid[j])
            if err is not None:
                out[j] = (False, str(err))
            elif back.get(raw[j]) is None:
                out[j] = (False, f"accounting has no record of job {raw[j]} yet")
            elif not carries(back[raw[j]], ours):
                out[j] = (False, f"job {raw[j]}: accounting did not keep the comment (reads {str(back[raw[j]])[:80]!r})")
            else:
                out[j] = (True, ours)
    return out


def _record(store: Store, job_id: str, field: str, ok: bool, err_or_ours: str, give_up_after: int) -> None:
    if not ok:
        store.comment_result(job_id, field, ok=False, error=err_or_ours, give_up_after=give_up_after)
        return
    if err_or_ours == FOREIGN:
        store.comment_result(job_id, field, ok=True, error=FOREIGN, final="skipped")
        return
    # The exact part written is what a later write or verify recognises as ours. sqlite-utils
    # adds the column to stores created before it existed (alter=True); a concurrent analyser
    # may have added it a moment ago, then the plain update does.
    try:
        store.db["comments"].update((job_id, field), {"written": err_or_ours}, alter=True)
    except sqlite3.OperationalError:
        store.db["comments"].update((job_id, field), {"written": err_or_ours})
    store.comment_result(job_id, field, ok=True)


def retry_pending(slurm: SlurmAccess, store: Store, give_up_after: int = 50,
                  max_len: int = 400) -> tuple[int, int]:
    """Retry every queued comment; (written, still pending)."""
    ids = list(dict.fromkeys(r["job_id"] for r in store.pending_comments()))
    done = write_many(slurm, store, ids, give_up_after, max_len)
    ok = sum(1 for v in done.values() if v[0])
    return ok, len(ids) - ok


def _set_comments(slurm: SlurmAccess, items: list[tuple[str, str, str]]) -> dict[str, SlurmError | None]:
    batch = getattr(slurm, "set_job_comments", None)
    return batch(items) if batch is not None else set_comments_each(slurm, items)


def _current_comments(slurm: SlurmAccess, ids: list[str], field: str) -> dict[str, str | None]:
    batch = getattr(slurm, "job_comments", None)
    if batch is not None:
        return batch(ids, field)
    return {i: slurm.job_comment(i, field) for i in ids}


def verify_recent(slurm: SlurmAccess, store: Store, since_s: float, give_up_after: int = 50,
                  max_len: int = 400, limit: int = 2000) -> dict[str, list[str]]:
    """Check that accounting still carries our part of every comment written in the last
    ``since_s`` seconds; re-apply it where it is gone. Returns job ids by outcome:
    ``ok``, ``reapplied``, ``failed``, ``missing`` (job not in accounting)."""
    out: dict[str, list[str]] = {"ok": [], "reapplied": [], "failed": [], "missing": []}
    rows = [dict(r) for r in store.db.query(
        "select * from comments where status = 'written' and updated_at >= ? order by updated_at desc limit ?",
        [time.time() - since_s, limit])]
    by_field: dict[str, list[dict]] = {}
    for r in rows:
        by_field.setdefault(r["field"], []).append(r)
    for field, group in by_field.items():
        ids = [str(r.get("slurm_job_id") or r["job_id"]) for r in group]
        current = _current_comments(slurm, ids, field)
        again = []
        for r, raw in zip(group, ids):
            now = current.get(raw)
            if now is None:
                out["missing"].append(r["job_id"])
            elif carries(now, r.get("written") or r["text"]):
                out["ok"].append(r["job_id"])
            else:
                # Dropped (slurmctld restart) or changed by someone: write ours again, keeping
                # whatever user text is there now.
                store.db["comments"].update((r["job_id"], field), {"status": "pending"})
                again.append(r["job_id"])
        for job_id, (done, _err) in write_many(slurm, store, again, give_up_after, max_len).items():
            out["reapplied" if done else "failed"].append(job_id)
    return out
