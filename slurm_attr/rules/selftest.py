"""Checking the catalog against its own examples: inline cases and log fixtures.

Fixture files (``*.log`` / ``*.txt``) are real-format log excerpts with the
expected findings marked inside them by marker lines starting with ``#@``.
Marker lines are removed before extraction (line numbers are those of the log
without them)::

    #@ source: kernel          the source the file is read as (default kernel)
    #@ node: node07            the node it came from (optional)
    #@ strict                  every symptom found must be expected by a marker
    ...log lines...
    #@ expect gpu.xid_79 gpu=0000:3b:00 action=reboot
    ...log lines...
    #@ expect-none

``#@ expect ID [field=value ...]`` asserts a symptom with that id with an evidence
line between the previous marker and this one, with those field values (repeats
of one finding are folded into one symptom, whose fields are its first line's);
``#@ expect-none`` asserts that no evidence line falls in that stretch.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from ..errors import RuleError
from ..model import Symptom
from .catalog import Catalog, Case, Rule
from .extract import build_symptom, extract_lines
from .pyrule import DictHistory
from .scan import scan

_SYMPTOM_ATTRS = ("id", "cause", "role", "action", "priority", "node", "rank", "gpu", "trusted", "time")


@dataclass
class Result:
    """The outcome of one case or one fixture assertion."""

    path: str
    name: str
    ok: bool
    detail: str = ""


def _differences(sym: Symptom, expect: Mapping[str, Any]) -> list[str]:
    diffs = []
    for key, want in expect.items():
        got = getattr(sym, key) if key in _SYMPTOM_ATTRS else sym.fields.get(key)
        if got != want and str(got) != str(want):
            diffs.append(f"{key}={got!r}, expected {want!r}")
    return diffs


def run_rule_case(catalog: Catalog, rule: Rule, case: Case) -> Optional[str]:
    """None when the case passes, else why it fails."""
    source = case.source or rule.sources[0]
    buf = case.text.encode("utf-8")
    hits = list(scan(catalog.index(source), buf))
    mine = [h for h in hits if h.rule.id == rule.id]
    if case.kind == "nomatch":
        return f"matched a near-miss: {case.text[:120]!r}" if mine else None
    if not mine:
        owner = ", ".join(sorted({h.rule.id for h in hits}))
        return f"no match for {case.text[:120]!r}" + (f" (claimed by {owner})" if owner else "")
    sym = build_symptom(catalog, mine[0], source, None, f"case:{rule.id}", 1 + mine[0].line_index)
    if sym is None:
        return "the refiner dropped the match"
    diffs = _differences(sym, case.expect)
    return "; ".join(diffs) or None


def run_cases(catalog: Catalog) -> list[Result]:
    """Every inline case of every rule, TOML and Python."""
    results = []
    for rule in catalog.rules:
        if rule.status == "deprecated":
            continue
        for i, case in enumerate(rule.cases, 1):
            err = run_rule_case(catalog, rule, case)
            results.append(Result(rule.path, f"{rule.id} case {i} ({case.kind})", err is None, err or ""))
    for jrule in catalog.job_rules:
        for i, jcase in enumerate(jrule.cases, 1):
            sym = jrule.run(jcase.job)
            if jcase.expect is None:
                err = f"fired on {dict(jcase.job)}" if sym else None
            elif sym is None:
                err = f"did not fire on {dict(jcase.job)}"
            else:
                err = "; ".join(_differences(sym, jcase.expect)) or None
            results.append(Result("rules/*.py", f"{jrule.id} case {i}", err is None, err or ""))
    for hrule in catalog.history_rules:
        for i, hcase in enumerate(hrule.cases, 1):
            new = hrule.run([Symptom.from_dict(s.to_dict()) for s in hcase.symptoms], hcase.job, DictHistory(hcase.history))
            got = sorted(s.id for s in new)
            ok = got == sorted(hcase.expect_ids)
            results.append(Result("rules/*.py", f"{hrule.id} case {i}", ok, "" if ok else f"produced {got}, expected {sorted(hcase.expect_ids)}"))
    return results


def fixture_files(dirs: Iterable[str]) -> list[str]:
    """Fixture files (*.log, *.txt) below the given directories, sorted."""
    out = []
    for d in dirs:
        for root, _dirs, files in os.walk(d):
            out.extend(os.path.join(root, f) for f in files if f.endswith((".log", ".txt")))
    return sorted(out)


def run_fixture(catalog: Catalog, path: str) -> list[Result]:
    """Extract one fixture file and check its markers."""
    with open(path, "rb") as f:
        raw = f.read(16 << 20).decode("utf-8", errors="replace")
    source, node, strict = "kernel", None, False
    lines: list[tuple[int, str]] = []
    marks: list[tuple[int, int, str, list[str]]] = []  # (marker file line, last log line before it, kind, args)
    for fno, text in enumerate(raw.split("\n"), 1):
        if not text.startswith("#@"):
            lines.append((len(lines) + 1, text))
            continue
        body = text[2:].strip()
        if body.startswith("source:"):
            source = body.split(":", 1)[1].strip()
        elif body.startswith("node:"):
            node = body.split(":", 1)[1].strip()
        elif body == "strict":
            strict = True
        else:
            parts = shlex.split(body)
            if parts:
                marks.append((fno, len(lines), parts[0], parts[1:]))
    symptoms = extract_lines(catalog, source, node, os.path.basename(path), lines)
    results, claimed, prev = [], set(), 0
    for fno, last, kind, args in marks:
        # Repeats of a finding are folded into one symptom: any of its evidence lines counts.
        span = [s for s in symptoms if any(prev < (e.line or 0) <= last for e in s.evidence)]
        name = f"{os.path.basename(path)}:{fno}"
        if kind == "expect-none":
            results.append(Result(path, name, not span, "found " + ", ".join(s.id for s in span) if span else ""))
        elif kind == "expect" and args:
            want = dict(a.split("=", 1) for a in args[1:] if "=" in a)
            match = [s for s in span if s.id == args[0] and not _differences(s, want)]
            detail = "" if match else f"no {args[0]} {want or ''} in lines {prev + 1}-{last}; found " + (", ".join(f"{s.id}{'@' + str(s.evidence[0].line)}" for s in span) or "nothing")
            claimed.update(id(s) for s in match[:1])
            results.append(Result(path, name, bool(match), detail))
        else:
            results.append(Result(path, name, False, f"bad marker {kind!r}"))
        prev = last
    if strict:
        extra = [s for s in symptoms if id(s) not in claimed]
        results.append(Result(path, f"{os.path.basename(path)}:strict", not extra,
                              "unexpected " + ", ".join(f"{s.id}@{s.evidence[0].line}" for s in extra) if extra else ""))
    return results


def check_catalog(catalog: Catalog) -> Catalog:
    """The catalog, once every inline case passes; else RuleError naming the first failure."""
    for result in run_cases(catalog):
        if not result.ok:
            raise RuleError(f"{result.path}: {result.name}: {result.detail}")
    return catalog


def run_refiner_cases(catalog: Catalog) -> list[Result]:
    """Each job refiner's inline cases: the roles its symptoms have after it ran."""
    out = []
    for ref in catalog.job_refiners:
        for i, case in enumerate(ref.cases):
            syms = case.symptoms()
            ref.run(syms, case.job)
            got = [s.role for s in syms]
            ok = got == list(case.expect_roles)
            why = "" if ok else f"roles {got}, expected {list(case.expect_roles)}"
            if ok and case.expect_places:
                places = [f"{s.node or ''}/{'' if s.rank is None else s.rank}".strip("/") for s in syms]
                ok = places == list(case.expect_places)
                why = "" if ok else f"places {places}, expected {list(case.expect_places)}"
            out.append(Result("rules/*.py", f"{ref.id} case {i}", ok, why))
    return out


def run_policy_cases() -> list[Result]:
    """The cause policy's own cases (rules/policy.toml): roots in, the winning cause out."""
    from ..reason import policy

    p = policy.load()
    out = [Result(f"rules/{policy.FILE}", c.name, got == c.expect, "" if got == c.expect else f"expected {c.expect}, got {got}")
           for c in p.cases for got in [p.winner(c.roots)]]
    for c in p.requeue.cases:  # [requeue]: which verdicts may send a job round again
        got, why = policy.requeue_verdict(p, c)
        out.append(Result(f"rules/{policy.FILE}", c.name, got == c.expect,
                          "" if got == c.expect else f"expected {'requeue' if c.expect else 'none'}, got "
                                                     f"{'requeue' if got else 'none: ' + why}"))
    return out


def run_all(catalog: Catalog, fixture_dirs: Iterable[str] = ()) -> list[Result]:
    """Inline cases, the policy's cases, then fixtures."""
    results = run_cases(catalog) + run_refiner_cases(catalog) + run_policy_cases()
    for path in fixture_files(fixture_dirs):
        results.extend(run_fixture(catalog, path))
    return results
