"""The rule catalog: TOML rules and Python rule modules, validated at load.

A TOML rule is one file named after its stable id (``gpu.xid`` in
``rules/gpu/gpu.xid.toml``). Its keys (all checked; an unknown key is an error)::

    id          domain.snake_case, == file stem, unique, never reused
    status      experimental | stable | deprecated (deprecated rules never run)
    priority    0..100, explicit: decides which rule owns a line and how roots rank
    role        root | cascade | confirmation | context
    cause       a cause word (model.CAUSES)
    sources     where the rule looks: kernel scheduler slurm stdout stderr nccl
    action      none (default) | drain | reset | reboot; only for hardware causes,
                and only ever applied on trusted sources
    keywords    literal fragments (case-insensitive); every line the rule matches
                contains one. They drive the prefilter: a line without any keyword
                of any rule is never looked at again.
    regex       Python ``re`` pattern searched in the line; named groups become
                symptom fields (names from FIELDS)
    window      lines joined (with "\\n") for a multi-line format; the first line
                holds the keyword, the others have their log prefix stripped
    summary     one-line template over the fields, e.g. "Xid {xid} on {gpu}"
    description why the rule exists and what the symptom means
    refine      name of a Python refiner (pyrule.REFINERS) run on every match
    references  where the format comes from
    [[cases]]   match = "..." (+ expect = {field = value}) or nomatch = "..."; at
                least one of each; optional source = "...". All must pass in
                ``sattr rules test`` and CI (selftest.py); an analysis never runs them.
"""
from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .. import model
from ..errors import RuleError
from ..model import ACTION_KINDS, CAUSES, ROLES, domain_of
from . import literals, regextree, speccache
from .pyrule import DocTable, HistoryRule, JobRefiner, JobRule, Refiner
from .rulefiles import RULEBOOK, module_names, rule_files

SOURCES = ("kernel", "scheduler", "slurm", "stdout", "stderr", "nccl", "journal")
STATUSES = ("experimental", "stable", "deprecated")
ID_RE = re.compile(r"^[a-z][a-z0-9]*\.[a-z0-9_]+$")
MAX_WINDOW = 12

# Named groups a regex may use: the evidence vocabulary shared by all rules.
FIELDS = frozenset(
    """node host rank local_rank gpu pci pci_id uuid cuda_dev xid prev_xid sxid severity link port
    state unit engine pid comm text message exc exitcode signal status vendor_err opcode peer op seq
    timeout_ms ran_ms pg job step reason device driver layer mc dimm fs server target rc size free
    total code errno path plugin uid intr_info error_status user cpu bank seconds count module task
    tasks used limit channel gpc tpc sm action nid value fault switch switch_pci ibdev
    peer_ip peer_port peer_host local_gid remote_gid ip dev peer_rank nranks port_pci src_pci bits""".split()
)
# Fields whose text is a decimal number: they become ints in the symptom.
NUMERIC = frozenset(
    """rank local_rank xid prev_xid sxid exitcode signal status seq timeout_ms ran_ms pid cuda_dev
    count rc errno seconds link port vendor_err opcode code uid task cpu bank peer_port peer_rank nranks""".split()
)
_TOML_KEYS = frozenset(
    "id status priority role cause sources action keywords regex window summary description refine references cases".split()
)
_REQUIRED = ("id", "status", "priority", "role", "cause", "sources", "keywords", "regex", "cases")
_CASE_KEYS = frozenset({"match", "nomatch", "expect", "source"})
# Fields the engine or refiners add beside the regex groups.
ENGINE_FIELDS = frozenset({"uptime", "occurrences", "xid_name"})
EXPECT_KEYS = frozenset({"id", "cause", "role", "action", "priority", "node", "rank", "gpu", "trusted", "time"}) | FIELDS | ENGINE_FIELDS


@dataclass(frozen=True)
class Case:
    """One inline example: text that must (or must not) produce this rule's symptom."""

    kind: str  # match | nomatch
    text: str
    expect: Mapping[str, Any] = field(default_factory=dict)
    source: Optional[str] = None


