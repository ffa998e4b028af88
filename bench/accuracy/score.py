"""Figures of one section (tuning, held-out, fixtures, rule cases) from (truth, verdict) pairs.

- cause: confusion matrix (expected x got), per-cause precision and recall, accuracy, macro
  accuracy (the mean of per-cause recall: each cause counts the same however many cases it has).
  A "cause_not" case (a context line) passes when the verdict is anything else; a "not_root"
  case (a rule's near-miss line) passes when that rule's symptom is no root of the verdict.
  Both count in the accuracy, not in the matrix.
- culprit: top-1 node (the verdict's first culprit node is one the truth names) over cases
  whose truth names nodes; the same for ranks. Also "any" (the verdict names one of them
  anywhere in its list) and "exact" (the same set: no bystander added, none left out).
- drains: a drain or reboot action on a node the truth does not drain is a false drain; a
  truth drain with no action is a missed one.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

TAKES_OUT = ("drain", "reboot", "reset")


@dataclass
class Result:
    case_id: str
    klass: str
    truth: dict[str, Any]
    verdict: dict[str, Any]

    @property
    def got(self) -> str:
        return self.verdict.get("cause") or ("error" if "error" in self.verdict else "?")

    @property
    def cause_ok(self) -> bool:
        if self.got == "error":
            return False
        rid = self.truth.get("not_root")
        if rid:
            return not any(s.get("role") == "root" and (s.get("id") == rid or str(s.get("id", "")).startswith(rid + "_"))
                           for s in self.verdict.get("symptoms") or [])
        if self.truth.get("cause_not"):
            return self.got != self.truth["cause_not"] and self.got != "error"
        return self.got == self.truth["cause"] or self.got in (self.truth.get("accept") or [])

    def analyser_failures(self) -> list[str]:
        """Analysers that crashed on this bundle (the verdict was made without them)."""
        return [f"{c.get('source')}: {c.get('detail')}" for c in self.verdict.get("coverage") or []
                if c.get("status") == "error" and "analyser failed" in str(c.get("detail"))]

    def drains(self) -> set[str]:
        return {a.get("node") for a in self.verdict.get("actions") or [] if a.get("kind") in TAKES_OUT and a.get("node")}


@dataclass
class Section:
    name: str
    results: list[Result] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        rs = self.results
        matrix: dict[str, Counter] = defaultdict(Counter)
        for r in rs:
            if not r.truth.get("cause_not") and not r.truth.get("not_root"):
                matrix[r.truth["cause"]][r.got] += 1
        causes = sorted(set(matrix) | {g for row in matrix.values() for g in row})
        per = {}
        scored = [r for r in rs if not r.truth.get("cause_not") and not r.truth.get("not_root")]
        for c in causes:
            ok = sum(r.cause_ok for r in scored if r.truth["cause"] == c)  # accepted alternatives pass
            n_exp = sum(matrix.get(c, Counter()).values())
            n_got = sum(row[c] for row in matrix.values())
            per[c] = {"n": n_exp, "precision": _ratio(matrix.get(c, Counter())[c], n_got), "recall": _ratio(ok, n_exp)}
        recalls = [v["recall"] for v in per.values() if v["n"]]
        return {
            "section": self.name, "cases": len(rs), "correct": sum(r.cause_ok for r in rs),
            "accuracy": _ratio(sum(r.cause_ok for r in rs), len(rs)),
            "macro_accuracy": round(sum(recalls) / len(recalls), 4) if recalls else None,
            "matrix": {e: dict(row) for e, row in sorted(matrix.items())}, "per_cause": per,
            "culprit": self._culprit(), "drains": self._drains(), "per_class": self._per_class(),
            "errors": [r.case_id for r in rs if r.got == "error"],
            "analyser_failures": {"cases": sum(bool(r.analyser_failures()) for r in rs),
                                  "first": next((f for r in rs for f in r.analyser_failures()), None)},
            "failures": [self._failure(r) for r in rs if not r.cause_ok],
        }

    def _culprit(self) -> dict[str, Any]:
        out = {}
        for key, vkey in (("nodes", "nodes"), ("ranks", "ranks")):
            expecting = [r for r in self.results if r.truth.get(key)]
            hits = [r for r in expecting if _first(r.verdict, vkey) in r.truth[key]]
            named = [r for r in expecting if set(_all(r.verdict, vkey)) & set(r.truth[key])]
            exact = [r for r in expecting if set(_all(r.verdict, vkey)) == set(r.truth[key])]
            out[f"top1_{key[:-1]}"] = {"cases": len(expecting), "hits": len(hits), "accuracy": _ratio(len(hits), len(expecting)),
                                       "any": _ratio(len(named), len(expecting)), "exact": _ratio(len(exact), len(expecting))}
            out[f"missed_{key}"] = [{"case": r.case_id, "expected": r.truth[key],
                                     "got": (r.verdict.get("culprit") or {}).get(vkey, [])} for r in expecting if r not in hits]
        return out

    def _drains(self) -> dict[str, Any]:
        false, missed = [], []
        for r in self.results:
            if r.truth.get("not_root"):
                continue  # a rule's near-miss line may be another rule's rightful (draining) match
            want = set(r.truth.get("drain") or [])
            got = r.drains()
            false += [{"case": r.case_id, "node": n, "cause": r.got} for n in sorted(got - want)]
            missed += [{"case": r.case_id, "node": n, "cause": r.got} for n in sorted(want - got)]
        expected = sum(len(r.truth.get("drain") or []) for r in self.results)
        return {"expected": expected, "false": false, "missed": missed}

    def _per_class(self) -> dict[str, Any]:
        by: dict[str, list[Result]] = defaultdict(list)
        for r in self.results:
            by[r.klass].append(r)
        out = {}
        for k, rs in sorted(by.items()):
            wrong = Counter(r.got for r in rs if not r.cause_ok)
            exp = Counter(_expected(r.truth) for r in rs)
            nodes = [r for r in rs if r.truth.get("nodes")]
            ranks = [r for r in rs if r.truth.get("ranks")]
            out[k] = {"n": len(rs), "correct": sum(r.cause_ok for r in rs), "expected": "|".join(sorted(exp)),
                      "wrong": dict(wrong.most_common()),
                      "node_top1": [sum(_first(r.verdict, "nodes") in r.truth["nodes"] for r in nodes), len(nodes)],
                      "rank_top1": [sum(_first(r.verdict, "ranks") in r.truth["ranks"] for r in ranks), len(ranks)],
                      "false_drains": sum(len(r.drains() - set(r.truth.get("drain") or [])) for r in rs if not r.truth.get("not_root")),
                      "missed_drains": sum(len(set(r.truth.get("drain") or []) - r.drains()) for r in rs)}
        return out

    @staticmethod
    def _failure(r: Result) -> dict[str, Any]:
        exp = _expected(r.truth)
        return {"case": r.case_id, "expected": exp, "got": r.got, "summary": r.verdict.get("summary") or r.verdict.get("error", ""),
                "culprit": r.verdict.get("culprit", {}), "why": r.truth.get("why", "")}


def _expected(truth: dict[str, Any]) -> str:
    if truth.get("not_root"):
        return f"no {truth['not_root']} root"
    return truth.get("cause") or f"not {truth.get('cause_not')}"


def _all(verdict: dict[str, Any], key: str) -> list[Any]:
    return (verdict.get("culprit") or {}).get(key) or []


def _first(verdict: dict[str, Any], key: str) -> Any:
    """The verdict's top culprit node or rank (the first it lists), or None."""
    got = _all(verdict, key)
    return got[0] if got else None


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None
