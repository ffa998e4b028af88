"""The cause policy as data: ``rules/policy.toml`` (shipped as ``slurm_attr.rulebook``).

Which cause outranks which and why, what each makes other ranks report (cascade), which are
hardware (checked against the kernel log, may drain), which are job-wide ends without a
culprit: one table with its own cases, so that the engine (verdict.py and the steps in
reason/) names no cause. A policy that does not validate stops every analysis with its
reason, as a broken rule does.
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping, Optional, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on older Pythons only
    import tomli as tomllib

from ..errors import RuleError

FILE = "policy.toml"
GROUPS = frozenset({"hardware", "claim", "rank_level", "echo", "unlocalised", "located", "hang_explained",
                    "placed_by_peers", "own_code"})
DOMAINS = frozenset({"hardware", "network", "user", "scheduler", "infrastructure", "none", "unknown"})
_CAUSE_KEYS = frozenset({"domain", "rank", "untrusted", "unconfirmed_path", "cascades", "groups", "why",
                         "yields_to_own_failure", "lost_node_sources", "confirmed_by", "straggler",
                         "earlier_is_alternative", "alternatives", "health", "localised_by"})
_TOP_KEYS = frozenset({"version", "weak_roots", "no_why", "clean_exit", "clean_exit_unless", "completed",
                       "no_evidence", "hang", "hang_note", "analysers", "clean_exit_alternative", "causes", "cases",
                       "silent", "suspicions", "drain_beyond_hardware", "restarts", "requeue",
                       "collective_borne", "device_raised"})
_REQUEUE_KEYS = frozenset({"never_domains", "out_of_service", "slurm_removes_node", "cases"})
_REQUEUE_CASE_KEYS = frozenset({"name", "cause", "trusted", "drains", "nodes_down", "expect"})


@dataclass(frozen=True)
class Cause:
    name: str
    domain: str
    rank: int
    untrusted: int
    unconfirmed_path: int
    cascades: frozenset[str]
    groups: frozenset[str]
    why: str
    yields_to_own_failure: frozenset[str] = frozenset()
    lost_node_sources: frozenset[str] = frozenset()  # coverage sources whose absence names a lost node
    confirmed_by: Optional[tuple[tuple[str, ...], tuple[str, ...]]] = None  # (primary, others) id prefixes
    straggler: str = ""  # the rule whose one rank every other waited for
    earlier_is_alternative: frozenset[str] = frozenset()  # causes not its cascade when printed before it
    alternatives: tuple[Mapping[str, str], ...] = ()  # said beside this cause every time
    health: frozenset[str] = frozenset()  # groups whose roots are the nodes' health beside it
    localised_by: tuple[str, ...] = ()  # findings (id prefixes) whose ranks are the culprits when present


@dataclass(frozen=True)
class Special:
    """The causes and rules the engine's steps are about, by role, not by name."""

    clean_exit: str
    clean_exit_unless: tuple[str, ...]
    completed: str
    no_evidence: str
    hang: str
    hang_note: str
    analysers: tuple[str, ...]
    clean_exit_alternative: str
    # findings of faults the kernel never logs (silent data corruption): a clean kernel log does
    # not contradict them
    silent: tuple[str, ...] = ()
    # findings that never decide and are always said beside the verdict as an alternative
    suspicions: tuple[str, ...] = ()
    # findings whose trusted drain action holds whatever the verdict's domain
    drain_beyond_hardware: tuple[str, ...] = ()
    # findings of a restart inside the job (its workers restarted, the job went on)
    restarts: tuple[str, ...] = ()
    # findings (id prefixes) that the collectives carry from rank to rank (non-finite values an
    # all-reduce spreads): a fault elsewhere can cause them, though their cause is own_code
    collective_borne: tuple[str, ...] = ()
    # exception classes a device or link fault reaches the program as (CUDA and NCCL errors):
    # an exception of any other class is the program's own, wherever it ran
    device_raised: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Case:
    name: str
    roots: tuple[Mapping[str, Any], ...]
    expect: str


