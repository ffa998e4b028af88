"""Issue 21 on the real cluster: what one hostile job can make the root watchers write, hold
and start is bounded per job and node, and a spoofed node list changes nothing.

Jobs run in partition ``live``: the installed plugin starts the watchers (one per node and
step, through live/host.py's slots) and sets each task's TORCH_WORKER_SERVER_SOCKET. The
ranks are tests/integration/hostile_ranks.py, serving torch's worker-server protocol with
replies a red team chose; their Flight Recorder shows a collective never retired, so the
watchers' FR poll finds a hang after ``hang_after_s`` and pulls dumps (``on_hang = dump``).
Each case has its near miss: a job of the same shape whose answers are ordinary.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_attr import config as config_mod
from slurm_attr import gc
from slurm_attr.live import findings

pytestmark = pytest.mark.cluster

USER = "sattrtest"
RANKS = Path(__file__).with_name("hostile_ranks.py")
MiB = 1 << 20


def _spool(cluster) -> str:
    return config_mod.load(str(cluster.config_path)).paths.spool


def _script(cluster, steps: int, count: int, kind: str, fr_bytes: int, minutes: int = 5, node: str = "n1") -> str:
    """One node; ``steps`` concurrent ``srun --overlap`` steps, each serving ``count`` sockets."""
    runs = "\n".join(
        f"srun --overlap -n1 -N1 {sys.executable} -u {RANKS} --first {s * count} --count {count} "
        f"--kind {kind} --fr-bytes {fr_bytes} &" for s in range(steps))
    return f"""#!/bin/bash
