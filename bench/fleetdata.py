"""A synthetic verdict store for the fleet benchmark (bench_fleet.py): N verdicts over M nodes.

Built through the store's own schema (``Store(path)`` runs every migration), then filled with
sqlite-utils' ``insert_all`` in the row layout ``Store.save``, ``record_actions``,
``ledger_record``, ``record_undrain``, ``record_recovery`` and ``record_diag`` write: 100,000
``save`` calls take minutes, the bulk insert seconds. ``verdict_json`` is a real
``Verdict.to_dict()``, drain reasons are ``drain.reason_for``'s, so readers see the shapes
production writes.

The mix, over ``days`` days ending at the build time (the "anchor", kept in a JSON file beside
the database so a later run reports on the same window):

- most jobs complete (cause ``none``), most failures are the user's (user_error, cuda_oom,
  host_oom), then scheduler ends (time_limit, cancelled, preempted), network (network,
  comm_hang), infrastructure (node_failure, filesystem) and ~1.7 % hardware (gpu_hardware,
  nvlink, host_hardware) with a trusted kernel symptom on node + GPU;
- a few lemon nodes are the culprit of half the hardware verdicts; a fatal event sometimes ends
  a second job on the same GPU (so distinct hardware events < hardware verdicts);
- jobs of 1-16 nodes, 1-8 GPUs per node, elapsed times from minutes to two days; ~1 % of jobs
  have no GPU count or elapsed time (stored before schema 4: unknown, NULL);
- each hardware verdict's drain applied, or blocked (already drained, circuit breaker,
  dry-run); reboots and GPU resets recorded as recoveries; most drained nodes are later
  diagnosed and undrained, some stay drained.

The database is cached in /var/tmp/sattr-bench-fleet by the parameters and the source of this
file, store.py and storeschema.py: rerunning the bench does not rebuild it.

    python bench/fleetdata.py [--verdicts 100000] [--nodes 500] [--days 30] [--seed 1] [--quiet]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from datetime import datetime, timezone
from typing import Any, Iterator

from slurm_attr import drain, store as store_mod, storeschema
from slurm_attr.storeschema import FLEET_COLUMNS, job_cost
from slurm_attr.model import Action, Coverage, Evidence, Symptom, Verdict

CACHE = "/var/tmp/sattr-bench-fleet"
GPUS = ["0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00", "0000:9a:00", "0000:ab:00", "0000:ba:00", "0000:db:00"]

# cause -> (share of verdicts in %, final job state, rules: (rule id, source, action, summary))
MIX: dict[str, tuple[float, str, list[tuple[str, str, str, str]]]] = {
    "none": (58.0, "COMPLETED", [("job.completed", "slurm", "none", "the job completed with exit code 0")]),
    "user_error": (15.0, "FAILED", [("python.exception", "stderr", "none", "ValueError: shapes (32,128) and (64,) not aligned"),
                                   ("cuda.illegal_address", "stderr", "none", "CUDA error: an illegal memory access was encountered")]),
    "cuda_oom": (5.0, "FAILED", [("cuda.oom", "stderr", "none", "CUDA out of memory. Tried to allocate 2.00 GiB")]),
    "host_oom": (2.0, "OUT_OF_MEMORY", [("host.oom_kill", "kernel", "none", "Out of memory: Killed process 4711 (python)")]),
    "time_limit": (3.0, "TIMEOUT", [("slurm.cancel_time_limit", "slurm", "none", "DUE TO TIME LIMIT")]),
    "cancelled": (5.0, "CANCELLED", [("slurm.cancelled", "slurm", "none", "CANCELLED by 10042")]),
    "preempted": (1.5, "PREEMPTED", [("slurm.cancel_preemption", "slurm", "none", "DUE TO PREEMPTION")]),
    "network": (3.0, "FAILED", [("net.ib_link_down", "kernel", "none", "mlx5_0 port 1 link down"),
                                ("nccl.remote_error", "nccl", "none", "NET/IB : Got completion with error 12, opcode 0")]),
    "comm_hang": (1.0, "FAILED", [("torch.nccl_error", "stderr", "none", "Watchdog caught collective operation timeout")]),
    "node_failure": (1.0, "NODE_FAIL", [("slurm.node_failure", "scheduler", "none", "node not responding")]),
    "filesystem": (0.5, "FAILED", [("fs.lustre_error", "kernel", "none", "LustreError: 11-0: scratch-OST0004 connection lost")]),
    "unknown": (3.3, "FAILED", [("job.failed_exit", "slurm", "none", "exited with code 1, no evidence says why")]),
    "gpu_hardware": (1.2, "FAILED", [("gpu.xid_79", "kernel", "reboot", "GPU has fallen off the bus"),
                                     ("gpu.xid_48", "kernel", "drain", "Double Bit ECC Error"),
                                     ("gpu.xid_95", "kernel", "reset", "Uncontained ECC error"),
                                     ("gpu.xid_64", "kernel", "drain", "ECC page retirement or row remapping failure")]),
    "nvlink": (0.2, "FAILED", [("nvlink.sxid_fatal", "kernel", "drain", "SXid 24007 fatal NVSwitch error"),
                               ("gpu.xid_74", "kernel", "drain", "NVLink error")]),
    "host_hardware": (0.3, "FAILED", [("host.mce_fatal", "kernel", "reboot", "Machine check: uncorrected memory error"),
                                      ("host.pcie_aer_fatal", "kernel", "drain", "PCIe Bus Error: severity=Uncorrected (Fatal)")]),
}
HARDWARE = ("gpu_hardware", "nvlink", "host_hardware")
LOCATED = HARDWARE + ("network", "node_failure", "filesystem")
EXIT = {"COMPLETED": (0, 0), "FAILED": (1, 0), "OUT_OF_MEMORY": (0, 9), "TIMEOUT": (0, 15), "CANCELLED": (0, 15),
        "PREEMPTED": (0, 15), "NODE_FAIL": (1, 0)}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


def slurm_time(ts: float) -> str:
    """Slurm's own form (job.json): local wall time without a zone; UTC here."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def cache_path(verdicts: int, nodes: int, days: int, seed: int) -> str:
    """The database file for these parameters and this code (store layout included)."""
    h = hashlib.sha256(f"{verdicts}/{nodes}/{days}/{seed}".encode())
    for mod in (sys.modules[__name__], store_mod, storeschema):
        with open(mod.__file__ or "", "rb") as f:
            h.update(f.read())
    return os.path.join(CACHE, f"fleet-{verdicts}v-{nodes}n-{days}d-s{seed}-{h.hexdigest()[:12]}.db")


