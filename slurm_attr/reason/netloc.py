"""Localising a network fault by vote (issue 12 item 1).

NCCL names the far end of a failing connection by address: ``Got completion from peer
10.20.6.17<50826>``, ``remoteGids::ffff:10.20.6.17`` (RoCE GIDs embed the IPv4 address),
``Connection closed by remote peer node07<41235>``; the near end is the host in NCCL's own
``host:pid:tid [dev]`` prefix (or the rank's node). Each failing connection is an edge between
two nodes. A faulty node or link sits on every failing edge; a healthy node that merely talked to
it sits on one. So the node common to all failing edges is the culprit (or, from three edges on,
one on at least three quarters of them and clearly ahead), and the tally is shown. One edge alone
cannot tell its ends apart (both are named, ambiguous).

Addresses map to nodes through job.json's ``node_addrs`` ({node: [addr, ...]}, Slurm's
NodeAddr/NodeHostName) and, failing that, through the NCCL INFO lines in which each host says
which address it bootstraps and talks on (``addrs_from_nccl_info``).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from ..model import Evidence, Symptom

ADDRESS = "address "  # label of a vote end that is an unmapped address, not a node name
_PEER = re.compile(r"^\[?(?P<addr>[^<>\s\]]+?)\]?(?:<\d+>)?$")
_REMOTE_GID = re.compile(r"remoteGids?\s*:?\s*(?:::ffff:)?(?P<ip>\d{1,3}(?:\.\d{1,3}){3})\b")
_NCCL_HOST = re.compile(r"(?:^|[\s\]])(?P<host>[A-Za-z0-9][\w.-]{0,127}):\d+:\d+ \[\d+\]")
# "Bootstrap : Using ib0:10.0.0.11<0>", "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.11<0>",
# "NET/Socket : Using [0]eth0:10.0.0.11<0>"
_INFO_ADDR = re.compile(r"NCCL INFO (?:Bootstrap|NET/\w+)\b[^\n]*?(?:Using|OOB)\b[^\n]*")
_IF_ADDR = re.compile(r"[\w.-]+:(?P<ip>\d{1,3}(?:\.\d{1,3}){3}|[0-9a-fA-F:]*:[0-9a-fA-F:]+)<\d+>")


def addrs_from_nccl_info(lines: Iterable[str]) -> dict[str, list[str]]:
    """host -> the addresses its NCCL INFO bootstrap/transport lines say it uses."""
    out: dict[str, set[str]] = {}
    for line in lines:
        if "NCCL INFO" not in line:
            continue
        m = _INFO_ADDR.search(line)
        h = _NCCL_HOST.search(line[:200])
        if not m or not h:
            continue
        for a in _IF_ADDR.finditer(m.group(0)):
            out.setdefault(h.group("host"), set()).add(a.group("ip"))
    return {h: sorted(v) for h, v in out.items()}


def _short(name: str) -> str:
    return name.split(".")[0]


class AddressBook:
    """Address or host name -> job node."""

    def __init__(self, job: Mapping[str, Any], nodes: Sequence[str]):
        self.nodes = list(nodes)
        self.by_addr: dict[str, str] = {}
        self.by_name: dict[str, str] = {}
        for n in self.nodes:
            self.by_name.setdefault(n.lower(), n)
            self.by_name.setdefault(_short(n).lower(), n)
        raw = job.get("node_addrs")
        if isinstance(raw, Mapping):
            for node, addrs in raw.items():
                if isinstance(addrs, str):
                    addrs = [addrs]
                if not isinstance(addrs, (list, tuple)):
                    continue
                for a in addrs:
                    if isinstance(a, str) and a:
                        self.by_addr.setdefault(a.lower(), str(node))

    def add_hosts(self, host_addrs: Mapping[str, Sequence[str]]) -> None:
        for host, addrs in host_addrs.items():
            node = self.node_of(host)
            if node is None:
                continue
            for a in addrs:
                self.by_addr.setdefault(a.lower(), node)  # Slurm's own record wins over the job's lines

    def node_of(self, name: Optional[str]) -> Optional[str]:
        if not name:
            return None
        key = name.lower()
        return self.by_addr.get(key) or self.by_name.get(key) or self.by_name.get(_short(key))


def peer_addr(s: Symptom) -> Optional[str]:
    """The far end's address of a failing-connection symptom: the rule's peer_ip/peer_host, its
    raw ``peer``, or the IPv4 address a RoCE remote GID embeds."""
    for key in ("peer_ip", "peer_host"):
        v = s.fields.get(key)
        if isinstance(v, str) and v:
            return v.strip("[]")
    raw = s.fields.get("peer")
    if isinstance(raw, str):
        m = _PEER.match(raw.strip())
        if m:
            return m.group("addr")
    gid = s.fields.get("remote_gid")
    if isinstance(gid, str):
        m = re.search(r"(\d{1,3}(?:\.\d{1,3}){3})$", gid)
        return m.group(1) if m else gid
    for e in s.evidence:
        g = _REMOTE_GID.search(e.text or "")
        if g:
            return g.group("ip")
    return None


def hosts_from_symptoms(syms: Iterable[Symptom]) -> dict[str, list[str]]:
    """host -> addresses, from the catalog's NCCL INFO bootstrap-address findings."""
    out: dict[str, set[str]] = {}
    for s in syms:
        if s.id != "nccl.bootstrap_address":
            continue
        host, ip = s.fields.get("host"), s.fields.get("ip")
        if isinstance(host, str) and isinstance(ip, str):
            out.setdefault(host, set()).add(ip)
    return {h: sorted(v) for h, v in out.items()}


