"""From rule matches to symptoms: fields, trust, refinement, de-duplication.

Where a noisy bundle's time goes (the 129 MB bench bundle, 4 MiB kernel tails with
~4,200 Xid lines each over 256 GPUs; valgrind instruction counts per tail): prefilter
~35%, the per-line regex and the finding's key ~25%, building symptoms ~40% (1,280 of
them: MAX_EVIDENCE per finding; the Xid refiner is half of each). Repeats beyond
MAX_EVIDENCE are only counted, with no line number, object or refiner call.
"""
from __future__ import annotations

import re
from dataclasses import fields as dc_fields
from typing import Any, Iterable, Optional, Sequence

from .. import jobtext
from ..model import ACTION_KINDS, CAUSES, ROLES, TRUSTED_SOURCES, Evidence, Symptom
from .catalog import NUMERIC, Catalog, Rule
from .template import fill
from .scan import RawHit, daemon_log_node, matches, nccl_origin, parse_time, rank_prefix

MAX_EVIDENCE = 5  # lines kept per de-duplicated symptom; the rest are counted
MAX_TEXT = 2000  # characters of one evidence line kept in a verdict
MAX_PER_RULE = 1000  # distinct findings of one rule per file: a flood is still bounded
SUMMARY_TEXT = 120  # characters of one job-written field in a summary (the evidence keeps the line)

_BDF = re.compile(r"^(?:PCI:)?(?:(?P<dom>[0-9A-Fa-f]{4,8}):)?(?P<bus>[0-9A-Fa-f]{2}):(?P<dev>[0-9A-Fa-f]{2})(?:\.[0-7])?$")


_GPUS: dict[str, str] = {}  # spelling -> normalized: a node's few GPUs recur on thousands of lines


def normalize_gpu(value: str) -> str:
    """One spelling per GPU: Xid lines say ``0000:3b:00``, others ``0000:3B:00.0``."""
    got = _GPUS.get(value)
    if got is None:
        if len(_GPUS) > 4096:
            _GPUS.clear()  # bounded: a log of made-up addresses cannot grow it forever
        got = _GPUS[value] = _normalize_gpu(value)
    return got


def _normalize_gpu(value: str) -> str:
    m = _BDF.match(value.strip())
    if not m:
        return value.strip()
    dom = (m.group("dom") or "0000")[-4:]
    return f"{dom}:{m.group('bus')}:{m.group('dev')}".lower()


def render_summary(template: str, sym: Symptom) -> str:
    """Fill a summary template from the symptom's fields; a missing field is left out with the
    words that introduce it, never shown as '?' (template.fill). In an untrusted symptom the
    text fields are the job's words (a message, a reason, a path): quoted where they are more
    than a plain token, first line only and bounded (jobtext.quote), so a kernel line copied
    into the job's output never reads as part of a summary, or a verdict's headline, of ours."""
    values = dict(sym.fields)
    values.update({k: v for k, v in (("node", sym.node), ("rank", sym.rank), ("gpu", sym.gpu)) if v is not None})
    if not sym.trusted:
        values = {k: jobtext.quote(v, SUMMARY_TEXT) if isinstance(v, str) else v for k, v in values.items()}
    return fill(template, values)


_INT = re.compile(r"-?\d{1,12}")


