"""Slow anomalies from the probe records (issue 14): S1 straggler, S2 slow link, S3 slow phase.

A hang stops progress; these do not: the job completes, only slower. They are informational
findings (``kind: "slow"``) beside the hang findings, shown by ``sattr`` and read by the
post-mortem as untrusted *context*: they never change a verdict's cause and never drain.

What each is measured from (all of it job-written, hostile, bounded):

* S1 straggler -- collective *entry* times. Each record's header ring (the last 60 operations
  of the process, all communicators) stamps every collective's start; ranks agree on a
  collective's per-communicator index (opi), so the same opi across every rank of a
  communicator is one collective. The node part sends the ring entries with each node's
  summary; the leader joins them by (communicator, opi) once every rank's entry is in. A rank
  that enters last by more than ``straggler_min_gap_ms`` (coarse clocks, NTP skew) in most of
  the last ``slow_window`` collectives is the straggler. What the job waited on it: the gap
  between it and the next-latest rank, capped at the collective's period (with launches
  running ahead of the GPU the entry gap can exceed the period; nobody waits longer than a
  period per collective), over the sum of periods.
* S2 slow link -- the peer tables: steps a sender has posted to the network and not seen
  complete (SendWait) toward each peer, sampled every cycle, and the steps it has completed.
  By Little's law the mean steps waiting over the completion rate is the time one step sits
  in the network: that, not the occupancy, is compared across pairs, because communicators
  carry different step counts (on the cluster a healthy world ring's links sat in SendWait
  2-4x as often as the half rings' links, each step no longer). A (communicator, sender,
  receiver) whose per-step time is an outlier against every other pair (median / MAD) is
  the slow link. Uniform slowness moves the median with it and fires nothing.
* S3 slow phase -- the collective period (median over ranks of each rank's interval between
  successive collectives) of the last ``phase_window`` collectives against the ones before:
  a jump by ``phase_factor`` for every rank (the 10th percentile moved too) while no rank
  enters late (the last-rank gap stays small: not a straggler).

The node's part (reading the rings, thinned for large jobs) is ring.py; the leader's join
of their entries into collectives, per communicator, join.py.
"""
from __future__ import annotations

import gc
import statistics
import time
from collections import Counter
from typing import Any

from ...probe import layout as L
from ...probe.comms import iso
from .join import Joined
from .ring import VERSION, node_part, ring_entries, stride

__all__ = ["SlowTracker", "node_part", "ring_entries", "stride"]

KIND = "slow"
TITLES = {"S1": "straggler", "S2": "slow link", "S3": "slow phase"}
LINK_SECOND_SHARE = 0.5  # a further outlier link is its own finding only at half the worst's SendWait
MAX_SLOW = 8  # slow findings per step (the findings file keeps 20 in all)
REFRESH_CYCLES = 10  # a standing finding's figures are rewritten at most this often
MAX_PAIRS = 1 << 16


# ---- the leader's part --------------------------------------------------------------------
def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Pair:
    """One sender -> receiver link of one communicator, over the cycles it was busy: n samples,
    ``wait`` the sum of steps seen in SendWait, ``done`` the steps completed meanwhile over
    ``t_ns``."""
    __slots__ = ("n", "wait", "done", "t_ns", "sent", "at_ns", "src", "dst", "src_node", "dst_node")

    def __init__(self, src: int, dst: int) -> None:
        self.n, self.wait, self.done, self.t_ns = 0, 0.0, 0.0, 0.0
        self.sent: int | None = None
        self.at_ns = 0
        self.src, self.dst = src, dst
        self.src_node = self.dst_node = None

    def step_s(self) -> float:
        """Seconds one step sat in SendWait (Little's law: mean waiting / completion rate)."""
        return self.wait * self.t_ns / (self.n * self.done) / 1e9