@dataclass(frozen=True)
class RequeueCase:
    name: str
    cause: str
    trusted: bool
    drains: tuple[str, ...]
    nodes_down: bool
    expect: bool


@dataclass(frozen=True)
class RequeuePolicy:
    """Which verdicts may send a job round again ([requeue]; slurm_attr/requeue.py carries it out).
    Without the table nothing qualifies: a requeue is never the default."""

    never_domains: frozenset[str] = frozenset(DOMAINS)
    # drain outcomes of a culprit node (an Action: "applied", or its blocked_by up to a colon)
    # that leave it out of service
    out_of_service: frozenset[str] = frozenset()
    # causes whose node Slurm itself takes out (DOWN): its state, re-read, decides instead
    slurm_removes_node: frozenset[str] = frozenset()
    cases: tuple[RequeueCase, ...] = ()

    def why_not(self, cause: str, domain: str, trusted: bool, drains: Sequence[str], nodes_down: bool = False) -> str:
        """Why a verdict of ``cause`` may not requeue ("" when it may). ``drains``: the outcome of
        each culprit node's drain decision; ``nodes_down``: every culprit node is down or drained
        (re-read), for the causes Slurm takes nodes out for itself."""
        if domain in self.never_domains:
            return f"a {domain} cause ({cause}) never requeues"
        if not trusted:
            return "the verdict does not rest on trusted evidence"
        if cause in self.slurm_removes_node:
            return "" if nodes_down else "the lost node is not out of service"
        if not drains:
            return "no culprit node was drained"
        kept = [d for d in drains if d.split(":")[0] not in self.out_of_service]
        if kept:
            return f"a culprit node is still in service ({kept[0]})"
        return ""


@dataclass(frozen=True)
class Policy:
    causes: Mapping[str, Cause]
    weak_roots: frozenset[str]
    no_why: frozenset[str]
    special: Special
    cases: tuple[Case, ...] = ()
    _groups: Mapping[str, frozenset[str]] = field(default_factory=dict)
    requeue: RequeuePolicy = field(default_factory=RequeuePolicy)

    def cause(self, name: str) -> Cause:
        """The cause's row; a cause the table lacks is the no-evidence cause's."""
        return self.causes.get(name) or self.causes[self.special.no_evidence]

    def group(self, name: str) -> frozenset[str]:
        """The causes in a named group (GROUPS)."""
        return self._groups[name]

    def rank(self, cause: str, trusted: bool, unconfirmed_path: bool = False) -> int:
        """How strongly a root of ``cause`` explains a job's end (higher wins)."""
        c = self.causes.get(cause)
        if c is None:
            return 0
        if trusted:
            return c.rank
        return c.unconfirmed_path if unconfirmed_path else c.untrusted

    def cascades(self, cause: str) -> frozenset[str]:
        c = self.causes.get(cause)
        return c.cascades if c else frozenset()

    def domain(self, cause: str) -> str:
        c = self.causes.get(cause)
        return c.domain if c else "unknown"

    def winner(self, roots: Sequence[Mapping[str, Any]]) -> str:
        """The cause that ranks highest among roots described as in a case."""
        best = max(roots, key=lambda r: self.rank(r["cause"], bool(r.get("trusted")), bool(r.get("unconfirmed_path"))))
        return str(best["cause"])


def _fail(why: str) -> RuleError:
    return RuleError(f"rules/{FILE}: {why}")


