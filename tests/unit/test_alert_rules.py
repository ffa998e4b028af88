"""contrib/prometheus: the alert rules pass promtool's own check and unit tests; every alert has a
case where it fires and a near miss where it must not; every metric the rules (and their tests)
use is one docs/metrics.md documents, so renaming a metric without the rules fails here.

promtool comes with Debian's `prometheus` package (cluster/deps.sh apt installs it). The YAML is
read by a small loader of the subset these files use (the project does not depend on PyPI's
PyYAML); it refuses anything else rather than misread it, and the rule count is checked against
promtool's.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "contrib" / "prometheus"
RULES = PROM / "sattr.rules.yml"
TESTS = sorted((PROM / "tests").glob("*.yml"))
METRICS_DOC = REPO / "docs" / "metrics.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus: bash cluster/deps.sh apt)")


# --- a loader for the YAML these files use: block mappings and sequences, plain and quoted
# scalars, `|` block scalars, `[]`/`{}` and flow lists of plain scalars, comments.

class YamlSubsetError(ValueError):
    pass


def _strip_comment(text: str) -> str:
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == "\\" and quote == '"':
                continue
            if c == quote:
                quote = None
        elif c in "'\"" and (i == 0 or text[i - 1] in " [,:-"):
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] == " "):
            return text[:i].rstrip()
    return text.rstrip()


def _scalar(text: str):
    t = text.strip()
    if t in ("[]", "{}"):
        return [] if t == "[]" else {}
    if t.startswith('"'):
        if not t.endswith('"') or len(t) < 2:
            raise YamlSubsetError(f"unterminated string: {t}")
        return json.loads(t)  # YAML's double-quoted escapes, as far as these files use them
    if t.startswith("'"):
        if not t.endswith("'") or len(t) < 2:
            raise YamlSubsetError(f"unterminated string: {t}")
        return t[1:-1].replace("''", "'")
    if t.startswith("["):
        if not t.endswith("]"):
            raise YamlSubsetError(f"flow sequence over several lines: {t}")
        return [_scalar(x) for x in t[1:-1].split(",")]
    if t[:1] in ("{", "&", "*", "!", "|", ">", "%", "@", "`"):
        raise YamlSubsetError(f"unsupported YAML: {t}")
    return t


def load_yaml(text: str):
    lines = text.splitlines()

    def indent(s: str) -> int:
        return len(s) - len(s.lstrip(" "))

    def next_content(i: int) -> int:
        while i < len(lines) and not _strip_comment(lines[i]).strip():
            i += 1
        return i

    def block_scalar(i: int, parent: int, style: str):
        body, j = [], i
        while j < len(lines) and (not lines[j].strip() or indent(lines[j]) > parent):
            body.append(lines[j])
            j += 1
        while body and not body[-1].strip():
            body.pop()
        ind = min((indent(b) for b in body if b.strip()), default=0)
        text = "\n".join(b[ind:] for b in body)
        if style == "|":
            text += "\n"
        elif style != "|-":
            raise YamlSubsetError(f"unsupported block scalar {style}")
        return text, j

    def value_after(rest: str, i: int, parent: int):
        """The value of `key: rest` (or `- rest`) on a line indented `parent`; i: the next line."""
        if rest in ("|", "|-"):
            return block_scalar(i, parent, rest)
        if rest:
            j = next_content(i)
            if j < len(lines) and indent(lines[j]) > parent:
                raise YamlSubsetError(f"line {j + 1}: a scalar continued on the next line")
            return _scalar(rest), i
        j = next_content(i)
        if j < len(lines) and (indent(lines[j]) > parent or
                               (indent(lines[j]) == parent and lines[j].lstrip().startswith("- "))):
            return block(j, indent(lines[j]))
        return None, i

    def block(i: int, ind: int):
        i = next_content(i)
        is_seq = lines[i].lstrip().startswith("- ") or lines[i].strip() == "-"
        result: list | dict = [] if is_seq else {}
        while True:
            i = next_content(i)
            if i >= len(lines) or indent(lines[i]) < ind:
                return result, i
            if indent(lines[i]) > ind:
                raise YamlSubsetError(f"line {i + 1}: unexpected indentation")
            text = _strip_comment(lines[i]).strip()
            if is_seq:
                if not (text.startswith("- ") or text == "-"):
                    raise YamlSubsetError(f"line {i + 1}: expected a sequence item")
                item = text[2:].strip() if text != "-" else ""
                if re.match(r"^[A-Za-z_][\w.-]*:( |$)", item):
                    # "- key: value": a mapping whose keys line up two columns in
                    lines[i] = " " * (ind + 2) + lines[i].lstrip()[2:]
                    value, i = block(i, ind + 2)
                else:
                    value, i = value_after(item, i + 1, ind)
                result.append(value)
            else:
                m = re.match(r"^([A-Za-z_][\w.-]*):(?: (.*))?$", text)
                if not m:
                    raise YamlSubsetError(f"line {i + 1}: expected `key: value`: {text}")
                key, rest = m.group(1), (m.group(2) or "").strip()
                if key in result:
                    raise YamlSubsetError(f"line {i + 1}: duplicate key {key}")
                result[key], i = value_after(rest, i + 1, ind)

    start = next_content(0)
    if start >= len(lines):
        return None
    value, end = block(start, indent(lines[start]))
    if next_content(end) < len(lines):
        raise YamlSubsetError(f"line {end + 1}: not part of the document")
    return value


def test_loader_reads_the_subset_and_refuses_the_rest():
    doc = load_yaml("a: 1 # c\nb:\n  - x: '1'\n    y: \"q\\\"#\"\n  - [p, q]\nc: |\n  l1\n   l2\n\nd: []\n")
    assert doc == {"a": "1", "b": [{"x": "1", "y": 'q"#'}, ["p", "q"]], "c": "l1\n l2\n", "d": []}
    for bad in ("a: {x: 1}\n", "a: b\n  c\n", "a: 1\na: 2\n", "a: >\n  x\n", "- a\nb: 1\n"):
        with pytest.raises(YamlSubsetError):
            load_yaml(bad)


# --- the files

def rules() -> list[dict]:
    doc = load_yaml(RULES.read_text())
    groups = doc["groups"]
    assert [g["name"] for g in groups] == ["sattr"]
    return [r for g in groups for r in g["rules"]]


def documented_metrics() -> set[str]:
    """Every series name docs/metrics.md allows: its names, a histogram's _bucket/_sum/_count."""
    names = set()
    for name, kind in re.findall(r"^\| `(sattr_\w+)` \| (\w+) \|", METRICS_DOC.read_text(), re.M):
        if kind == "histogram":
            names.update(name + s for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return names


def sattr_names(expr: str) -> set[str]:
    return set(re.findall(r"\bsattr_\w+", expr))


def series_name(series: str) -> str:
    return re.match(r"\s*([A-Za-z_:][\w:]*)", series).group(1)


def cases() -> list[tuple[str, dict, dict]]:
    """(test file, its test group, one alert_rule_test of it) for every case in tests/."""
    out = []
    for f in TESTS:
        doc = load_yaml(f.read_text())
        assert doc["rule_files"] == ["../sattr.rules.yml"], f
        for group in doc["tests"]:
            for case in group.get("alert_rule_test") or []:
                out.append((f.name, group, case))
    return out


def test_the_files_are_there():
    assert RULES.is_file() and TESTS, "contrib/prometheus/sattr.rules.yml and tests/*.yml"
    assert len(rules()) >= 6


@needs_promtool
def test_promtool_check_rules():
    proc = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # promtool counts what this loader found: nothing was misread or missed.
    m = re.search(r"SUCCESS: (\d+) rules found", proc.stdout + proc.stderr)
    assert m and int(m.group(1)) == len(rules()), proc.stdout + proc.stderr


@needs_promtool
def test_promtool_unit_tests():
    proc = subprocess.run([PROMTOOL, "test", "rules", *[t.name for t in TESTS]], cwd=PROM / "tests",
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(TESTS), proc.stdout + proc.stderr


def test_every_alert_fires_once_and_has_a_near_miss():
    by_name = {r["alert"]: r for r in rules()}
    assert len(by_name) == len(rules()), "an alert name used twice"
    firing: dict[str, list] = {}
    near: dict[str, list] = {}
    for fname, group, case in cases():
        name = case["alertname"]
        # promtool expects nothing of an alert that does not exist, and passes: a typo here
        # would be a near miss that tests nothing.
        assert name in by_name, f"{fname}: no rule named {name}"
        if case["exp_alerts"]:
            firing.setdefault(name, []).append(case["eval_time"])
        else:
            # A near miss feeds the rule what it reads (a series it names), only not enough.
            used = set(re.findall(r"\b[a-z_][a-z0-9_]*\b", by_name[name]["expr"]))
            fed = {series_name(s["series"]) for s in group.get("input_series") or []}
            assert used & fed, f"{fname}: the near miss of {name} at {case['eval_time']} feeds it none of its series"
            near.setdefault(name, []).append(case["eval_time"])
    missing = [(n, what) for n in by_name for what, seen in (("firing", firing), ("near-miss", near))
               if n not in seen]
    assert not missing, f"contrib/prometheus/tests lacks these (alert, case): {missing}"


def test_rules_carry_severity_and_text():
    for r in rules():
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert "$labels." in r["annotations"]["summary"] + r["annotations"]["description"], r["alert"]


def test_rules_use_documented_metrics_only():
    documented = documented_metrics()
    assert len(documented) >= 10, "the metrics table of docs/metrics.md was not found"
    for r in rules():
        unknown = sattr_names(r["expr"]) - documented
        assert not unknown, f"{r['alert']} uses {sorted(unknown)}, which docs/metrics.md does not list"
        assert sattr_names(r["expr"]), f"{r['alert']} reads no slurm-attr metric"
    for fname, group, _case in cases():
        for s in group.get("input_series") or []:
            name = series_name(s["series"])
            assert not name.startswith("sattr_") or name in documented, f"{fname}: {name} is not in docs/metrics.md"
