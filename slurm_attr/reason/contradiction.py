"""Untrusted claims against trusted facts (issue 10: "Contradiction").

A hardware or network claim from evidence the job could write (stdout/stderr, NCCL logs) about
node X is checked against X's kernel log, which the job cannot write:

- the kernel log of X covers the job's window and holds a matching event -> confirmed;
- it covers the window and holds none, and the claim is one the kernel would have logged (a GPU
  fault, a machine check, a local port or link going down) -> *contradicted*: the claim cannot be
  the root, it stays in the verdict as "claimed by the job's output, not confirmed by X's kernel log";
- no usable kernel log for X -> *unconfirmed*: the claim may stand, and it never drains (it is
  untrusted anyway).

A network *path* claim (an IB completion error or a closed socket naming a peer) is different: a
fault in the fabric between two healthy hosts leaves both kernel logs clean, so a clean log does not
contradict it. It is marked unconfirmed and ranks below a program error (a crashed rank makes its
peers report exactly these errors); the vote in netloc can still localise it.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional, Sequence

from ..model import Coverage, Symptom
from . import policy
from .timeline import Clock, clock_of, parse_iso, symptom_time

_SLACK_S = 300.0  # the kernel window is the job's, give or take the collectors' slack

# Job output that imitates a kernel log line: dmesg's uptime or -T prefix, journald's "kernel:",
# or the drivers' own message heads. Such a line is a copy (or a forgery), never the kernel's word.
KERNEL_FORMAT = re.compile(
    r"(?:^|[\s:\]])(?:\[\s*\d{1,8}\.\d{3,9}\]\s|\[[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4}\]\s"
    r"|\S+ kernel: |NVRM: Xid |NVRM: GPU |mlx[45]_core \S+ |EDAC MC\d|mce: \[Hardware Error\]|pcieport \S+: AER: )")


# every KERNEL_FORMAT claim carries one of these heads (a dmesg prefix alone is no claim)
_HINTS = ("kernel: ", "NVRM: ", "_core ", "EDAC MC", "mce: ", "AER: ")


def copies_kernel_format(s: Symptom) -> bool:
    # the substring test first: the regex runs on few of the thousands of output lines
    return any(any(h in (e.text or "") for h in _HINTS) and KERNEL_FORMAT.search(e.text or "")
               for e in s.evidence if e.source != "kernel")


# A network claim about this host's own port or adapter: the kernel logs such events.
_LOCAL_LINK = re.compile(r"port error|port down|link (?:is )?down|Link DOWN|Link POLLING|async event|local catastrophic|"
                         r"device fatal|State:\s*Down|Physical state:\s*(?:Disabled|Polling)", re.I)


def _is_path_claim(s: Symptom) -> bool:
    """A network claim about a connection or a remote end (a peer, "remote process exited"),
    not about this host's own port: a clean kernel log on both ends does not contradict it."""
    if s.cause != "network":
        return False
    if s.status.kernel_format_copy or s.id.startswith("net."):
        return False  # a copy of a kernel line, or a link-state rule: a local claim
    return not any(_LOCAL_LINK.search(e.text or "") for e in s.evidence)


def _matches(claim: Symptom, fact: Symptom) -> bool:
    # a hardware fault, not any GPU line: an Xid 13 (the program's own fault) confirms no ECC claim
    hardware = policy.load().group("hardware")
    if claim.cause in hardware:
        return fact.cause in hardware
    return fact.cause == claim.cause or fact.id.startswith("net.")


def kernel_covered(coverage: Sequence[Coverage]) -> dict[str, bool]:
    """node -> whether its kernel log was read whole (ok) with no gap reported for it."""
    out: dict[str, bool] = {}
    for c in coverage:
        if c.source != "kernel" or not c.node:
            continue
        good = c.status == "ok"
        out[c.node] = out.get(c.node, True) and good
    return out


