"""Benchmark: the verdict store's retention (`sattr prune`, slurm_attr/storeretention.py).

Not a test: it reports. On a copy of the fleet bench's synthetic store (bench/fleetdata.py:
100,000 verdicts over 500 nodes and 30 days, cached in /var/tmp), the clock is put 16 days past
its newest verdict and ``keep_days = 31``: about half the jobs are older than the cut.

  prune         storeretention.prune: batches of 2,000 jobs, one transaction each
  longest lock  the longest single write transaction of that run: what an analysis worker
                storing a verdict meanwhile can wait at most
  floor         the same deletes as one statement per table in one transaction (the least the
                deletes cost; the store is locked for all of it)

Ratio: prune / floor (the cost of batching), and longest lock / floor (what batching saves the
workers).

    python bench/bench_prune.py [--verdicts 100000] [--nodes 500] [--days 30]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from slurm_attr import storeretention
from slurm_attr.store import Store

import fleetdata  # beside this file (a script's directory is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
KEEP = 31.0


def _copy(src: str, into: str, name: str) -> str:
    """A copy in a directory of its own (a store's -wal and -shm files live beside it)."""
    os.makedirs(os.path.join(into, name))
    dst = os.path.join(into, name, "sattr.db")
    shutil.copyfile(src, dst)
    return dst


def _floor(path: str, cutoff: float) -> float:
    st = Store(path)
    sel = ("select j.job_id from jobs j left join verdicts v on v.job_id = j.job_id "
           "where coalesce(v.analyzed_at, j.updated_at, 0) < ?")
    t0 = time.perf_counter()
    with st.transaction():
        st.db.execute(f"create temp table old as {sel}", [cutoff])
        for t in storeretention.JOB_TABLES:
            if t in st.db.table_names():
                st.db.execute(f"delete from [{t}] where job_id in (select job_id from old)")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fleetdata.store_args(ap)
    a = ap.parse_args()
    built = subprocess.run([sys.executable, os.path.join(HERE, "fleetdata.py"), "--verdicts", str(a.verdicts), "--nodes",
                            str(a.nodes), "--days", str(a.days), "--seed", str(a.seed), "--quiet"],
                           stdout=subprocess.PIPE, text=True, check=True)
    src = built.stdout.strip()
    newest = Store(src).db.execute("select max(analyzed_at) from verdicts").fetchone()[0]
    now = newest + 16 * 86400.0
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        path = _copy(src, tmp, "batched")
        st = Store(path)
        total = st.db.execute("select count(*) from jobs").fetchone()[0]
        longest = [0.0]
        enter = st.transaction

        def timed_transaction():  # wraps each write transaction to find the longest
            cm = enter()

            class _T:
                def __enter__(self):
                    self.t0 = time.perf_counter()
                    return cm.__enter__()

                def __exit__(self, *exc):
                    out = cm.__exit__(*exc)
                    longest[0] = max(longest[0], time.perf_counter() - self.t0)
                    return out
            return _T()

        st.transaction = timed_transaction  # type: ignore[method-assign]
        t0 = time.perf_counter()
        res = storeretention.prune(st, KEEP, now=now)
        took = time.perf_counter() - t0
        floor = _floor(_copy(src, tmp, "floor"), res.cutoff)
    print(f"store: {total} jobs, {os.path.getsize(src) / 2**20:.0f} MiB; keep_days {KEEP:g}: {res.jobs} jobs older than the cut")
    print(f"{'':14}{'seconds':>10}{'ratio to floor':>16}")
    print(f"{'prune':14}{took:10.2f}{took / floor:16.2f}")
    print(f"{'longest lock':14}{longest[0]:10.2f}{longest[0] / floor:16.2f}")
    print(f"{'floor':14}{floor:10.2f}{1.0:16.2f}")


if __name__ == "__main__":
    main()