class Fleet:
    """The generator's state: the nodes, who is a lemon, each node's drain and last event."""

    def __init__(self, rng: random.Random, nodes: int, anchor: float):
        self.rng, self.anchor = rng, anchor
        self.nodes = [f"gpu-{i:04d}" for i in range(nodes)]
        self.lemons = rng.sample(self.nodes, max(1, nodes // 50))
        self.users = [f"user{i:03d}" for i in range(300)]
        self.drained_until: dict[str, float] = {}
        self.drain_reason: dict[str, str] = {}
        self.last_event: dict[str, tuple[str, str, str, str, float]] = {}
        self.rows: dict[str, list[dict[str, Any]]] = {t: [] for t in ("actions", "drain_ledger", "undrains", "recoveries", "diags")}

    def causes(self, n: int) -> list[str]:
        names = list(MIX)
        return self.rng.choices(names, weights=[MIX[c][0] for c in names], k=n)

    def job_nodes(self, cause: str) -> list[str]:
        k = self.rng.choices([1, 2, 4, 8, 16], weights=[70, 14, 9, 5, 2])[0]
        picked = self.rng.sample(self.nodes, k)
        if cause in HARDWARE and self.rng.random() < 0.5:
            lemon = self.rng.choice(self.lemons)
            if lemon not in picked:
                picked[0] = lemon
        return picked


def _job_row(jid: str, f: Fleet, cause: str, nodes: list[str], end: float, elapsed: float, gpus: int | None) -> dict[str, Any]:
    state = MIX[cause][1]
    code, sig = EXIT[state]
    u = f.rng.randrange(len(f.users)) if f.rng.random() < 0.5 else int(f.rng.paretovariate(1.2)) % len(f.users)
    # Store.save's keys in its order, then schema 4's two columns.
    return {"job_id": jid, "slurm_job_id": jid, "bundle_key": jid, "user": f.users[u], "uid": 10000 + u,
            "partition": f.rng.choices(["gpu", "gpu-long", "debug"], weights=[80, 15, 5])[0], "nodes": json.dumps(nodes),
            "state": state, "exit_code": code, "signal": sig, "start_time": slurm_time(end - elapsed),
            "end_time": slurm_time(end), "bundle_path": f"/var/spool/sattr/bundles/{jid}", "updated_at": end + 5,
            "gpus": gpus if gpus is None or f.rng.random() > 0.01 else None,
            "elapsed_s": elapsed if f.rng.random() > 0.01 else None}


def _symptoms(f: Fleet, cause: str, jid: str, nodes: list[str], end: float) -> list[Symptom]:
    rule, source, action, text = f.rng.choice(MIX[cause][2])
    node = nodes[0] if cause in LOCATED else f.rng.choice(nodes)
    gpu, when = None, end - f.rng.uniform(1, 30)
    if cause in HARDWARE:
        prev = f.last_event.get(node)
        if prev and prev[4] > end - 2 * 86400 and f.rng.random() < 0.15:
            rule, _src, action, text, when = prev  # the same fatal event ended this job too
            gpu = prev[1]
        else:
            gpu = f.rng.choice(GPUS) if not rule.startswith("host.") else None
        f.last_event[node] = (rule, gpu or "", action, text, when)
        gpu = gpu or None
    trusted = source in ("kernel", "slurm", "scheduler")
    line = (f"{iso(when)} {node} kernel: NVRM: Xid (PCI:{gpu}): {rule.rsplit('_', 1)[-1]}, {text}" if rule.startswith("gpu.xid")
            else f"{iso(when)} {node} {text}")
    path = f"nodes/{node}/kernel.log" if source == "kernel" else "output/stdout"
    root = Symptom(id=rule, cause=cause, role="root", priority=90 if cause in HARDWARE else 50, trusted=trusted, node=node,
                   rank=None if trusted else f.rng.randrange(8 * len(nodes)), gpu=gpu, time=iso(when),
                   action=action if trusted else "none", summary=f"{text} on {node}" + (f" GPU {gpu}" if gpu else ""),
                   fields={"xid": int(rule.rsplit("_", 1)[-1])} if rule.startswith("gpu.xid") else {},
                   evidence=[Evidence(source=source, path=path, line=f.rng.randrange(1, 5000), text=line)])
    out = [root]
    if cause in HARDWARE + ("network",) and len(nodes) > 1:  # the other nodes saw the connection close
        other = nodes[1]
        out.append(Symptom(id="nccl.remote_closed", cause="network", role="cascade", priority=40, node=other,
                           rank=f.rng.randrange(8 * len(nodes)), time=iso(when + 2),
                           summary=f"connection to {node} closed by peer",
                           evidence=[Evidence(source="nccl", path="output/stdout", line=12, text=f"{other}: NET/IB remote closed")]))
    return out


def _drain(f: Fleet, cause: str, jid: str, root: Symptom, at: float) -> list[Action]:
    """The drain decision for a hardware verdict's node, its recovery, and its later undrain."""
    node, rows = root.node or "", f.rows
    reason = drain.reason_for(cause, root, jid)
    act = Action(kind="drain", node=node, reason=reason)
    r = f.rng.random()
    if f.drained_until.get(node, 0) > at:
        act.blocked_by = "already drained"
    elif r < 0.04:
        act.blocked_by = "circuit breaker"
    elif r < 0.06:
        act.blocked_by = drain.BLOCK_DRY_RUN
    else:
        act.applied = True
    path = "fast" if f.rng.random() < 0.3 else "central"
    rows["actions"].append({"job_id": jid, "kind": act.kind, "node": node, "reason": reason, "applied": int(act.applied),
                            "blocked_by": act.blocked_by, "decided_at": at, "path": path, "actor": "sattr"})
    if not act.applied:
        return [act]
    rows["drain_ledger"].append({"node": node, "job_id": jid, "kind": "drain", "path": path, "partitions": json.dumps(["gpu"]),
                                 "reason": reason, "at": at, "status": "applied"})
    f.drain_reason[node] = reason
    acts = [act]
    if root.action in ("reboot", "reset"):
        cmd = (["scontrol", "reboot", "ASAP", "nextstate=DRAIN", node] if root.action == "reboot"
               else ["nvidia-smi", "-r", "-i", str(root.gpu)])
        ok = f.rng.random() < 0.95
        rows["recoveries"].append({"job_id": jid, "node": node, "gpu": root.gpu or "", "kind": root.action, "command": json.dumps(cmd),
                                   "rc": 0 if ok else 1, "at": at + 1, "ok": int(ok), "detail": "" if ok else "GPU busy"})
        acts.append(Action(kind=root.action, node=node, reason=reason, applied=ok, blocked_by=None if ok else "GPU busy"))
    back = at + f.rng.uniform(2, 72) * 3600
    f.drained_until[node] = back
    if back > f.anchor or f.rng.random() < 0.1:
        f.drained_until[node] = f.anchor + 1e9 if back > f.anchor else back  # still drained at the end
        return acts
    passed = f.rng.random() < 0.9
    rows["diags"].append({"node": node, "command": "/usr/local/sbin/nodediag --quick", "rc": 0 if passed else 2, "ok": int(passed),
                          "at": back - 600, "took_s": round(f.rng.uniform(60, 600), 3),
                          "output": "all checks passed\n" if passed else "dcgmi diag -r 2: FAIL memory\n", "actor": "sattr",
                          "trigger": "auto_undrain"})
    rows["undrains"].append({"node": node, "job_id": jid, "drain_reason": reason,
                             "why": "diagnostic passed" if passed else "GPU replaced", "actor": "sattr" if passed else "root",
                             "at": back if passed else back + 86400, "ok": 1, "detail": ""})
    return acts


def _records(f: Fleet, verdicts: int, days: int
             ) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[Symptom], list[Coverage]]]:
    """One job, verdict, its fleet row (storeschema's narrow copy), symptoms and coverage at a
    time, oldest first."""
    ends = sorted(f.anchor - f.rng.random() * days * 86400 for _ in range(verdicts))
    for i, (end, cause) in enumerate(zip(ends, f.causes(verdicts))):
        jid = str(1_000_000 + i)
        nodes = f.job_nodes(cause)
        per_node = 8 if len(nodes) > 1 else f.rng.choice([1, 2, 4, 8])
        limit = f.rng.choices([4, 24, 48], weights=[70, 25, 5])[0] * 3600.0
        # failures come earlier in a job's life than completions (many at start-up)
        mu = 8.0 if cause == "none" else 7.2
        elapsed = limit if cause == "time_limit" else min(limit, 60 + f.rng.lognormvariate(mu, 1.2))
        job = _job_row(jid, f, cause, nodes, end, round(elapsed, 1), per_node * len(nodes))
        syms = _symptoms(f, cause, jid, nodes, end)
        at = end + f.rng.lognormvariate(1.5, 0.8)  # job end -> verdict stored, seconds
        v = Verdict(job_id=jid, cause=cause, summary=syms[0].summary if cause != "none" else "completed",
                    symptoms=syms, ambiguous=f.rng.random() < 0.03)
        if cause in LOCATED:
            v.culprit_nodes = [syms[0].node or nodes[0]]
            v.culprit_gpus = [syms[0].gpu] if syms[0].gpu else []
        elif cause not in ("none", "time_limit", "cancelled", "preempted"):
            v.culprit_ranks = [syms[0].rank or 0]
        if cause in HARDWARE and syms[0].trusted:
            v.actions = _drain(f, cause, jid, syms[0], at)
        cov = [Coverage(source="stdout")] + [Coverage(source=s, node=n) for n in nodes[:4] for s in ("node", "kernel")]
        row = {"job_id": jid, "cause": v.cause, "domain": v.domain, "summary": v.summary, "ambiguous": int(v.ambiguous),
               "culprit_nodes": json.dumps(v.culprit_nodes), "culprit_ranks": json.dumps(v.culprit_ranks),
               "culprit_gpus": json.dumps(v.culprit_gpus), "verdict_json": json.dumps(v.to_dict()), "analyzed_at": at,
               "analysis_ms": round(f.rng.uniform(40, 900), 1)}
        failed, lost = job_cost(job["state"], job["gpus"], job["elapsed_s"])
        narrow = dict(zip(FLEET_COLUMNS, (jid, at, job["partition"] or "", job["user"], v.cause, v.domain, failed, lost,
                                          at - end, row["culprit_nodes"])))
        yield job, row, narrow, syms, cov