#SBATCH -N1 -n1 -w {node} -p live -t {minutes}
{runs}
wait
"""


def _wait(pred, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s (last: {got!r})")


def _settled(cluster, job: str, steps: int):
    """The findings of every step, once each has its dumps merged (the collection is done)."""
    doc = findings.load(_spool(cluster), job) or {}
    done = [f for f in doc.get("findings", []) if isinstance(f.get("dumps"), dict)]
    return done if len({f.get("step") for f in done}) >= steps else None


def _live_bytes(cluster, job: str) -> tuple[int, int]:
    """(bytes of every file in the job's live dir, FR dumps kept)."""
    total = frs = 0
    for root, _dirs, files in os.walk(os.path.join(_spool(cluster), "live", job)):
        for f in files:
            total += os.lstat(os.path.join(root, f)).st_size
            frs += root.endswith("/fr") and f.startswith("nccl_trace_rank_")
    return total, frs


def _run_steps(cluster, steps: int, count: int, kind: str, fr_bytes: int) -> tuple[str, list, int, int]:
    job = cluster.sbatch(_script(cluster, steps, count, kind, fr_bytes), user=USER)
    try:
        cluster.wait_running(job)
        found = _wait(lambda: _settled(cluster, job, steps), 150, f"job {job}: every step's dumps")
        total, frs = _live_bytes(cluster, job)
    finally:
        cluster.run(["scancel", job], check=False)
    return job, found, total, frs


def test_a_job_filling_the_spool_stays_within_its_nodes_live_budget(cluster):
    """The red team's job: 4 steps on one node, each serving 16 sockets that answer 16 MiB of FR
    (1 GiB offered; 1,041 MB written before). The node keeps its share, 128 MiB by default; what
    did not fit is named in the dumps' coverage and in `sattr live`."""
    job, found, total, frs = _run_steps(cluster, 4, 16, "pad", 16 * MiB)
    cap = config_mod.load(str(cluster.config_path)).live.node_cap_bytes
    assert total <= cap + MiB, (total, cap)  # + the small files: summaries, findings, results
    assert total >= cap - 17 * MiB and frs >= (cap // (16 * MiB)) - 1, (total, frs)  # filled up to it, no further
    dropped = [d for f in found for d in f["dumps"].get("dropped") or []]
    # A later step's collection pushes out older dumps first, then keeps no more than fits. Which
    # of the two a dump meets depends on how many sockets answered within the collection's
    # deadline (fewer on a loaded machine: then each collection fits once older dumps are gone):
    # both are named, and 1 GiB offered against a 128 MiB share cannot all stay.
    assert dropped, found
    assert all("over this node's live budget for the job" in d or "removed to make room" in d for d in dropped), dropped
    out = cluster.sattr("live", job, check=True).stdout
    assert "    n1: " in out and (" not kept: 16777216 bytes over this node's live budget" in out
                                  or "removed to make room" in out), out
    # each step's watcher asked only its own step's 16 sockets (they carry no step): the ranks
    # one finding kept are all of one step's block
    for f in found:
        blocks = {r // 16 for r in f["dumps"].get("fr_ranks") or []}
        assert len(blocks) <= 1, (f["step"], f["dumps"]["fr_ranks"])
    print(f"\nspool fill: 4 steps x 16 sockets x 16 MiB offered; live dir {total / MiB:.1f} MiB "
          f"(node cap {cap / MiB:.0f} MiB), {frs} FR dumps kept, {len(dropped)} not kept")
    # Retention: over a small max_bytes, this job's live dumps go before any other bundle (once
    # its verdict is stored: a pending job's data is never removed).
    cluster.verdict(job)
    queue = config_mod.load(str(cluster.config_path)).intake.queue_dir
    _wait(lambda: not os.path.exists(os.path.join(queue, f"{job}.json")), 60, f"job {job} out of the pending queue")
    spool = _spool(cluster)
    before = json.loads(cluster.sattr("gc", "--dry-run", "--json", check=True).stdout)["bytes_before"]
    # all the live bulk on the spool but a byte must go (earlier runs' may be as big as this
    # job's): the plan takes it, this job's among it, and no bundle of anyone's
    live = Path(spool) / "live"
    bulk = sum(gc.tree_bytes(str(d / part)) + (d / part).lstat().st_blocks * 512
               for d in live.iterdir() for part in ("dumps", "steps") if (d / part).is_dir())
    with cluster.settings(spool={"max_bytes": max(1, before - bulk + 1)}):
        plan = json.loads(cluster.sattr("gc", "--dry-run", "--json", check=True).stdout)
    keys = [r["key"] for r in plan["removed"]]
    assert f"live/{job}/dumps" in keys, keys
    assert all(k.startswith("live/") and k.endswith(("/dumps", "/steps")) for k in keys), keys  # no bundle
    assert os.path.isdir(os.path.join(spool, "live", job, "dumps"))  # a dry run removes nothing


def test_near_miss_a_job_of_the_same_shape_keeps_all_its_dumps(cluster):
    job, found, total, frs = _run_steps(cluster, 4, 16, "pad", 200 << 10)
    assert frs == 64, (frs, total)
    assert not [d for f in found for d in f["dumps"].get("dropped") or []]
    out = cluster.sattr("live", job, check=True).stdout
    assert "not kept" not in out and "removed to make room" not in out and "over the live budget" not in out, out


def _watcher_pids(job: str | None, min_age_s: float = 0.0) -> list[int]:
    """The watcher processes started for the job's steps (None: every job's); ``min_age_s``:
    only those running that long (a step beyond the slots starts one that queues its step and
    exits at once)."""
    out = subprocess.run(["pgrep", "-f", "slurm_attr.live watch"], capture_output=True, text=True).stdout
    ticks, now = os.sysconf("SC_CLK_TCK"), time.clock_gettime(time.CLOCK_BOOTTIME)
    pids = []
    for p in out.split():
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            start = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
        except (OSError, ValueError, IndexError):
            continue
        if (b"--job" in cmd and (job is None or cmd[cmd.index(b"--job") + 1] == job.encode())
                and now - start >= min_age_s):
            pids.append(int(p))
    return pids


def _rss_mb(pid: int) -> float:
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("VmHWM:"):
                return int(ln.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@pytest.mark.parametrize("kind", ["flat", "deep"])
def test_replies_built_to_cost_memory_are_refused_and_the_cycle_goes_on(cluster, kind):
    """One socket answering 16 MiB of `{},{},...` took a watcher from 27 MB to 459 MB; one nested
    200,000 deep raised RecursionError every cycle and no summary was written. Now: the watcher's
    peak stays under its cap, the node's summary is written, and the rank's coverage says why."""
    job = cluster.sbatch(_script(cluster, 1, 4, kind, 0), user=USER)
    try:
        cluster.wait_running(job)
        spool = _spool(cluster)
        summary = Path(spool) / "live" / job / "summary" / "0" / "n1.json"
        s = _wait(lambda: (json.loads(summary.read_text()) if summary.exists() else None) or None, 60,
                  "the node's summary")
        # every rank polled: each refused with its reason, or (a depth msgspec skips without
        # recursing, as on Python 3.14) decoded into its few fields, never a failed cycle
        s = _wait(lambda: (lambda d: d if len(d.get("fr") or {}) == 4 else None)(json.loads(summary.read_text())),
                  60, "every rank's FR poll in the summary")
        time.sleep(6)  # a few more polls of the hostile replies
        # every watcher process (the one polling this job may be another job's host, which
        # adopted its step: live/host.py); none may have grown past its cap
        pids = _watcher_pids(None)
        assert pids, "no watcher"
        peak = max(_rss_mb(p) for p in pids)
        cap = config_mod.load(str(cluster.config_path)).live.watcher_mem_bytes / MiB
        s = json.loads(summary.read_text())
        cov = (findings.load(spool, job) or {}).get("coverage", "")
    finally:
        cluster.run(["scancel", job], check=False)
    if kind == "flat":
        why = "JSON objects, over the watcher's cap"
        assert all(why in v.get("error", "") for v in s["fr"].values()), s["fr"]
        assert len([p for p in s["fr_problems"] if p.startswith("rank ") and why in p]) == 4, s["fr_problems"]
        assert "FR poll" in cov and why in cov, cov
    else:
        for v in s["fr"].values():
            # refused, or (msgspec skipping the deep unknown field) decoded to an entry without a
            # group or state, which counts in no group: either way no error of another kind
            assert "nested too deep to decode" in v.get("error", "") or ("error" not in v and v.get("pg") == {}), v
        assert all("nested too deep" in p for p in s["fr_problems"] if p.startswith("rank ")), s["fr_problems"]
    assert peak < min(cap, 200), peak
    print(f"\n{kind} replies: watcher peak RSS {peak:.0f} MB (cap {cap:.0f} MB); summary written (seq "
          f"{s.get('seq')}); coverage: {cov[:160]}")


def test_fifty_steps_on_one_node_share_the_nodes_watchers_and_a_capped_steps_hang_is_found(cluster):
    """50 `srun --overlap` steps made 51 root watchers (1.48 GB). Now at most [live] max_watchers
    processes run on the node, the other steps adopted by them; every step hangs in its FR, and
    every step's hang is found and dumped, the adopted ones' too."""
    steps = 50
    runs = "\n".join(f"srun --overlap -n1 -N1 {sys.executable} -u {RANKS} --first {s} --count 1 "
                     f"--kind pad --fr-bytes {4096 if s == steps - 1 else 2048} &" for s in range(steps))
    job = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1 -n1 -w n2 -p live -t 5\n{runs}\nwait\n", user=USER)
    try:
        cluster.wait_running(job)
        t0 = time.monotonic()
        deadline = t0 + 180
        f = None
        while time.monotonic() < deadline:
            doc = findings.load(_spool(cluster), job) or {}
            dumped = [x for x in doc.get("findings", []) if isinstance(x.get("dumps"), dict)]
            if len({x.get("step") for x in dumped}) >= steps:
                f = dumped
                break
            time.sleep(0.3)
        took = time.monotonic() - t0
        steps_seen = {x.get("step") for x in (findings.load(_spool(cluster), job) or {}).get("findings", [])}
        if took < 25:
            time.sleep(25 - took)
        # the watchers that run for the job's life (20 s: a step beyond the slots starts one that
        # queues its step and exits at once, even on a loaded machine)
        long_lived = _watcher_pids(job, min_age_s=20)
        peak_procs = len(long_lived)
        rss = sum(_rss_mb(p) for p in long_lived)
    finally:
        cluster.run(["scancel", job], check=False)
    cap = config_mod.load(str(cluster.config_path)).live.max_watchers
    assert f is not None, f"not every step's hang found and dumped; steps with findings: {sorted(steps_seen)}"
    assert all(len(x["dumps"]["fr_ranks"]) == 1 for x in f), [x["dumps"] for x in f]  # each its one rank
    assert 1 <= peak_procs <= cap, peak_procs
    print(f"\n50 steps: at most {peak_procs} watcher processes on n2 (cap {cap}), {rss:.0f} MB together; "
          f"all {len(steps_seen)} steps' hangs found and dumped {took:.0f} s after the job started")


def test_a_spoofed_step_node_list_changes_nothing(cluster):
    """SLURM_STEP_NODELIST=n3 exported before sbatch of a job pinned to n1: the batch step's
    watcher still runs as n1's (its summary, its slot), nothing is written for n3."""
    script = f"#!/bin/bash\n#SBATCH -N1 -n1 -w n1 -p live -t 2\nexec {sys.executable} -u {RANKS} --first 0 --count 1 --kind pad --fr-bytes 2048\n"
    path = Path(cluster.workdir(USER)) / f"spoof-{time.time_ns()}.sh"
    path.write_text(script)
    subprocess.run(["chown", USER, str(path)], check=True)
    out = cluster.run(["sbatch", "--parsable", "--export=ALL", str(path)], user=USER,
                      env={"SLURM_STEP_NODELIST": "n3", "SLURM_NODELIST": "n3"}, cwd=str(path.parent))
    job = out.stdout.strip().split(";")[0]
    try:
        cluster.wait_running(job)
        summary = Path(_spool(cluster)) / "live" / job / "summary" / "batch"
        _wait(lambda: summary.is_dir() and os.listdir(summary), 60, "the batch watcher's summary")
        names = sorted(os.listdir(summary))
        env = cluster.run(["scontrol", "show", "job", job], check=True).stdout
    finally:
        cluster.run(["scancel", job], check=False)
    assert names == ["n1.json"], names
    assert "BatchHost=n1" in env, env


def test_near_miss_without_the_spoof_the_batch_watcher_is_n1s_too(cluster):
    script = f"#!/bin/bash\n#SBATCH -N1 -n1 -w n1 -p live -t 2\nexec {sys.executable} -u {RANKS} --first 0 --count 1 --kind pad --fr-bytes 2048\n"
    job = cluster.sbatch(script, user=USER)
    try:
        cluster.wait_running(job)
        summary = Path(_spool(cluster)) / "live" / job / "summary" / "batch"
        _wait(lambda: summary.is_dir() and os.listdir(summary), 60, "the batch watcher's summary")
        names = sorted(os.listdir(summary))
    finally:
        cluster.run(["scancel", job], check=False)
    assert names == ["n1.json"], names
