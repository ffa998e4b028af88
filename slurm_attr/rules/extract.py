"""From rule matches to symptoms: fields, trust, refinement, de-duplication."""
from __future__ import annotations

import re
from typing import Any, Iterable, Optional, Sequence

from ..model import ACTION_KINDS, CAUSES, ROLES, TRUSTED_SOURCES, Evidence, Symptom
from .catalog import NUMERIC, Catalog, Rule
from .template import fill
from .scan import RawHit, nccl_origin, parse_time, rank_prefix, scan

MAX_EVIDENCE = 5  # lines kept per de-duplicated symptom; the rest are counted
MAX_TEXT = 2000  # characters of one evidence line kept in a verdict
MAX_PER_RULE = 1000  # distinct findings of one rule per file: a flood is still bounded

_BDF = re.compile(r"^(?:PCI:)?(?:(?P<dom>[0-9A-Fa-f]{4,8}):)?(?P<bus>[0-9A-Fa-f]{2}):(?P<dev>[0-9A-Fa-f]{2})(?:\.[0-7])?$")


def normalize_gpu(value: str) -> str:
    """One spelling per GPU: Xid lines say ``0000:3b:00``, others ``0000:3B:00.0``."""
    m = _BDF.match(value.strip())
    if not m:
        return value.strip()
    dom = (m.group("dom") or "0000")[-4:]
    return f"{dom}:{m.group('bus')}:{m.group('dev')}".lower()


def render_summary(template: str, sym: Symptom) -> str:
    """Fill a summary template from the symptom's fields; a missing field is left out with the
    words that introduce it, never shown as '?' (template.fill)."""
    values = dict(sym.fields)
    values.update({k: v for k, v in (("node", sym.node), ("rank", sym.rank), ("gpu", sym.gpu)) if v is not None})
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


def build_symptom(catalog: Catalog, hit: RawHit, source: str, node: Optional[str], path: str,
                  lineno: int) -> Optional[Symptom]:
    """The symptom for one match, refined and with trust enforced; None when a refiner drops it."""
    rule: Rule = hit.rule
    groups = hit.match.groupdict()
    fields = _fields(groups)
    trusted = source in TRUSTED_SOURCES
    sym = Symptom(id=rule.id, cause=rule.cause, role=rule.role, priority=rule.priority, trusted=trusted,
                  node=node, action=rule.action)
    if isinstance(fields.get("node"), str):
        sym.node = fields.pop("node")
    rank = fields.pop("rank", None)
    sym.rank = rank if isinstance(rank, int) else rank_prefix(hit.texts[0])
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
    sym.evidence = [Evidence(source=source, path=path, line=lineno + i, text=t[:MAX_TEXT]) for i, t in enumerate(hit.texts)]
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
    """Symptoms in a buffer of lines; line i (0-based) is numbered ``linenos[i]`` or ``first_line + i``."""
    index = catalog.index(source)
    found: list[Symptom] = []
    built: dict[tuple[Any, ...], list[Symptom]] = {}  # identity of a finding -> its symptoms so far
    per_rule: dict[str, int] = {}
    idents: dict[str, tuple[str, ...]] = {}
    for hit in scan(index, buf):
        rule = hit.rule
        names = idents.get(rule.id)
        if names is None:
            names = idents[rule.id] = _identity_groups(rule)
        m = hit.match
        key = (rule.id, rank_prefix(hit.texts[0])) + (tuple(map(m.group, names)) if names else ())
        same = built.get(key)
        if same is None:
            same = built[key] = []
        if len(same) >= MAX_EVIDENCE:
            # A repeat of a finding already shown MAX_EVIDENCE times: count it, do not rebuild it.
            # (Up to then each repeat is built: a refiner may tell repeats apart by other fields.)
            same[-1].fields["occurrences"] = same[-1].fields.get("occurrences", 1) + 1
            continue
        if not same and per_rule.get(rule.id, 0) >= MAX_PER_RULE:
            continue  # one rule flooding a log cannot crowd out the others
        if linenos is not None:
            lineno = linenos[hit.line_index] if hit.line_index < len(linenos) else linenos[-1]
        else:
            lineno = first_line + hit.line_index
        sym = build_symptom(catalog, hit, source, node, path, lineno)
        if sym is not None:
            same.append(sym)
            found.append(sym)
            if len(same) == 1:
                per_rule[rule.id] = per_rule.get(rule.id, 0) + 1
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