def slurm_nodes(f: Fleet) -> list[dict[str, str]]:
    """Slurm's node records at the anchor (scontrol's keys): the nodes our drains left drained
    carry our reason, the rest are in service."""
    out = []
    for n in f.nodes:
        if f.drained_until.get(n, 0) > f.anchor:
            out.append({"NodeName": n, "State": "IDLE+DRAIN", "Reason": f.drain_reason.get(n, "SATTR: drained")})
        else:
            out.append({"NodeName": n, "State": f.rng.choice(["IDLE", "MIXED", "ALLOCATED"]), "Reason": ""})
    return out


def build(path: str, verdicts: int = 100_000, nodes: int = 500, days: int = 30, seed: int = 1) -> dict[str, Any]:
    """Write the store at ``path`` (replaced); returns what the sidecar JSON holds."""
    for p in (path, path + "-wal", path + "-shm"):
        if os.path.exists(p):
            os.unlink(p)
    f = Fleet(random.Random(seed), nodes, anchor=float(int(time.time())))
    st = store_mod.Store(path)
    db = st.db
    db.conn.execute("PRAGMA synchronous=OFF")  # a bench fixture: rebuilt if a crash leaves it torn
    jobs, verdict_rows, fleet_rows, sym_rows, ev_rows, cov_rows = [], [], [], [], [], []
    sid = 0
    for job, row, narrow, syms, cov in _records(f, verdicts, days):
        jobs.append(job)
        verdict_rows.append(row)
        fleet_rows.append(narrow)
        for s in syms:
            sid += 1
            sym_rows.append({"id": sid, "job_id": job["job_id"], "rule_id": s.id, "cause": s.cause, "role": s.role,
                             "priority": s.priority, "trusted": int(s.trusted), "node": s.node, "rank": s.rank, "gpu": s.gpu,
                             "time": s.time, "action": s.action, "summary": s.summary,
                             "fields_json": json.dumps(s.fields, default=str), "seen_at": row["analyzed_at"]})
            ev_rows += [{"symptom_id": sid, "job_id": job["job_id"], "source": e.source, "path": e.path, "line": e.line,
                         "text": (e.text or "")[:2000]} for e in s.evidence]
        cov_rows += [{"job_id": job["job_id"], **c.to_dict()} for c in cov]
    with db.conn:
        for table, rows in (("jobs", jobs), ("verdicts", verdict_rows), ("fleet", fleet_rows), ("symptoms", sym_rows),
                            ("evidence", ev_rows),
                            ("coverage", cov_rows), *f.rows.items()):
            db[table].insert_all(rows, batch_size=2000)
    db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.conn.close()
    causes: dict[str, int] = {}
    for r in verdict_rows:
        causes[r["cause"]] = causes.get(r["cause"], 0) + 1
    return {"path": path, "anchor": f.anchor, "slurm_nodes": slurm_nodes(f), "days": days, "verdicts": verdicts, "nodes": nodes, "seed": seed,
            "lemons": sorted(f.lemons), "causes": causes, "symptoms": len(sym_rows),
            **{t: len(rows) for t, rows in f.rows.items()}}