def check(syms: Iterable[Symptom], coverage: Sequence[Coverage], job: Mapping[str, Any],
          nodes: Sequence[str], clock: Optional[Clock] = None) -> None:
    """Annotate each untrusted hardware/network claim: ``status.claim`` is one of
    confirmed | contradicted | unconfirmed, with ``status.claim_note`` saying why. A claim
    confirmed by trusted kernel evidence on one node takes that node as its subject: the
    job's word was about that node's hardware, whatever rank printed it."""
    syms = list(syms)
    covered = kernel_covered(coverage)
    # the kernel's own events that can bear out a claim: not its context lines (a corrected ECC
    # or a recovered link confirms no uncorrectable fault)
    facts = [s for s in syms if s.trusted and s.node and s.role != "context" and s.evidence
             and any(e.source == "kernel" for e in s.evidence)]
    clock = clock or clock_of(job)
    start, end = parse_iso(job.get("start_time"), clock), parse_iso(job.get("end_time"), clock)
    for s in syms:
        if s.trusted or s.role == "context" or s.status.earlier or any(e.source.startswith("kernel") for e in s.evidence):
            continue  # trusted, context by the catalog (an address line), from an earlier attempt or job, or the kernel's own
        if copies_kernel_format(s):
            s.status.kernel_format_copy = True  # job output imitating the kernel: marked, whatever it claims
        if s.cause not in policy.load().group("claim"):
            continue
        if s.id in policy.load().special.silent:
            s.status.doubt("unconfirmed", "claimed by the job's output; a silent fault leaves no kernel line to check")
            continue
        about = [s.node] if s.node else list(nodes)
        if s.cause == "network" and s.fields.get("peer_node"):
            about = sorted({*about, str(s.fields["peer_node"])})
        if not about:
            s.status.doubt("unconfirmed", "claimed by the job's output about an unnamed node; no kernel log to check it against")
            continue
        confirming = [f for f in facts if f.node in about and _matches(s, f)]
        confirmed = sorted({str(f.node) for f in confirming})
        if confirmed:
            s.status.confirm([f"{f.id} on {f.node}" for f in confirming][:4],
                             f"confirmed by {', '.join(confirmed)}'s kernel log")
            if s.node is None and len(confirmed) == 1:
                s.node = confirmed[0]  # the subject is the node whose kernel log holds the event
            continue
        explained = [f for f in facts if f.node in about and f.cause in policy.load().group("hardware")]
        if explained and s.cause not in policy.load().group("hardware"):
            # a connection's errors with a hardware fault at one end: that end's kernel log is not
            # clean, and the fault explains the errors (the verdict ranks the trusted fault itself)
            ends = sorted({str(f.node) for f in explained})
            s.status.confirm([f"{f.id} on {f.node}" for f in explained][:4],
                             f"explained by {', '.join(ends)}'s kernel log ({explained[0].summary or explained[0].id})")
            continue
        missing = [n for n in about if not covered.get(n)]
        t = symptom_time(s, clock) if not missing and start is not None and end is not None else None
        in_window = t is None or start is None or end is None or (start - _SLACK_S <= t <= end + _SLACK_S)
        where = " or ".join(about[:4]) + (" or another node" if len(about) > 4 else "")  # ASCII: it may reach the Comment
        if missing or not in_window:
            gap = f"no complete kernel log for {', '.join(missing[:4])}" if missing else "outside the kernel log's window"
            s.status.doubt("unconfirmed", f"claimed by the job's output, not confirmed: {gap}")
        elif _is_path_claim(s):
            s.status.doubt("unconfirmed", f"claimed by the job's output, not confirmed by {where}'s kernel log "
                                          "(a fabric fault between hosts may leave both clean)", kernel_clean=True)
        else:
            s.status.doubt("contradicted", f"claimed by the job's output, not confirmed by {where}'s kernel log")


def is_contradicted(s: Symptom) -> bool:
    return s.status.claim == "contradicted"


def is_weak_path_claim(s: Symptom) -> bool:
    """An unconfirmed network path claim whose ends' kernel logs were all read and are clean."""
    return not s.trusted and s.cause == "network" and s.status.kernel_clean
