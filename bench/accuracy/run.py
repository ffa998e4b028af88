"""slurm-attr's accuracy benchmark: generate incident bundles from real log formats, analyse each
offline, and print how often the verdict is right (README.md beside this file says how).

    python bench/accuracy/run.py [--seeds N] [--classes a,b] [--out DIR] [--json FILE] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

# Kernel and job.json times are naive local times: read them the same way on every machine.
os.environ["TZ"] = "UTC"
time.tzset()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for `accuracy`

from accuracy import engine, known, registry, report  # noqa: E402
from accuracy.score import Result, Section  # noqa: E402


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20, help="cases per class in each split (tuning and held-out)")
    p.add_argument("--classes", default="", help="comma-separated generator classes (default: all; --list shows them)")
    p.add_argument("--out", default="", help="write the bundles here and keep them (default: a temporary directory)")
    p.add_argument("--json", default="", help="also write every figure, failure and drain as JSON to this file")
    p.add_argument("--markdown", action="store_true", help="print the README tables instead of the text report")
    p.add_argument("--split", choices=("both", "tuning", "heldout"), default="both")
    p.add_argument("--no-known", action="store_true", help="skip the fixture bundles and the rules' inline cases")
    p.add_argument("--subprocess", action="store_true", help="run `sattr analyze DIR --json` per bundle (slow)")
    p.add_argument("--show", type=int, default=25, help="failures listed per section in the text report")
    p.add_argument("--list", action="store_true", help="list the classes with their expected cause and exit")
    return p.parse_args(argv)


def _generated(args: argparse.Namespace, out: str, analyze: engine.Analyze) -> list[Section]:
    classes = registry.available([c for c in args.classes.split(",") if c] or None)
    splits = ("tuning", "heldout") if args.split == "both" else (args.split,)
    sections = {s: Section("held-out" if s == "heldout" else "tuning") for s in splits}
    for spec in registry.specs(classes, args.seeds, splits):
        path = registry.generate(spec, out)
        with open(os.path.join(path, "truth.json")) as f:
            truth = json.load(f)
        sections[spec.split].results.append(Result(spec.case_id, spec.klass, truth, analyze(path)))
    return [sections[s] for s in ("heldout", "tuning") if s in sections]


def _known(out: str, analyze: engine.Analyze) -> list[Section]:
    fixtures = Section("fixtures (tests/fixtures/bundles)")
    rules = Section("rule cases (root, context and near-miss lines alone)")
    echoes = Section("rule cases (cascade and confirmation lines alone: their cause or unknown)")
    for k in known.fixtures():
        fixtures.results.append(Result(k.case_id, "fixture", k.truth.to_dict(), analyze(known.write(k, out))))
    for k in known.rule_cases():
        into = echoes if k.group in ("cascade", "confirmation") else rules
        into.results.append(Result(k.case_id, k.group, k.truth.to_dict(), analyze(known.write(k, out))))
    return [fixtures, rules, echoes]


def _engine_version() -> str:
    """The commit the analysis ran from, and whether its code differs from it (figures are per commit)."""
    import subprocess

    repo = known.REPO
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--", "slurm_attr", "rules"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown commit"
    if head.returncode != 0:
        return "unknown commit"
    return head.stdout.strip() + (" + uncommitted changes to slurm_attr/ or rules/" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.list:
        for name in registry.available(None):
            print(f"{name:32} {registry.CLASSES[name][0]}")
        return 0
    # Thousands of small files: a tmpfs is several times faster than a disk-backed /tmp.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    out = args.out or tempfile.mkdtemp(prefix="sattr-accuracy-", dir=shm)
    analyze = engine.via_cli() if args.subprocess else engine.in_process()
    t0 = time.monotonic()
    try:
        sections = _generated(args, out, analyze)
        if not args.no_known:
            sections += _known(out, analyze)
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    took = time.monotonic() - t0
    figs = [s.figures() for s in sections]
    n_classes = len({r.klass for s in sections[:2] for r in s.results})
    version = _engine_version()
    meta = {"seeds_per_split": args.seeds, "classes": n_classes, "seconds": round(took, 1), "commit": version,
            "engine": "sattr analyze (subprocess)" if args.subprocess else "in-process (analysis.run_bundle + drain.apply_policy)",
            "summary": f"{n_classes} classes x {args.seeds} seeds per split, {sum(len(s.results) for s in sections)} cases, "
                       f"{took:.0f} s; engine at {version}"}
    if args.json:
        report.dump_json(figs, meta, args.json)
    print(report.markdown(figs, meta) if args.markdown else report.text(figs, meta, args.show))
    if args.out:
        print(f"bundles kept in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