def ensure(verdicts: int = 100_000, nodes: int = 500, days: int = 30, seed: int = 1, log: Any = print) -> dict[str, Any]:
    """The cached store for these parameters (built when missing); its sidecar's facts."""
    path = cache_path(verdicts, nodes, days, seed)
    side = path + ".json"
    if os.path.exists(side) and os.path.exists(path):
        with open(side) as fh:
            return json.load(fh)
    os.makedirs(CACHE, exist_ok=True)
    stem = os.path.basename(path).rsplit("-", 1)[0] + "-"
    for old in os.listdir(CACHE):  # the same parameters built by older code: 170 MB each
        if old.startswith(stem) and not old.startswith(os.path.basename(path)):
            os.unlink(os.path.join(CACHE, old))
    t0 = time.monotonic()
    log(f"building a synthetic store of {verdicts} verdicts over {nodes} nodes in {path} ...")
    tmp = path + ".building"
    info = build(tmp, verdicts, nodes, days, seed)
    os.replace(tmp, path)  # the sidecar last: a half-built store is never taken for a cached one
    info.update(path=path, build_s=round(time.monotonic() - t0, 1))
    with open(side + ".tmp", "w") as fh:
        json.dump(info, fh)
    os.replace(side + ".tmp", side)
    log(f"  built in {info['build_s']} s ({os.path.getsize(path) / 2**20:.0f} MiB)")
    return info


def store_args(ap: argparse.ArgumentParser) -> None:
    """The synthetic store's parameters (this file's main and bench_fleet.py)."""
    ap.add_argument("--verdicts", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    store_args(ap)
    ap.add_argument("--quiet", action="store_true", help="print only the database's path (the build's notes go to stderr)")
    a = ap.parse_args()
    info = ensure(a.verdicts, a.nodes, a.days, a.seed, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(info["path"] if a.quiet else json.dumps({k: v for k, v in info.items() if k != "slurm_nodes"}, indent=1))


if __name__ == "__main__":
    main()