def resolve_peers(syms: Iterable[Symptom], book: AddressBook) -> None:
    """Set ``fields['peer_node']`` on untrusted network symptoms whose far end is a job node."""
    for s in syms:
        if s.trusted or s.role == "context" or s.cause not in ("network", "comm_hang"):
            continue
        addr = peer_addr(s)
        node = book.node_of(addr)
        if node:
            s.fields["peer_node"] = node


@dataclass
class Vote:
    edges: list[tuple[str, str, Symptom]] = field(default_factory=list)
    tally: Counter = field(default_factory=Counter)
    winners: list[str] = field(default_factory=list)  # nodes on every failing edge (or a clear majority)

    @property
    def decisive(self) -> bool:
        return len(self.winners) == 1 and len(self.edges) >= 2

    def describe(self) -> str:
        n = len(self.edges)
        parts = ", ".join(f"{node} {c}/{n}" for node, c in self.tally.most_common(6))
        return f"failing connections per node: {parts}"


def vote(syms: Iterable[Symptom]) -> Vote:
    """Tally the nodes on every failing connection (distinct near/far node pairs)."""
    v = Vote()
    seen: set[tuple[str, str]] = set()
    for s in syms:
        if s.trusted or s.cause != "network" or s.role == "context" or s.status.earlier:
            continue
        a, b = s.node, s.fields.get("peer_node")
        if not isinstance(b, str):
            # a peer address no record maps to a node still counts: it is one job node's address
            addr = peer_addr(s)
            b = f"{ADDRESS}{addr}" if addr else None
        if not a or not isinstance(b, str) or a == b:
            continue
        edge = tuple(sorted((a, b)))
        if edge in seen:
            continue
        seen.add(edge)  # one broken pair reported by 8 ranks is still one connection
        v.edges.append((edge[0], edge[1], s))
        v.tally.update(edge)
    if v.edges:
        n = len(v.edges)
        v.winners = sorted(x for x, c in v.tally.items() if c == n)
        if not v.winners and n >= 3:
            # Teardown adds a few failing pairs between healthy nodes once the culprit is gone: a
            # node on at least three quarters of the connections, clearly ahead of the next, still wins.
            (top, c1), (_, c2) = v.tally.most_common(2)
            if c1 * 4 >= n * 3 and c1 > c2:
                v.winners = [top]
    return v


def vote_symptom(v: Vote) -> Symptom:
    """The vote as a finding of its own, with the failing connections as its evidence."""
    node = v.winners[0] if len(v.winners) == 1 and not v.winners[0].startswith(ADDRESS) else None
    n = len(v.edges)
    if node:
        summary = f"{node} is on all {n} failing network connections ({v.describe()})"
    elif len(v.winners) == 1:
        summary = (f"{v.winners[0]} is on all {n} failing network connections, but no record maps it to a node "
                   f"({v.describe()})")
    else:
        summary = f"the failing network connection{'s' if n > 1 else ''} cannot be pinned on one node ({v.describe()})"
    ev = [Evidence(source="analysis", text=v.describe())]
    for a, b, s in v.edges[:5]:
        if s.evidence:
            e = s.evidence[0]
            ev.append(Evidence(source=e.source, path=e.path, line=e.line, text=f"{a} <-> {b}: {e.text}"[:2000]))
    return Symptom(id="net.peer_vote", cause="network", role="root", priority=64, trusted=False, node=node,
                   summary=summary, fields={"edges": n, "tally": dict(v.tally),
                                            "nodes": [w for w in v.winners if not w.startswith(ADDRESS)],
                                            "addresses": [w[len(ADDRESS):] for w in v.winners if w.startswith(ADDRESS)]},
                   evidence=ev)