def _names(v: Any, what: str) -> frozenset[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _fail(f"{what}: expected a list of names")
    return frozenset(v)


def _cause(name: str, d: Any) -> Cause:
    if not isinstance(d, dict):
        raise _fail(f"[causes.{name}] must be a table")
    unknown = set(d) - _CAUSE_KEYS
    if unknown:
        raise _fail(f"[causes.{name}]: unknown key {sorted(unknown)[0]!r}")
    if d.get("domain") not in DOMAINS:
        raise _fail(f"[causes.{name}] domain: one of {', '.join(sorted(DOMAINS))}")
    rank = d.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= 1000:
        raise _fail(f"[causes.{name}] rank: an integer 0..1000")
    untrusted = d.get("untrusted", rank)
    path = d.get("unconfirmed_path", untrusted)
    groups = _names(d.get("groups", []), f"[causes.{name}] groups")
    if groups - GROUPS:
        raise _fail(f"[causes.{name}] groups: unknown group {sorted(groups - GROUPS)[0]!r}")
    if not isinstance(d.get("why"), str) or not d["why"]:
        raise _fail(f"[causes.{name}] why: say why it ranks where it does")
    conf = d.get("confirmed_by")
    if conf is not None and not (isinstance(conf, dict) and set(conf) == {"primary", "others"}):
        raise _fail(f"[causes.{name}] confirmed_by: {{ primary = [...], others = [...] }}")
    alts = d.get("alternatives", [])
    if not isinstance(alts, list) or not all(isinstance(a, dict) and set(a) == {"cause", "why"} for a in alts):
        raise _fail(f"[causes.{name}] alternatives: a list of {{ cause = ..., why = ... }}")
    return Cause(name, d["domain"], rank, int(untrusted), int(path),
                 _names(d.get("cascades", []), f"[causes.{name}] cascades"), groups, d["why"],
                 _names(d.get("yields_to_own_failure", []), f"[causes.{name}] yields_to_own_failure"),
                 _names(d.get("lost_node_sources", []), f"[causes.{name}] lost_node_sources"),
                 (tuple(_names(conf["primary"], "confirmed_by.primary")), tuple(_names(conf["others"], "confirmed_by.others")))
                 if conf else None, str(d.get("straggler", "")),
                 _names(d.get("earlier_is_alternative", []), f"[causes.{name}] earlier_is_alternative"),
                 tuple(alts), _names(d.get("health", []), f"[causes.{name}] health"),
                 tuple(sorted(_names(d.get("localised_by", []), f"[causes.{name}] localised_by"))))


def _special(data: Mapping[str, Any], causes: Mapping[str, Cause]) -> Special:
    for key in ("completed", "no_evidence", "hang"):
        if data.get(key) not in causes:
            raise _fail(f"{key}: a cause of the table")
    for key in ("clean_exit", "hang_note", "clean_exit_alternative"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise _fail(f"{key}: a non-empty string")
    return Special(data["clean_exit"], tuple(sorted(_names(data.get("clean_exit_unless", []), "clean_exit_unless"))),
                   data["completed"], data["no_evidence"], data["hang"], data["hang_note"],
                   tuple(sorted(_names(data.get("analysers", []), "analysers"))), data["clean_exit_alternative"],
                   tuple(sorted(_names(data.get("silent", []), "silent"))),
                   tuple(sorted(_names(data.get("suspicions", []), "suspicions"))),
                   tuple(sorted(_names(data.get("drain_beyond_hardware", []), "drain_beyond_hardware"))),
                   tuple(sorted(_names(data.get("restarts", []), "restarts"))),
                   tuple(sorted(_names(data.get("collective_borne", []), "collective_borne"))),
                   _names(data.get("device_raised", []), "device_raised"))


def parse(data: Mapping[str, Any]) -> Policy:
    """The policy from the TOML table; RuleError naming what is wrong."""
    if data.get("version") != 1:
        raise _fail("version = 1 expected")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise _fail(f"unknown key {sorted(unknown)[0]!r}")
    raw = data.get("causes")
    if not isinstance(raw, dict) or not raw:
        raise _fail("no [causes.*] tables")
    causes = {name: _cause(name, d) for name, d in raw.items()}
    for c in causes.values():
        named = c.cascades | c.yields_to_own_failure | c.earlier_is_alternative | {a["cause"] for a in c.alternatives}
        for other in named:
            if other not in causes:
                raise _fail(f"[causes.{c.name}] names {other!r}, which is no cause here")
        if c.health - GROUPS:
            raise _fail(f"[causes.{c.name}] health: unknown group {sorted(c.health - GROUPS)[0]!r}")
    cases = []
    for i, case in enumerate(data.get("cases") or []):
        roots = case.get("roots") if isinstance(case, dict) else None
        if not isinstance(roots, list) or not roots or not all(isinstance(r, dict) and r.get("cause") in causes
                                                                 for r in roots):
            raise _fail(f"case {i}: roots must name causes of the table")
        if case.get("expect") not in causes:
            raise _fail(f"case {i}: expect must be a cause of the table")
        cases.append(Case(str(case.get("name") or f"case {i}"), tuple(roots), case["expect"]))
    groups = {g: frozenset(n for n, c in causes.items() if g in c.groups) for g in GROUPS}
    return Policy(causes, _names(data.get("weak_roots", []), "weak_roots"),
                  _names(data.get("no_why", []), "no_why"), _special(data, causes), tuple(cases), groups,
                  _requeue(data.get("requeue"), causes))


def _requeue(d: Any, causes: Mapping[str, Cause]) -> RequeuePolicy:
    """The [requeue] table; absent: nothing ever requeues."""
    if d is None:
        return RequeuePolicy()
    if not isinstance(d, dict):
        raise _fail("[requeue] must be a table")
    unknown = set(d) - _REQUEUE_KEYS
    if unknown:
        raise _fail(f"[requeue]: unknown key {sorted(unknown)[0]!r}")
    never = _names(d.get("never_domains", sorted(DOMAINS)), "[requeue] never_domains")
    if never - DOMAINS:
        raise _fail(f"[requeue] never_domains: unknown domain {sorted(never - DOMAINS)[0]!r}")
    removes = _names(d.get("slurm_removes_node", []), "[requeue] slurm_removes_node")
    if removes - set(causes):
        raise _fail(f"[requeue] slurm_removes_node: {sorted(removes - set(causes))[0]!r} is no cause here")
    cases = []
    for i, c in enumerate(d.get("cases") or []):
        if not isinstance(c, dict) or set(c) - _REQUEUE_CASE_KEYS or c.get("cause") not in causes \
                or not isinstance(c.get("expect"), bool):
            raise _fail(f"[[requeue.cases]] {i}: name, cause (of the table), trusted, drains, nodes_down, "
                        "expect (true|false)")
        _names(c.get("drains", []), f"[[requeue.cases]] {i} drains")  # a list of words, in order
        cases.append(RequeueCase(str(c.get("name") or f"requeue case {i}"), c["cause"], bool(c.get("trusted", True)),
                                 tuple(c.get("drains", [])), bool(c.get("nodes_down", False)), c["expect"]))
    return RequeuePolicy(never, _names(d.get("out_of_service", []), "[requeue] out_of_service"), removes, tuple(cases))


def _policy_bytes() -> bytes:
    pkg = importlib.import_module("slurm_attr.rulebook")
    for path in getattr(pkg, "__path__", None) or ():
        full = os.path.join(path, FILE)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                return f.read()
    from importlib import resources

    return resources.files("slurm_attr.rulebook").joinpath(FILE).read_bytes()


@lru_cache(maxsize=1)
def load() -> Policy:
    """The shipped policy (read once per process)."""
    try:
        data = tomllib.loads(_policy_bytes().decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise _fail(f"unreadable: {err}") from err
    return parse(data)


def check_cases(policy: Optional[Policy] = None) -> list[str]:
    """Every case's failure, as a line; [] when all hold."""
    p = policy or load()
    return [f"policy case {c.name!r}: expected {c.expect}, got {got}"
            for c in p.cases for got in [p.winner(c.roots)] if got != c.expect] + requeue_failures(p)


def requeue_verdict(p: Policy, c: RequeueCase) -> tuple[bool, str]:
    """A [[requeue.cases]] entry judged: (requeues, why not)."""
    why = p.requeue.why_not(c.cause, p.domain(c.cause), c.trusted, c.drains, c.nodes_down)
    return not why, why


def requeue_failures(p: Policy) -> list[str]:
    out = []
    for c in p.requeue.cases:
        got, why = requeue_verdict(p, c)
        if got != c.expect:
            out.append(f"requeue case {c.name!r}: expected {'requeue' if c.expect else 'none'}, got "
                       f"{'requeue' if got else 'none (' + why + ')'}")
    return out