def _fields(groups: dict[str, Optional[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in groups.items():
        if value is None:
            continue
        value = value.strip()
        if name in NUMERIC and _INT.fullmatch(value):
            out[name] = int(value)
        else:
            out[name] = value[:MAX_TEXT]
    return out


_NO_RANK = object()
# The fields _evidence fills; a model with other fields makes it use the constructor.
_EV_FAST = tuple(f.name for f in dc_fields(Evidence)) == ("source", "path", "line", "text", "trusted", "attributed_to")


def _evidence(source: str, path: str, line: int, text: str) -> Evidence:
    """Evidence(source, path, line, text): the same frozen object, without the dataclass's
    per-field object.__setattr__ (one per matched line kept: thousands in a noisy bundle)."""
    if not _EV_FAST:
        return Evidence(source=source, path=path, line=line, text=text)
    e = object.__new__(Evidence)
    e.__dict__.update(source=source, path=path, line=line, text=text, trusted=None, attributed_to=None)
    return e


def build_symptom(catalog: Catalog, hit: RawHit, source: str, node: Optional[str], path: str,
                  lineno: int, line_rank: Any = _NO_RANK) -> Optional[Symptom]:
    """The symptom for one match, refined and with trust enforced; None when a refiner drops it.

    ``line_rank``: rank_prefix of the first line, when the caller has it already."""
    rule: Rule = hit.rule
    groups = hit.match.groupdict()
    fields = _fields(groups)
    trusted = source in TRUSTED_SOURCES
    sym = Symptom(id=rule.id, cause=rule.cause, role=rule.role, priority=rule.priority, trusted=trusted,
                  node=node, action=rule.action)
    if isinstance(fields.get("node"), str):
        sym.node = fields.pop("node")
    elif node is None and source == "scheduler":
        # one slurmd's log names its node in its file name (a trusted admin setting)
        sym.node = daemon_log_node(hit.texts[0])
    rank = fields.pop("rank", None)
    if isinstance(rank, int):
        sym.rank = rank
    else:
        sym.rank = rank_prefix(hit.texts[0]) if line_rank is _NO_RANK else line_rank
    gpu = fields.pop("pci", None) or fields.pop("gpu", None)
    if gpu is not None:
        sym.gpu = normalize_gpu(str(gpu))
    if not trusted and "host" not in fields:
        host, dev = nccl_origin(hit.texts[0])
        if host is not None:
            fields["host"] = host
            fields.setdefault("cuda_dev", dev)
    iso, uptime = parse_time(hit.texts[0])
    sym.time = iso
    if uptime is not None:
        fields["uptime"] = uptime
    sym.fields = fields
    sym.evidence = [_evidence(source, path, lineno + i, t[:MAX_TEXT]) for i, t in enumerate(hit.texts)]
    if rule.refine:
        refined = catalog.refiners[rule.refine](sym, {k: v for k, v in groups.items() if v is not None})
        if refined is None:
            return None
        sym = refined
    if sym.cause not in CAUSES or sym.role not in ROLES or sym.action not in ACTION_KINDS:
        # A refiner bug must not put an unknown word in a verdict; keep the line as context.
        sym.cause, sym.role, sym.action = "unknown", "context", "none"
    if not sym.trusted:
        sym.action = "none"  # untrusted evidence may point at ranks, never drain (DESIGN §5)
    sym.summary = render_summary(sym.summary or rule.summary or rule.id, sym)
    return sym


def merge(symptoms: Iterable[Symptom]) -> list[Symptom]:
    """Fold repeats (same id, node, rank, GPU, role, action; for network findings also the same
    peer and address) into one symptom with a count."""
    out: dict[tuple[Any, ...], Symptom] = {}
    for s in symptoms:
        # the far end of a failing connection is part of the finding: the verdict votes over peers
        key = (s.id, s.cause, s.role, s.node, s.rank, s.gpu, s.action, s.trusted,
               s.fields.get("peer_ip"), s.fields.get("peer_host"), s.fields.get("ip"))
        first = out.get(key)
        if first is None:
            out[key] = s
            continue
        first.fields["occurrences"] = first.fields.get("occurrences", 1) + s.fields.get("occurrences", 1)
        room = MAX_EVIDENCE - len(first.evidence)
        if room > 0:
            first.evidence.extend(s.evidence[:room])
    return list(out.values())


# Groups that tell one finding from another; the rest (pids, addresses, text) only vary.
_IDENTITY = ("pci", "gpu", "node", "rank", "xid", "sxid", "severity", "device", "ibdev", "host", "exitcode",
             "status", "peer_ip", "peer_host", "ip")  # status: a flush (5) after an error (12) is another finding


def _identity_groups(rule: Rule) -> tuple[str, ...]:
    """The identity groups this rule's regex has (the others are always None for it)."""
    return tuple(g for g in _IDENTITY if g in rule.regex.groupindex)


def extract_buffer(catalog: Catalog, source: str, node: Optional[str], path: str, buf: bytes,
                   linenos: Optional[Sequence[int]] = None, first_line: int = 1) -> list[Symptom]:
    """Symptoms in a buffer of lines; line i (0-based) is numbered ``linenos[i]`` or ``first_line + i``.

    Most matches of a noisy log repeat a finding already shown MAX_EVIDENCE times; those
    are only counted (the loop's first branch), with no line number, object or refiner."""
    index = catalog.index(source)
    found: list[Symptom] = []
    built: dict[tuple[Any, ...], list[Symptom]] = {}  # identity of a finding -> its symptoms so far
    extra: dict[tuple[Any, ...], int] = {}  # identity -> repeats beyond MAX_EVIDENCE, counted only
    per_rule: dict[str, int] = {}
    idents: dict[str, tuple[str, ...]] = {}
    count = buf.count
    line_index = counted = 0  # newlines counted up to byte ``counted``: only kept matches need a number
    for start, rule, m, texts in matches(index, buf):
        rid = rule.id
        names = idents.get(rid)
        if names is None:
            names = idents[rid] = _identity_groups(rule)
        # one key per finding: rule, rank and the identity groups (m.group(a, b) is a tuple)
        rank = rank_prefix(texts[0])
        if len(names) > 1:
            key: tuple[Any, ...] = (rid, rank, m.group(*names))
        elif names:
            key = (rid, rank, m.group(names[0]))
        else:
            key = (rid, rank)
        same = built.get(key)
        if same is None:
            same = built[key] = []
        elif len(same) >= MAX_EVIDENCE:
            # A repeat of a finding already shown MAX_EVIDENCE times: count it, do not rebuild it.
            # (Up to then each repeat is built: a refiner may tell repeats apart by other fields.)
            extra[key] = extra.get(key, 0) + 1
            continue
        if not same and per_rule.get(rid, 0) >= MAX_PER_RULE:
            continue  # one rule flooding a log cannot crowd out the others
        line_index += count(b"\n", counted, start)
        counted = start
        if linenos is not None:
            lineno = linenos[line_index] if line_index < len(linenos) else linenos[-1]
        else:
            lineno = first_line + line_index
        sym = build_symptom(catalog, RawHit(line_index, rule, m, texts), source, node, path, lineno, rank)
        if sym is not None:
            same.append(sym)
            found.append(sym)
            if len(same) == 1:
                per_rule[rid] = per_rule.get(rid, 0) + 1
    for key, n in extra.items():
        last = built[key][-1]
        last.fields["occurrences"] = last.fields.get("occurrences", 1) + n
    return merge(found)


def extract_lines(catalog: Catalog, source: str, node: Optional[str], path: str,
                  lines: Iterable[tuple[int, str]]) -> list[Symptom]:
    """Symptoms in (line number, text) pairs of one file; pure, no I/O.

    ``source`` is kernel|scheduler|slurm|stdout|stderr|nccl; symptoms from a
    trusted source carry the catalog's action, all others action "none".
    """
    nos: list[int] = []
    texts: list[str] = []
    for no, text in lines:
        nos.append(no)
        texts.append(text)
    joined = "\n".join(texts)
    if joined.count("\n") != max(len(texts) - 1, 0):
        joined = "\n".join(t.replace("\n", " ") for t in texts)  # keep one entry = one line
    buf = joined.encode("utf-8", errors="replace")
    return extract_buffer(catalog, source, node, path, buf, linenos=nos)