@dataclass(frozen=True)
class Rule:
    """A declarative line rule, loaded from one TOML file."""

    id: str
    status: str
    priority: int
    role: str
    cause: str
    sources: tuple[str, ...]
    keywords: tuple[str, ...]
    pattern: str  # the regex's text; ``regex`` compiles it on first use
    action: str = "none"
    window: int = 1
    summary: str = ""
    description: str = ""
    refine: Optional[str] = None
    references: tuple[str, ...] = ()
    cases: tuple[Case, ...] = ()
    path: str = ""

    @property
    def family(self) -> str:
        return self.id.split(".", 1)[0]

    @functools.cached_property
    def regex(self) -> "re.Pattern[str]":
        """The compiled regex. Compiled when a line first needs it: most analyses touch a
        few rules, and compiling all ~150 costs more than the rest of a small analysis."""
        return re.compile(self.pattern)

    @functools.cached_property
    def required(self) -> Optional[frozenset[str]]:
        """Literals one of which every match holds (literals.py), for the prefilter; None if
        unproven or a multi-line rule. Kept in the on-disk spec cache: parsing is slow."""
        if self.window != 1:
            return None  # the regex spans lines the prefilter does not see together
        return literals.required_any(self.pattern, keywords=self.keywords)


@dataclass
class Catalog:
    """Every rule, validated. Build with ``load_catalog``."""

    rules: list[Rule]
    job_rules: list[JobRule]
    history_rules: list[HistoryRule]
    refiners: dict[str, Refiner]
    doc_tables: list[DocTable]
    extra_dir: Optional[str] = None
    job_refiners: list[JobRefiner] = field(default_factory=list)
    _indexes: dict[str, Any] = field(default_factory=dict, repr=False)

    def rule(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)

    def index(self, source: str) -> Any:
        """The prefilter and rule order for one source (built once, then cached)."""
        idx = self._indexes.get(source)
        if idx is None:
            from .ruleindex import SourceIndex

            idx = SourceIndex([r for r in self.rules if source in r.sources and r.status != "deprecated"])
            self._indexes[source] = idx
        return idx

    def ids(self) -> list[str]:
        return sorted([r.id for r in self.rules] + [r.id for r in self.job_rules] + [r.id for r in self.history_rules])


def _fail(path: str, reason: str) -> RuleError:
    return RuleError(f"{path}: {reason}")


def _str_list(path: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, f"'{key}' must be a list of non-empty strings")
    return tuple(value)


def parse_rule(path: str, data: Mapping[str, Any]) -> Rule:
    """Build a Rule from one parsed TOML file, checking every key; raises RuleError."""
    unknown = sorted(set(data) - _TOML_KEYS)
    if unknown:
        raise _fail(path, f"unknown key(s) {', '.join(unknown)}")
    for key in _REQUIRED:
        if key not in data:
            raise _fail(path, f"missing required key '{key}'")
    rid = data["id"]
    stem = os.path.basename(path)[: -len(".toml")]
    if not isinstance(rid, str) or not ID_RE.match(rid):
        raise _fail(path, f"id {rid!r} is not domain.snake_case")
    if rid != stem:
        raise _fail(path, f"id {rid!r} differs from the file name {stem!r}")
    if data["status"] not in STATUSES:
        raise _fail(path, f"status must be one of {', '.join(STATUSES)}")
    prio = data["priority"]
    if not isinstance(prio, int) or isinstance(prio, bool) or not 0 <= prio <= 100:
        raise _fail(path, "priority must be an integer 0..100")
    if data["role"] not in ROLES:
        raise _fail(path, f"role must be one of {', '.join(ROLES)}")
    if data["cause"] not in CAUSES:
        raise _fail(path, f"cause {data['cause']!r} is not a cause word")
    sources = _str_list(path, "sources", data["sources"])
    bad = [s for s in sources if s not in SOURCES]
    if bad:
        raise _fail(path, f"unknown source(s) {', '.join(bad)}")
    action = data.get("action", "none")
    if action not in ACTION_KINDS:
        raise _fail(path, f"action must be one of {', '.join(ACTION_KINDS)}")
    if action != "none" and domain_of(data["cause"]) != "hardware":
        # Only hardware takes a node out of service (DESIGN §6).
        raise _fail(path, f"action {action!r} needs a hardware cause, not {data['cause']!r}")
    keywords = _str_list(path, "keywords", data["keywords"])
    for kw in keywords:
        if len(kw) < 3 or not kw.isascii() or "\n" in kw:
            raise _fail(path, f"keyword {kw!r} must be ASCII, one line, at least 3 characters")
    if not isinstance(data["regex"], str):
        raise _fail(path, "regex must be a string")
    try:
        regex = re.compile(data["regex"])
    except re.error as err:
        raise _fail(path, f"regex does not compile: {err}") from err
    unknown_groups = sorted(set(regex.groupindex) - FIELDS)
    if unknown_groups:
        raise _fail(path, f"unknown field name(s) in regex groups: {', '.join(unknown_groups)}")
    window = data.get("window", 1)
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_WINDOW:
        raise _fail(path, f"window must be an integer 1..{MAX_WINDOW}")
    for key in ("summary", "description", "refine"):
        if key in data and not isinstance(data[key], str):
            raise _fail(path, f"'{key}' must be a string")
    cases = _parse_cases(path, data["cases"], sources)
    rule = Rule(
        id=rid, status=data["status"], priority=prio, role=data["role"], cause=data["cause"],
        sources=sources, keywords=keywords, pattern=data["regex"], action=action, window=window,
        summary=data.get("summary", ""), description=data.get("description", "").strip(),
        refine=data.get("refine"), references=_str_list(path, "references", data.get("references", [])) if "references" in data else (),
        cases=cases, path=path,
    )
    rule.__dict__["regex"] = regex  # validated above: no second compile (cached_property's slot)
    return rule