class SlowTracker:
    """Across leader cycles: joins the nodes' ring entries and peer gauges, and keeps the
    slow findings (new ones returned at once, standing ones refreshed now and then)."""

    def __init__(self, live_cfg: Any, job: str = "", step: str = "0"):
        self.cfg, self.job, self.step = live_cfg, job, step
        self.comms: dict[str, Joined] = {}
        self.pairs: dict[tuple[str, int, int], _Pair] = {}
        self.found: dict[tuple, dict[str, Any]] = {}
        self.cycles = 0
        self.error: str | None = None  # the last cycle's failure, if any (tests, debugging)

    # -- feeding -----------------------------------------------------------------------------
    def feed(self, summaries: list[dict[str, Any]], now_ns: int = 0) -> dict[str, dict[str, Any]]:
        """Communicators across the nodes' summaries, lighter than detect.combine (which copies
        every member): hash -> {label, nranks, parts: [(node, its members)]}; ``members(c)``
        indexes the members only where needed (peers, a finding to name)."""
        comms: dict[str, dict[str, Any]] = {}
        for s in summaries:
            node = s.get("node") if isinstance(s.get("node"), str) else None
            for c in s.get("comms") or ():
                if type(c) is not dict:
                    continue
                h, ml = c.get("hash"), c.get("members")
                if type(h) is not str or type(ml) is not list:
                    continue
                e = comms.get(h)
                if e is None:
                    e = comms[h] = {"label": str(c.get("label") or h)[:80], "nranks": 0, "parts": [], "count": 0}
                n = c.get("nranks")
                e["nranks"] = max(e["nranks"], n if type(n) is int and n <= 1 << 24 else 0)
                e["parts"].append((node, ml))
                e["count"] += len(ml)
        for h, c in comms.items():
            c["nranks"] = max(c["nranks"], c.pop("count"))
            st = self.comms.get(h)
            if st is None:
                st = self.comms[h] = Joined(self.cfg.slow_window)
            st.nranks = c["nranks"]
        for s in summaries:
            part = s.get("slow")
            if not isinstance(part, dict) or part.get("v") != VERSION or not isinstance(part.get("e"), list):
                continue
            for item in part["e"][:4096]:
                if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                        and is_int(item[1]) and isinstance(item[2], list)):
                    continue
                st = self.comms.get(item[0])
                if st is None or not 0 <= item[1] < max(st.nranks, 1):
                    continue
                st.add(item[1], item[2][:L.HRING])
        self._feed_pairs(comms, now_ns or time.time_ns())
        return comms

    @staticmethod
    def members(c: dict[str, Any]) -> dict[int, tuple[int | None, str | None, Any]]:
        """comm rank -> (global rank, node, peers) of one communicator, built once per cycle."""
        ms = c.get("members")
        if ms is None:
            ms = c["members"] = {}
            for node, ml in c["parts"]:
                for m in ml:
                    cr = m.get("cr") if type(m) is dict else None
                    if type(cr) is int and cr >= 0:
                        g = m.get("g")
                        ms[cr] = (g if type(g) is int else None, node, m.get("peers"))
        return ms

    def _feed_pairs(self, comms: dict[str, dict[str, Any]], now_ns: int) -> None:
        halve = 2 * max(self.cfg.link_min_samples, 30)  # a sliding window of sorts: old cycles fade
        for h, c in comms.items():
            if not any(type(m) is dict and m.get("peers") for _n, ml in c["parts"] for m in ml):
                continue  # no network peers (an NVLink-only group): nothing to index
            ms = self.members(c)
            for src, node, peers in ms.values():
                if not peers or src is None or type(peers) is not list:
                    continue
                for p in peers[:64]:
                    if not (type(p) is list and len(p) >= 4 and type(p[0]) is int and type(p[1]) is int
                            and type(p[3]) is int):
                        continue
                    dm = ms.get(p[0])
                    dst = dm[0] if dm is not None else None
                    if dst is None or src == dst:
                        continue
                    # per communicator: a pair in two communicators has a counter in each
                    key = (h, src, dst)
                    pr = self.pairs.get(key)
                    if pr is None:
                        if len(self.pairs) >= MAX_PAIRS:
                            continue
                        pr = self.pairs[key] = _Pair(src, dst)
                    sent, waiting = p[1], p[3]
                    # busy cycles only (an idle link between phases says nothing of its speed);
                    # a counter that went back is a new process: its first reading starts afresh
                    if pr.sent is not None and sent >= pr.sent and now_ns > pr.at_ns and (waiting > 0 or sent > pr.sent):
                        pr.n += 1
                        pr.wait += min(max(waiting, 0), 1 << 16)
                        pr.done += min(sent - pr.sent, 1 << 30)
                        pr.t_ns += now_ns - pr.at_ns
                        if pr.n >= halve:
                            pr.n, pr.wait, pr.done, pr.t_ns = pr.n // 2, pr.wait / 2, pr.done / 2, pr.t_ns / 2
                    pr.sent, pr.at_ns = sent, now_ns
                    pr.src_node, pr.dst_node = node, dm[1]

    # -- detecting ---------------------------------------------------------------------------
    def detect(self, comms: dict[str, dict[str, Any]], now_ns: int) -> list[dict[str, Any]]:
        """Every slow anomaly standing now, as finding dicts (not yet stored)."""
        cfg = self.cfg
        out = []
        gap_us = int(cfg.straggler_min_gap_ms * 1000)
        for h, st in self.comms.items():
            c = comms.get(h)
            # nothing newly joined: what stood last cycle stands (and is already reported)
            if not st.finalize(gap_us) or c is None or len(st.hist) < cfg.slow_min_samples:
                continue
            f = self._straggler(h, c, st, now_ns)
            if f:
                out.append(f)
            if st.appended - st.phase_at >= cfg.phase_window:  # medians: once per window's worth
                st.phase_at = st.appended
                f = self._phase(h, c, st, now_ns)
                if f:
                    out.append(f)
        # one straggler slows every communicator it is in: one finding, its most telling one
        best: dict[tuple, dict[str, Any]] = {}
        for f in out:
            key = tuple(f["ranks"]) if f["class"] == "S1" else (id(f),)
            # the largest share of the run waited; on a tie the larger communicator (world)
            if key not in best or (f["stats"]["wait_share"], f["nranks"]) > (best[key]["stats"]["wait_share"],
                                                                            best[key]["nranks"]):
                best[key] = f
        return list(best.values()) + self._links(now_ns)

    def _base(self, cls: str, comm: str | None, label: str, nranks: int, ranks: list[int], nodes: list[str],
              what: str, now_ns: int, stats: dict[str, Any]) -> dict[str, Any]:
        return {"job": self.job, "step": self.step, "kind": KIND, "class": cls, "title": TITLES[cls],
                "cause": "none", "detected": iso(now_ns), "detected_ns": now_ns, "comm": comm, "label": label,
                "nranks": nranks, "ranks": ranks, "nodes": nodes, "what": what, "source": "summary",
                "stats": stats, "symptoms": []}

    def _straggler(self, h: str, c: dict[str, Any], st: Joined, now_ns: int) -> dict[str, Any] | None:
        cfg = self.cfg
        hist = st.hist
        top = st.lasts.most_common(1)
        if not top or top[0][1] < cfg.straggler_share * len(hist):
            return None  # the usual case, and cheap: no rank is last often enough
        cr, cnt = top[0]
        share = cnt / len(hist)
        timed = [x for x in hist if x[4]]
        total = sum(x[4] for x in timed)
        mine = [x for x in timed if x[2] == cr]
        waited = sum(min(x[3], x[4]) for x in mine)
        wait = waited / total if total else 0.0
        # a lead beyond the period: the others ran ahead and then waited for it whole periods,
        # less their own (unseen) work: the share is an upper bound
        bound = "up to " if 2 * sum(x[3] >= x[4] for x in mine) > len(mine) else "~"
        if share < cfg.straggler_share or wait < cfg.straggler_min_wait:
            return None
        g, node, _peers = self.members(c).get(cr) or (None, None, None)
        g = cr if g is None else g
        node = node or "?"
        func = L.func_name(Counter(x[6] for x in hist if x[2] == cr).most_common(1)[0][0])
        gaps = sorted(x[3] for x in hist if x[2] == cr)
        what = (f"rank {g} on node {node} entered {func} last in {share:.0%} of the last {len(hist)} collectives "
                f"of {c['label']}; the job waited on it {bound}{wait:.0%} of its run time "
                f"(median lead of {gaps[len(gaps) // 2] / 1000:.1f} ms over the next-latest rank)")
        return self._base("S1", h, c["label"], c["nranks"], [g], [node], what, now_ns,
                          {"share": round(share, 3), "wait_share": round(wait, 3), "samples": len(hist),
                           "comm_rank": cr, "median_gap_ms": round(gaps[len(gaps) // 2] / 1000, 3)})

    def _phase(self, h: str, c: dict[str, Any], st: Joined, now_ns: int) -> dict[str, Any] | None:
        cfg = self.cfg
        timed = [x for x in st.hist if x[4]]
        w = cfg.phase_window
        if len(timed) < 3 * w:
            return None
        recent, before = timed[-w:], timed[:-w]
        base = statistics.median(x[4] for x in before)
        now_p = statistics.median(x[4] for x in recent)
        lo = statistics.median(x[5] for x in recent if x[5] is not None) if any(x[5] for x in recent) else 0
        gap = statistics.median(x[3] for x in recent)
        if (base <= 0 or now_p < cfg.phase_factor * base or lo < 0.5 * cfg.phase_factor * base
                or gap > 0.5 * (now_p - base)):  # not every rank slowed, or one enters late (S1)
            st.phase_since = None  # over: a later one is a new phase
            return None
        # when the phase began, kept while it stands: the window moves on every look, and a
        # refreshed finding said "detected 05:46:40 ... since 05:46:43" (the harness's slowphase)
        if st.phase_since is None:
            st.phase_since = recent[0][1]
        since = iso(st.phase_since * 1000)
        what = (f"all {c['nranks']} ranks of {c['label']} slowed together: a collective every "
                f"{now_p / 1000:.1f} ms over the last {w} (before: {base / 1000:.1f} ms, x{now_p / base:.1f}) "
                f"since {since}, no rank entering late")
        return self._base("S3", h, c["label"], c["nranks"], [], sorted({m[1] for m in self.members(c).values() if m[1]}),
                          what, now_ns, {"period_ms": round(now_p / 1000, 3), "base_ms": round(base / 1000, 3),
                                         "factor": round(now_p / base, 2), "since": since})

    def _links(self, now_ns: int) -> list[dict[str, Any]]:
        cfg = self.cfg
        # a pair that completed nothing while steps waited is stalled, not slow: the hang findings'
        scored = [(pr.step_s(), pr) for pr in self.pairs.values() if pr.n >= cfg.link_min_samples and pr.done > 0]
        if len(scored) < cfg.link_min_pairs:
            return []
        scores = sorted(s for s, _p in scored)
        med = statistics.median(scores)
        mad = 1.4826 * statistics.median(abs(s - med) for s in scores)
        out: list[dict[str, Any]] = []
        worst = None
        named: set[tuple[int, int]] = set()
        for score, pr in sorted(scored, key=lambda x: x[0], reverse=True)[:4]:
            if score < cfg.link_outlier_ratio * med:
                break
            if mad > 0 and score - med < cfg.link_outlier_mads * mad:
                break
            # A slow link backs up the ring's other links a little (on the cluster: 3->4 at
            # 0.98 steps waiting, the other cross-node link 7->0 at 0.25); a second slow link
            # of its own stands comparable to the first.
            worst = score if worst is None else worst
            if score < LINK_SECOND_SHARE * worst:
                break
            occupancy = pr.wait / pr.n
            if occupancy < cfg.link_min_send_wait or (pr.src, pr.dst) in named:
                continue  # rarely busy: the job lost little to it; or named in another communicator
            named.add((pr.src, pr.dst))
            ratio = f"{score / med:.0f}x" if med > 0 else "far longer than"
            what = (f"rank {pr.src} ({pr.src_node}) -> rank {pr.dst} ({pr.dst_node}): each send sat in the network "
                    f"{ratio} the median pair's ({score * 1000:.2f} vs {med * 1000:.2f} ms a step; "
                    f"{occupancy:.2f} steps waiting per cycle, {pr.n} cycles, {len(scored)} pairs)")
            nodes = [n for n in (pr.src_node, pr.dst_node) if isinstance(n, str)]
            out.append(self._base("S2", None, f"link {pr.src}->{pr.dst}", 2, [pr.src, pr.dst],
                                  list(dict.fromkeys(nodes)), what, now_ns,
                                  {"step_ms": round(score * 1000, 4), "median_ms": round(med * 1000, 4),
                                   "mad_ms": round(mad * 1000, 4), "send_wait": round(occupancy, 3),
                                   "samples": pr.n, "pairs": len(scored)}))
        return out

    # -- the watcher's one call ----------------------------------------------------------------
    def cycle(self, summaries: list[dict[str, Any]], doc: dict[str, Any], now_ns: int | None = None) -> list[dict[str, Any]]:
        """New slow findings, and standing ones whose figures are due a refresh (taken out of
        ``doc["findings"]`` so that the caller's append puts them back, updated, at the end)."""
        self.cycles += 1
        now_ns = now_ns or time.time_ns()
        paused = gc.isenabled()
        gc.disable()  # thousands of small acyclic tuples a cycle: no full collections meanwhile
        try:
            standing = self.detect(self.feed(summaries, now_ns), now_ns)
        except Exception as err:  # noqa: BLE001 - hostile summaries must never cost the hang detection
            self.error = f"{type(err).__name__}: {err}"[:300]
            return []
        finally:
            if paused:
                gc.enable()
        out = []
        refresh = self.cycles % REFRESH_CYCLES == 0
        for f in standing:
            # S1: one straggler slows every communicator it is in; S3: a slow phase slows them
            # all. One finding each, not one per communicator (S2: one per link, its two ranks).
            key = (f["class"], tuple(f["ranks"]))
            old = self.found.get(key)
            if old is None:
                if len(self.found) >= MAX_SLOW:
                    continue
                self.found[key] = f
                out.append(f)
            elif f["class"] == "S3" and f["nranks"] > old["nranks"]:
                # the phase seen on a larger communicator (the world after a ring): its figures
                first = old["detected"], old["detected_ns"]
                old.update(f, updated=f["detected"])
                old["detected"], old["detected_ns"] = first
                out.append(old)
            elif refresh and (f["class"] != "S3" or f["comm"] == old["comm"]):
                first = old["detected"], old["detected_ns"]
                old.update(f, updated=f["detected"])
                old["detected"], old["detected_ns"] = first
                out.append(old)
        if out:
            ids = {id(f) for f in out}
            doc["findings"] = [f for f in doc.get("findings", []) if id(f) not in ids]
        return out