def explain_by_a_death(syms: list[Symptom], v: Vote, ranks: Mapping[int, str], rank_level: frozenset[str]) -> Optional[Symptom]:
    """Every failing connection ends at one address no record maps to a node, and exactly one
    node on none of those connections' near ends has a rank that failed on its own (its
    exception, its OOM): that address is that node's, and the connections failed because its
    process died. The untrusted network claims become that failure's cascade; the failure is
    returned. Not when any trusted network evidence exists (a link that really went down)."""
    if len(v.winners) != 1 or not v.winners[0].startswith(ADDRESS) or len(v.edges) < 2:
        return None
    if any(s.trusted and s.cause == "network" and s.role != "context" and not s.status.earlier for s in syms):
        return None
    reporters = {x for a, b, _s in v.edges for x in (a, b) if not x.startswith(ADDRESS)}
    own = [s for s in syms if s.role == "root" and not s.trusted and s.cause != "network" and s.cause in rank_level
           and s.rank is not None and not s.status.earlier]
    where = {s.node or ranks.get(s.rank) for s in own}  # type: ignore[arg-type]
    if len(where) != 1 or None in where or where & reporters:
        return None
    died = max(own, key=lambda s: s.priority)
    who = f"{died.id} on rank {died.rank}"
    for s in syms:
        if s.cause == "network" and not s.trusted and s.role in ("root", "confirmation") and not s.status.earlier:
            s.role = "cascade"
            s.status.caused_by = who
    return died


def place_vote(cause: str, primary: list[Symptom], v: Vote, syms: list[Symptom]) -> tuple[Optional[Symptom], list[Symptom]]:
    """Put the vote where it belongs; returns (the vote's symptom, the verdict's primary roots).

    It becomes the root of an untrusted network verdict (it names the node every failing
    connection shares), support for a trusted one, the cascade of a crash (by the roles the
    verdict assigns next), and mere context when no node is common to the failing connections."""
    if not v.edges or (cause != "network" and not (v.decisive and not v.winners[0].startswith(ADDRESS))):
        return None, primary  # a tally that localises nothing is noise beside another cause
    vs = vote_symptom(v)
    syms.append(vs)
    if cause == "network" and not any(p.trusted for p in primary) and v.winners:
        return vs, [vs]
    if not v.winners:
        vs.role = "context"
    return vs, primary


def assign_ranks(syms: Iterable[Symptom]) -> None:
    """Give NCCL error symptoms without a rank the rank their process has in the job.

    NCCL's init lines (``comm 0x.. rank 27 nranks 64 cudaDev 3 ...``, the catalog's
    nccl.comm_rank) map a host and CUDA device to a rank; errors in NCCL's own debug files carry
    the same host and device in their prefix. Only the largest communicator counts: a
    sub-communicator's rank is not the job's."""
    syms = list(syms)
    inits = [s for s in syms if s.id == "nccl.comm_rank" and isinstance(s.fields.get("nranks"), int)]
    if not inits:
        return
    world = max(s.fields["nranks"] for s in inits)
    where: dict[tuple[str, int], set[int]] = {}
    for s in inits:
        host, dev = s.fields.get("host"), s.fields.get("cuda_dev")
        if s.fields["nranks"] == world and isinstance(host, str) and isinstance(dev, int) and s.rank is not None:
            where.setdefault((_short(host).lower(), dev), set()).add(s.rank)
    for s in syms:
        if s.trusted or s.rank is not None or s.cause not in ("network", "comm_hang"):
            continue
        host, dev = s.fields.get("host"), s.fields.get("cuda_dev")
        if isinstance(host, str) and isinstance(dev, int):
            ranks = where.get((_short(host).lower(), dev))
            if ranks and len(ranks) == 1:
                s.rank = next(iter(ranks))  # one process per device: unambiguous