def _parse_cases(path: str, raw: Any, sources: Sequence[str]) -> tuple[Case, ...]:
    if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
        raise _fail(path, "cases must be an array of tables ([[cases]])")
    cases = []
    for i, c in enumerate(raw, 1):
        unknown = sorted(set(c) - _CASE_KEYS)
        if unknown:
            raise _fail(path, f"case {i}: unknown key(s) {', '.join(unknown)}")
        kinds = [k for k in ("match", "nomatch") if k in c]
        if len(kinds) != 1 or not isinstance(c[kinds[0]], str):
            raise _fail(path, f"case {i}: needs exactly one of match = \"...\" or nomatch = \"...\"")
        expect = c.get("expect", {})
        if not isinstance(expect, dict) or (expect and kinds[0] == "nomatch"):
            raise _fail(path, f"case {i}: expect must be a table, and only on a match case")
        bad = sorted(set(expect) - EXPECT_KEYS)
        if bad:
            raise _fail(path, f"case {i}: unknown expected field(s) {', '.join(bad)}")
        src = c.get("source")
        if src is not None and src not in sources:
            raise _fail(path, f"case {i}: source {src!r} is not one of the rule's sources")
        cases.append(Case(kind=kinds[0], text=c[kinds[0]], expect=expect, source=src))
    if not any(c.kind == "match" for c in cases) or not any(c.kind == "nomatch" for c in cases):
        raise _fail(path, "needs at least one match case and one nomatch case")
    return tuple(cases)


def _parse_toml_rules(files: Sequence[tuple[str, bytes]]) -> list[Rule]:
    # imported here: with the spec cache warm, an analysis parses no TOML at all
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    rules = []
    for path, raw in files:
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            raise _fail(path, f"not valid TOML: {err}") from err
        rules.append(parse_rule(path, data))
    return rules


_EXPORTS = ("RULES", "HISTORY_RULES", "REFINERS", "DOC_TABLES", "JOB_REFINERS")


def _load_python_modules() -> tuple[list[JobRule], list[HistoryRule], dict[str, Refiner], list[DocTable],
                                    list[JobRefiner]]:
    job_refiners: list[JobRefiner] = []
    job_rules: list[JobRule] = []
    history: list[HistoryRule] = []
    refiners: dict[str, Refiner] = {}
    tables: list[DocTable] = []
    for name in module_names():
        path = f"rules/{name}.py"
        try:
            mod = importlib.import_module(f"{RULEBOOK}.{name}")
        except RuleError:
            raise
        except Exception as err:  # a broken rule module names itself, whatever broke
            raise _fail(path, f"cannot import: {type(err).__name__}: {err}") from err
        exported = [a for a in _EXPORTS if hasattr(mod, a)]
        if not exported:
            raise _fail(path, f"exports none of {', '.join(_EXPORTS)}")
        for rule in getattr(mod, "RULES", []):
            _check_py_rule(path, rule, JobRule)
            job_rules.append(rule)
        for rule in getattr(mod, "HISTORY_RULES", []):
            _check_py_rule(path, rule, HistoryRule)
            history.append(rule)
        for rname, fn in getattr(mod, "REFINERS", {}).items():
            if rname in refiners or not callable(fn):
                raise _fail(path, f"refiner {rname!r} is defined twice or not callable")
            refiners[rname] = fn
        tables.extend(getattr(mod, "DOC_TABLES", []))
        for ref in getattr(mod, "JOB_REFINERS", []):
            if not isinstance(ref, JobRefiner) or not ID_RE.match(ref.id) or not ref.cases:
                raise _fail(path, f"{ref!r}: a JobRefiner with a domain.snake_case id and inline cases")
            job_refiners.append(ref)
    return job_rules, history, refiners, tables, job_refiners


