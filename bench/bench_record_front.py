"""Benchmark: EpilogSlurmctld's own wall time, without a cluster (issue 23, "the hook").

Runs the hook the way slurmctld does (a fresh process with a job's environment) many times and
prints p50/p90/p99/max, for each command given, interleaved run by run so that the machine's
load falls on every command alike:

- ``epilog/epilog_slurmctld.sh`` (the shell wrapper, then the native front), and
- ``spank/build/sattr-record`` alone (the front: config, record written + renamed, a worker
  started when a slot is free; the worker is /bin/true here),

each with ``[intake] hook_fsync`` off (the default: the catch-up from accounting covers a crash)
and on (the record and the queue directory fsynced, for sites without accounting),

optionally beside ``--baseline-script``/``--baseline-front`` (e.g. the previous versions, built
from git) and under ``--load``: two CPU spinners and a writer that appends and fsyncs 4 KiB in a
loop on the queue's filesystem (slurmctld, slurmdbd and the database on a busy controller).
The full burst on the test cluster is `make bench-cluster`; this isolates the hook's own cost.

    python bench/bench_record_front.py --runs 400 --load
    python bench/bench_record_front.py --fsync off --load      # only the default
    python bench/bench_record_front.py --baseline-script /tmp/old.sh --baseline-front /tmp/old-front --load

Not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

ENV = {"SLURM_JOB_USER": "u", "SLURM_JOB_NAME": "job", "SLURM_JOB_PARTITION": "p", "SLURM_JOB_NODELIST": "n[1-4]",
       "SLURM_JOB_EXIT_CODE2": "1:0", "SLURM_JOB_UID": "1001", "SLURM_JOB_WORK_DIR": "/home/u",
       "SLURM_JOB_STDOUT": "/home/u/slurm-%j.out", "SPANK_SATTR_ENABLED": "1"}


def spin() -> None:
    while True:
        pass


def fsync_writer(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    block = b"x" * 4096
    while True:
        os.write(fd, block)
        os.fsync(fd)


def start_load(tmp: str) -> list[int]:
    pids = []
    for target, args in ((spin, ()), (spin, ()), (fsync_writer, (os.path.join(tmp, "db.load"),))):
        pid = os.fork()
        if pid == 0:
            try:
                target(*args)
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


def run_once(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    pid = os.posix_spawn(cmd[0], cmd, env)
    os.waitpid(pid, 0)
    return time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--load", action="store_true", help="two CPU spinners and an fsync loop beside the hooks")
    ap.add_argument("--front", default=os.path.join(REPO, "spank", "build", "sattr-record"))
    ap.add_argument("--script", default=os.path.join(REPO, "epilog", "epilog_slurmctld.sh"))
    ap.add_argument("--baseline-front", help="another front to time beside (e.g. built from the previous commit)")
    ap.add_argument("--baseline-script", help="another wrapper script to time beside it, run with --baseline-front")
    ap.add_argument("--dir", default="/var/tmp", help="where the queue goes (the filesystem matters: fsync)")
    ap.add_argument("--fsync", choices=("both", "off", "on"), default="both",
                    help="[intake] hook_fsync of the cases timed (both: each case twice, interleaved)")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="sattr-front-", dir=a.dir)
    confs = {}
    for mode in ("off", "on"):
        confs[mode] = os.path.join(tmp, f"c-{mode}.toml")
        with open(confs[mode], "w") as f:
            f.write(f'[intake]\nqueue_dir = "{tmp}/q"\nhook_fsync = {"true" if mode == "on" else "false"}\n\n'
                    f'[analysis]\nworkers = 2\n')
    modes = ("off", "on") if a.fsync == "both" else (a.fsync,)
    cases = []  # (name, command, front, config)
    for mode in modes:
        tag = "" if len(modes) == 1 and mode == "off" else f", fsync {mode}"
        cases += [(f"script{tag}", [a.script], a.front, confs[mode]), (f"front{tag}", [a.front], a.front, confs[mode])]
    if a.baseline_front:
        cases += [("baseline front", [a.baseline_front], a.baseline_front, confs["on"])]
        if a.baseline_script:
            cases += [("baseline script", [a.baseline_script], a.baseline_front, confs["on"])]
    times: dict[str, list[float]] = {name: [] for name, _cmd, _front, _conf in cases}
    pids = start_load(tmp) if a.load else []
    try:
        time.sleep(0.5 if pids else 0)
        for k in range(a.runs):
            for name, cmd, front, conf in cases:
                env = {**ENV, "SLURM_JOB_ID": str(100000 + k), "SLURM_ATTR_CONFIG": conf, "SLURM_ATTR_PYTHON": "/bin/true",
                       "SLURM_ATTR_RECORD": front, "SLURM_JOB_ARRAY_TASK_ID": name.replace(" ", "_")}
                times[name].append(run_once(cmd, env))
                # each case writes its own record: the next run of the same job id must not find it
                for n in os.listdir(os.path.join(tmp, "q")):
                    if n.endswith(".env"):
                        os.unlink(os.path.join(tmp, "q", n))
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"EpilogSlurmctld hook, {a.runs} runs each, interleaved{', under load' if a.load else ''} ({os.cpu_count()} cores):")
    for name, cmd, _front, _conf in cases:
        ts = sorted(times[name])
        q = lambda p: ts[int(p * (len(ts) - 1))] * 1e3  # noqa: E731
        print(f"  {name:18} p50 {statistics.median(ts) * 1e3:6.2f} ms  p90 {q(.9):6.2f}  p99 {q(.99):6.2f}  max {ts[-1] * 1e3:6.2f}"
              f"   ({' '.join(cmd)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
