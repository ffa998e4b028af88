"""One incident's world, drawn from a seeded RNG: hosts, rank layout, times, clocks, formats.

Held-out worlds draw from a wider pool than tuning worlds (``World.pick``'s ``held`` options):
host-name schemes, rank layouts, kernel-log formats, launcher prefixes and clock offsets that no
tuning case shows. A rule tuned on the tuning set meets those only in the held-out set.
"""
from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

# Host-name schemes seen on real clusters (Slurm node names). The held-out ones add Cray nids,
# FQDNs with a deeper domain and vendor-style names.
_COMMON_HOSTS: list[Callable[[int], str]] = [
    lambda i: f"n{i}",
    lambda i: f"gpu-a{i:03d}",
    lambda i: f"node-{i:03d}.cluster",
]
_HELD_HOSTS: list[Callable[[int], str]] = [
    lambda i: f"nid{2700 + i:06d}",
    lambda i: f"hgx-h100-{i:02d}",
    lambda i: f"dgx{i:02d}.sc.example.org",
    lambda i: f"cn{i:04d}",
]
# H100 HGX bus ids of the eight GPUs, as the Xid lines print them (short BDF).
GPU_BDFS = ["0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00", "0000:9a:00", "0000:ab:00", "0000:ba:00", "0000:db:00"]
# The InfiniBand HCAs next to them (full BDF, mlx5 device name).
HCAS = [("0000:1a:00.0", "mlx5_0"), ("0000:2c:00.0", "mlx5_1"), ("0000:3c:00.0", "mlx5_2"), ("0000:5e:00.0", "mlx5_3"),
        ("0000:9c:00.0", "mlx5_4"), ("0000:ad:00.0", "mlx5_5"), ("0000:bc:00.0", "mlx5_6"), ("0000:dc:00.0", "mlx5_7")]


class World:
    """Everything about one generated job that is not the failure itself."""

    def __init__(self, klass: str, seed: int, held: bool) -> None:
        self.rng = random.Random(f"{klass}:{seed}")
        self.held = held
        self.job_id = str(self.rng.randint(10_000, 9_999_999))
        self.user = self.pick(["alice", "bob", "mlteam"], ["svc_train", "u1234567"])
        self.uid = self.rng.randint(1000, 60_000)
        self._layout()
        base = datetime(2023, 1, 1) + timedelta(days=self.rng.randint(0, 1000), seconds=self.rng.randint(0, 86_399))
        self.start = base.replace(microsecond=0)
        # A kernel clock per node: dmesg -T drifts, NTP-less nodes lag.
        spread = 75 if held else 20
        self.offsets = {n: self.rng.uniform(-spread, spread) for n in self.nodes}
        self.kfmt = self.pick(["journal", "dmesg_t"], ["iso", "iso_colon"])
        self.prefix = self.pick(["label", "rank", "both"], ["none", "default"])
        self.torch_new = self.chance(0.7)
        # One driver per cluster: the Xid line's shape is the same on every node of a job.
        self.xid_pci = self.pick([True], [True, False])  # old drivers print no "PCI:"
        self.xid_who = self.pick(["pid"], ["none", "angle"])
        self.nccl_version = self.pick(["2.18.5", "2.19.3", "2.20.5", "2.21.5"], ["2.23.4", "2.26.2"])
        # NCCL before 2.19 printed "with error N, opcode N, ..." (held-out only)
        self.ib_old_form = self.nccl_version < "2.19" and self.held and self.chance(0.5)
        self.pids = {r: self.rng.randint(2000, 4_000_000) for r in self.ranks}
        self.ips = self._addresses()

    # -- drawing -------------------------------------------------------------------------
    def pick(self, common: Sequence[T], held: Sequence[T] = ()) -> T:
        """One of ``common``; held-out worlds may also draw one of ``held``."""
        pool = list(common) + (list(held) if self.held else [])
        return self.rng.choice(pool)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def secs(self, lo: float, hi: float) -> timedelta:
        return timedelta(seconds=self.rng.uniform(lo, hi))

    # -- layout --------------------------------------------------------------------------
    def _layout(self) -> None:
        scheme = self.pick(_COMMON_HOSTS, _HELD_HOSTS)
        k = self.rng.randint(2, 8)
        per = self.rng.choice([g for g in (1, 2, 4, 8) if 2 <= g * k <= 64] or [1])
        base = self.rng.randint(1, 120)
        # Slurm allocates runs of numbered nodes, sometimes with gaps.
        self._pool = [scheme(i) for i in sorted(self.rng.sample(range(base, base + 11), 8))]
        idx = sorted(self.rng.sample(range(8), k))
        self.nodes = [self._pool[i] for i in idx]
        self.per_node = per
        cyclic = self.held and self.chance(0.3)  # srun --distribution=cyclic, held-out only
        n = k * per
        self.ranks = {r: self.nodes[r % k] if cyclic else self.nodes[r // per] for r in range(n)}

    def relayout(self, n_ranks: int) -> None:
        """A fixed world size (real Flight Recorder dumps): spread it over 2..8 of the nodes."""
        k = self.rng.choice([k for k in range(2, 9) if n_ranks % k == 0])
        self.nodes = self._pool[:k]
        per = n_ranks // k
        cyclic = self.held and self.chance(0.3)
        self.ranks = {r: self.nodes[r % k] if cyclic else self.nodes[r // per] for r in range(n_ranks)}
        self.per_node = per
        spread = 75 if self.held else 20
        self.offsets = {n: self.rng.uniform(-spread, spread) for n in self.nodes}
        self.pids = {r: self.rng.randint(2000, 4_000_000) for r in self.ranks}
        self.ips = self._addresses()

    def _addresses(self) -> dict[str, str]:
        """IPoIB addresses on one subnet, in node order (as a site numbers its hosts)."""
        net, first = f"10.{self.rng.randint(0, 40)}.{self.rng.randint(0, 250)}", self.rng.randint(2, 150)
        return {n: f"{net}.{first + i}" for i, n in enumerate(self.nodes)}

    def ranks_on(self, node: str) -> list[int]:
        return sorted(r for r, n in self.ranks.items() if n == node)

    def local_rank(self, rank: int) -> int:
        return self.ranks_on(self.ranks[rank]).index(rank)

    def gpu_of(self, rank: int) -> str:
        return GPU_BDFS[self.local_rank(rank) % len(GPU_BDFS)]

    def short(self, node: str) -> str:
        """The host name a node's own programs print (gethostname without the domain)."""
        return node.split(".")[0]

    def any_node(self, exclude: Sequence[str] = ()) -> str:
        return self.rng.choice([n for n in self.nodes if n not in exclude] or self.nodes)

    def any_rank(self, node: str | None = None) -> int:
        return self.rng.choice(self.ranks_on(node) if node else sorted(self.ranks))

    def others(self, exclude: Sequence[str]) -> list[str]:
        return [n for n in self.nodes if n not in exclude]
