"""``on_hang = cancel`` on a job array cancels the hung task only (issue 21 item 4).

Slurm gives a job array's meta record id (the ArrayJobId) to whichever task it starts last
from that record: that task's own raw id, SLURM_JOB_ID, equals SLURM_ARRAY_JOB_ID, and
``scancel <that id>`` cancels every task of the array. The watchers the plugin starts know
only that raw id. Here that task hangs (the probe harness's nonentry: rank 3 never launches
AllReduce #300) while its siblings play a healthy run to the end; two sources agree on the
hang (the probe's detection and NCCL's RAS, played by the unit tests' stand-in, as in
test_live_plugin.py), so the leader cancels. Only the hung task may end CANCELLED.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from harness import SHM, run_cmd
from slurm_attr import config as config_mod
from slurm_attr.live import findings

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from unix_servers import RasServer  # noqa: E402  (the unit tests' RAS stand-in)
from test_live_plugin import _ras_report  # noqa: E402  (NVIDIA's straggler report, for the harness)

USER = "sattrtest"  # a user of its own: the cancel checks the job's uid
SIBLING_OPS = 8000  # about 25 s on the test cluster: still running when the cancel comes (~6 s)
TASKS = 4  # one per node: all start in one pass, the last from the meta record


def _array_job(cluster, tasks: int) -> str:
    """An array of one-node harness jobs (4 ranks each); the task holding the ArrayJobId as
    its own id hangs at operation 300, every other one runs SIBLING_OPS operations (long enough
    to be running still when the hung one is cancelled) and completes."""
    shm = SHM
    run = f"{run_cmd()} --shm {shm} --node-index 0 --ranks 4 --per-node 4 --inject 300"
    script = f"""#!/bin/bash
#SBATCH -N1 -p live -t 5 --array=1-{tasks}
echo "task $SLURM_ARRAY_TASK_ID: job $SLURM_JOB_ID of array $SLURM_ARRAY_JOB_ID"
if [ "$SLURM_JOB_ID" = "$SLURM_ARRAY_JOB_ID" ]; then
    scenario="nonentry --ops 400 --hang-ms 60000"
else
    scenario="healthy --ops {SIBLING_OPS}"
fi
rm -f {shm}
srun -N1 -n1 bash -c "exec {run} --scenario $scenario"
rc=$?
rm -f {shm}
exit $rc
"""
    return cluster.sbatch(script, user=USER)


def _tasks(cluster, array: str, n: int) -> dict[str, tuple[str, str, str]]:
    """task id -> (raw job id, state, end) from accounting, once every task has a final state."""
    deadline = time.monotonic() + 180
    rows: dict[str, tuple[str, str, str]] = {}
    while time.monotonic() < deadline:
        out = cluster.run(["sacct", "-n", "-P", "-X", "-j", array, "-o", "JobID,JobIDRaw,State,End"],
                          check=False).stdout
        rows = {}
        for ln in out.splitlines():
            jid, raw, state, end = (ln.split("|") + ["", "", "", ""])[:4]
            if "_" in jid and "[" not in jid:
                rows[jid.split("_", 1)[1]] = (raw, state.split(" ")[0], end)
        if len(rows) == n and all(s not in ("RUNNING", "PENDING", "REQUEUED", "") for _, s, _ in rows.values()):
            return rows
        time.sleep(0.5)
    raise AssertionError(f"array {array} not finished after 180s: {rows}")


def _settled(spool: str, job: str, timeout: float) -> dict | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = findings.load(spool, job) or {}
        f = next((f for f in doc.get("findings", []) if isinstance(f.get("cancel"), dict)), None)
        if f is not None:
            return f
        time.sleep(0.3)
    return None


def test_cancel_of_a_hung_array_task_spares_its_siblings(cluster):
    spool = config_mod.load(str(cluster.config_path)).paths.spool
    ras = RasServer([_ras_report(3, 300)])
    try:
        with cluster.settings(live={"on_hang": "cancel", "ras_addr": f"127.0.0.1:{ras.port}"}):
            array = _array_job(cluster, TASKS)
            try:
                # the hung task is the one whose raw id is the array's: its watchers run with --job <array>
                f = _settled(spool, array, timeout=150)
                tasks = _tasks(cluster, array, TASKS)
            finally:
                cluster.run(["scancel", array], check=False)
    finally:
        ras.close()
    hung = [t for t, (raw, _, _) in tasks.items() if raw == array]
    assert len(hung) == 1, tasks
    [hung_task] = hung
    assert f is not None, f"no settled cancel for job {array}: {findings.load(spool, array)}"
    assert (f["class"], f["ranks"]) == ("H1", [3]), f
    c = f["cancel"]
    assert c["done"] is True and c["sources"] == ["probe", "ras"], c
    assert c["target"] == f"{array}_{hung_task}", c
    states = {t: s for t, (_, s, _) in tasks.items()}
    assert states == {t: "CANCELLED" if t == hung_task else "COMPLETED" for t in states}, tasks
    # the siblings were still running when the cancel came (a scancel of the array would have
    # taken them): each ended after the hung task did
    ends = {t: e for t, (_, _, e) in tasks.items()}
    assert all(ends[t] > ends[hung_task] for t in ends if t != hung_task), tasks
    print(f"\narray {array}: task {hung_task} (raw id {array}) hung, cancelled as {c['target']} at "
          f"{ends[hung_task]}; the others COMPLETED at {sorted(e for t, e in ends.items() if t != hung_task)}")