def _check_py_rule(path: str, rule: Any, kind: type) -> None:
    if not isinstance(rule, kind):
        raise _fail(path, f"{rule!r} is not a {kind.__name__}")
    if not ID_RE.match(rule.id):
        raise _fail(path, f"id {rule.id!r} is not domain.snake_case")
    if rule.cause not in CAUSES or rule.role not in ROLES or rule.status not in STATUSES:
        raise _fail(path, f"{rule.id}: bad cause, role or status")
    if not rule.cases:
        raise _fail(path, f"{rule.id}: a Python rule needs inline cases")


def build_catalog(extra_dir: Optional[str] = None) -> Catalog:
    """Load and validate the built-in catalog plus an optional site rule dir (TOML only).

    Inline cases are not run here (selftest.check_catalog runs them; ``sattr rules test``
    and CI do): an analysis must not pay for them, nor fail on a rule's example.
    """
    return _assemble(_parse_toml_rules(rule_files(extra_dir)), extra_dir)


def _assemble(rules: list[Rule], extra_dir: Optional[str]) -> Catalog:
    """The catalog from validated TOML rules and the Python rule modules."""
    job_rules, history, refiners, tables, job_refiners = _load_python_modules()
    seen: dict[str, str] = {}
    for rid, path in [(r.id, r.path) for r in rules] + [(r.id, "rules/*.py") for r in job_rules + history + job_refiners]:
        if rid in seen:
            raise _fail(path, f"id {rid!r} is already used by {seen[rid]}")
        seen[rid] = path
    for r in rules:
        if r.refine and r.refine not in refiners:
            raise _fail(r.path, f"refine names unknown refiner {r.refine!r}")
    rules.sort(key=lambda r: (-r.priority, r.id))
    return Catalog(rules=rules, job_rules=job_rules, history_rules=history, refiners=refiners,
                   doc_tables=tables, extra_dir=extra_dir, job_refiners=job_refiners)


_SPEC_FIELDS = ("id", "status", "priority", "role", "cause", "sources", "keywords", "pattern", "action", "window",
                "summary", "description", "refine", "references", "path")


def rule_spec(rule: Rule) -> dict[str, Any]:
    """A validated rule as JSON values (the on-disk cache's form)."""
    spec = {name: getattr(rule, name) for name in _SPEC_FIELDS}
    spec["cases"] = [{"kind": c.kind, "text": c.text, "expect": dict(c.expect), "source": c.source} for c in rule.cases]
    spec["required"] = sorted(rule.required) if rule.required else None
    return spec


def rule_from_spec(spec: Mapping[str, Any]) -> Rule:
    """The Rule a ``rule_spec`` came from (not validated again: the cache holds validated rules only)."""
    values = {name: spec[name] for name in _SPEC_FIELDS}
    for name in ("sources", "keywords", "references"):
        values[name] = tuple(values[name])
    cases = tuple(Case(kind=c["kind"], text=c["text"], expect=c["expect"], source=c["source"]) for c in spec["cases"])
    rule = Rule(cases=cases, **values)
    required = spec["required"]
    rule.__dict__["required"] = frozenset(required) if required else None  # cached_property's slot
    return rule


def _from_cache(key: str) -> Optional[list[Rule]]:
    specs = speccache.load(key)
    if specs is None:
        return None
    try:
        return [rule_from_spec(s) for s in specs]
    except (KeyError, TypeError, AttributeError):
        return None  # a damaged entry is no entry


@functools.lru_cache(maxsize=8)
def _cached(extra_dir: Optional[str]) -> Catalog:
    files = rule_files(extra_dir)
    # keyed by the rule files and by the code that validates them and derives their literals
    key = speccache.key_for(files, (__file__, model.__file__, literals.__file__, regextree.__file__))
    rules = _from_cache(key)
    if rules is None:
        rules = _parse_toml_rules(files)
        speccache.save(key, [rule_spec(r) for r in rules])
    return _assemble(rules, extra_dir)


def load_catalog(extra_dir: Optional[str] = None) -> Catalog:
    """The validated catalog (cached per extra_dir, in memory and on disk by the rule files'
    hashes); raises RuleError naming the file and reason. Inline cases are not run."""
    return _cached(os.path.abspath(extra_dir) if extra_dir else None)
