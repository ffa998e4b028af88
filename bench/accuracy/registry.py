"""Every generated class, and the seed split between tuning and held-out.

Tuning seeds are 0..N-1; held-out seeds are HELD_BASE..HELD_BASE+N-1, and held-out worlds also
draw from the wider variant pools (``World.pick``'s ``held`` options). Tune on tuning; report
held-out as the figure the rules must generalise to.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from . import gen_fr, gen_hw, gen_infra, gen_near, gen_net, gen_sched, gen_user, writer
from .scene import Generator
from .world import World

HELD_BASE = 100_000
# Classes built on shared/fixtures/flight_recorder (left out when it is absent).
NEEDS_FR = {n for n in gen_fr.CLASSES if n != "rank_stuck_stacks"} | {"nm_fr_healthy_dump"}
CLASSES: dict[str, tuple[str, Generator]] = {}
for _mod in (gen_hw, gen_net, gen_fr, gen_user, gen_sched, gen_infra, gen_near):
    CLASSES.update(_mod.CLASSES)


@dataclass(frozen=True)
class Spec:
    """One case to generate: its class, split and seed, and where it goes."""

    klass: str
    split: str  # tuning | heldout
    seed: int

    @property
    def case_id(self) -> str:
        return f"{self.split}/{self.klass}/{self.seed}"


def available(names: list[str] | None) -> list[str]:
    """The classes to run: all, or the named ones (unknown names are an error); FR classes
    need shared/fixtures/flight_recorder and are left out, with a note, when it is absent."""
    chosen = names or sorted(CLASSES)
    unknown = [n for n in chosen if n not in CLASSES]
    if unknown:
        raise SystemExit(f"unknown class(es): {', '.join(unknown)}; known: {', '.join(sorted(CLASSES))}")
    if not gen_fr.FR:
        chosen = [n for n in chosen if n not in NEEDS_FR]
    return chosen


def specs(classes: list[str], seeds: int, splits: tuple[str, ...] = ("tuning", "heldout")) -> Iterator[Spec]:
    for klass in classes:
        for split in splits:
            base = 0 if split == "tuning" else HELD_BASE
            for seed in range(base, base + seeds):
                yield Spec(klass, split, seed)


def generate(spec: Spec, out: str) -> str:
    """Write one case's bundle under ``out``; returns its directory."""
    world = World(spec.klass, spec.seed, held=spec.split == "heldout")
    scene = CLASSES[spec.klass][1](world)
    path = os.path.join(out, spec.case_id)
    writer.write(scene, path, spec.case_id)
    return path
