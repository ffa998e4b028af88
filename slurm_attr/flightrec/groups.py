"""Process groups of a job: their names, descriptions and expected members.

Members come from ``pg_config`` (the global ranks each dump lists for a group).
Stock torch 2.13 Gloo writes a broken ``pg_config`` (research §4: every group
overwrites key ``''``), and NVRx-style only-active dumps may have no entries for
a group at all, so membership falls back to the ranks whose entries or
``pg_status`` name the group, and the default group to every known rank.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .. import jobtext
from .loader import DumpSet
from .types import PgStatus


@dataclass
class Group:
    """One process group as the dumps describe it."""

    name: str
    desc: str
    members: tuple[int, ...]
    members_from: str  # pg_config | entries | world
    reach: dict[int, int] = field(default_factory=dict)  # member -> last seq it enqueued (known ones)
    status: dict[int, PgStatus] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """"0 (default_pg)": both the job's names, quoted where more than a plain token, since
        summaries and headlines embed the label (jobtext.quote)."""
        name = jobtext.quote(self.name, 80)
        return f"{name} ({jobtext.quote(self.desc, 80)})" if self.desc and self.desc != self.name else name


def world_ranks(ds: DumpSet) -> set[int]:
    """Every rank the job is known to have: job.json, dump names, pg_config lists.

    Global ranks are 0..N-1, so the highest one seen implies all below it: a
    missing dump in the middle is still a known rank.
    """
    ranks = set(ds.job_ranks) | set(ds.files) | set(ds.traces)
    for members in ds.members.values():
        ranks.update(members)
    if ranks and max(ranks) < 1 << 20:
        ranks.update(range(max(ranks) + 1))
    return ranks


def _map_unmapped_status(ds: DumpSet, members_of: dict[str, tuple[int, ...]]) -> None:
    """Give pg_status rows keyed by a local pg_id a group name, using peers' entries.

    A rank with no entries (a GIL-locked rank in an only-active dump) cannot say
    which group its local pg_id 10 is; peers can: if peers call pg_id 10 group
    '73' and this rank is a member of '73', that row is '73'.
    """
    by_pid: dict[int, Counter[str]] = {}
    for tr in ds.traces.values():
        for pid, name in tr.pg_ids.items():
            _counter(by_pid, pid)[name] += 1
    for tr in ds.traces.values():
        if not tr.unmapped_status:
            continue
        own = set(tr.pg_config)
        for pid, st in list(tr.unmapped_status.items()):
            names = [n for n in by_pid.get(pid, ()) if tr.rank in members_of.get(n, ()) and (not own or n in own)]
            if len(names) == 1 and names[0] not in tr.pg_status:
                tr.pg_status[names[0]] = st
                del tr.unmapped_status[pid]


def _counter(counts: dict[Any, Counter[str]], key: Any) -> Counter[str]:
    """counts[key], created when missing: ``setdefault(key, Counter())`` builds a Counter (a
    Python-level __init__) on every call, a dozen per rank at 32,768 ranks."""
    c = counts.get(key)
    if c is None:
        c = counts[key] = Counter()
    return c


def build_groups(ds: DumpSet) -> dict[str, Group]:
    """All process groups seen in any dump, with members and each member's reach."""
    configs: dict[str, Counter[str]] = {}
    descs: dict[str, Counter[str]] = {}
    used: dict[str, set[int]] = {}
    for tr in ds.traces.values():
        for name, (desc, key) in tr.pg_config.items():
            if key is not None:
                _counter(configs, name)[key] += 1
            if desc:
                _counter(descs, name)[desc] += 1
        for name, desc in tr.descs.items():
            if desc and desc != "undefined":
                _counter(descs, name)[desc] += 1
        for name in (*tr.streams, *tr.p2p, *tr.pg_status):
            u = used.get(name)
            if u is None:
                u = used[name] = set()
            u.add(tr.rank)
    world = tuple(sorted(world_ranks(ds)))
    members_of: dict[str, tuple[int, ...]] = {}
    source: dict[str, str] = {}
    for name in set(configs) | set(used):
        desc = descs[name].most_common(1)[0][0] if name in descs else ""
        if name in configs:
            members_of[name] = ds.members[configs[name].most_common(1)[0][0]]
            source[name] = "pg_config"
        elif desc == "default_pg" or (name == "0" and not desc):
            members_of[name] = world
            source[name] = "world"
        else:
            members_of[name] = tuple(sorted(used.get(name, ())))
            source[name] = "entries"
    _map_unmapped_status(ds, members_of)
    groups: dict[str, Group] = {}
    for name, members in members_of.items():
        desc = descs[name].most_common(1)[0][0] if name in descs else ""
        g = Group(name=name, desc=desc, members=members, members_from=source[name])
        for r in members:
            tr = ds.traces.get(r)
            if tr is None:
                continue
            reach = -1
            st = tr.streams.get(name)
            if st is not None:
                reach = st.hi
            status = tr.pg_status.get(name)
            if status is not None:
                g.status[r] = status
                reach = max(reach, status.last_enqueued)
            if st is not None or status is not None or (tr.n_entries == 0 and not tr.unmapped_status):
                # -1: it says it enqueued nothing on this group (or has no entries at all and
                # no pg_status row left unexplained).
                g.reach[r] = reach
        groups[name] = g
    return groups


def order_key(name: str) -> tuple[int, str]:
    """Groups in creation order where names are numbers ('0', '1', ... '112')."""
    return (int(name), "") if name.isdigit() else (1 << 62, name)
