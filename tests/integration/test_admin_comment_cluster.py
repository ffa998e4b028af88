"""The verdict in AdminComment ([actions] admin_comment) on the real cluster: written after the
job's end beside the Comment, read back by `sattr`, beyond the job's user's reach (scontrol
and sacctmgr refuse them), and another tool's AdminComment data (jobstats' "JS1:") left whole."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.cluster


def _admin_comment(cluster, job: str, want: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    got = ""
    while time.monotonic() < deadline:
        got = cluster.sacct(job, "AdminComment%400").get("AdminComment", "")
        if want in got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"job {job}: AdminComment {got!r} never held {want!r}")


def test_verdict_in_admin_comment_users_cannot_change_it(cluster):
    with cluster.settings(actions=dict(admin_comment=True)):
        job = cluster.sbatch("#!/bin/bash\n#SBATCH -N1\necho 'ValueError: bad config' >&2\nexit 3\n",
                             user="sattrtest")
        v = cluster.verdict(job)
        admin = _admin_comment(cluster, job, "SATTR1:")
        assert admin.startswith(f"SATTR1: {v['cause']}"), admin
        assert "SATTR1:" in cluster.comment(job)  # the users' field keeps it too
        # The job's own user cannot change the admins' field, neither in accounting ...
        res = cluster.run(["sacctmgr", "-i", "modify", "job", "where", f"jobid={job}", "set", "AdminComment=mine"],
                          user="sattrtest", check=False)
        assert res.returncode != 0 or "nothing modified" in (res.stdout + res.stderr).lower(), res
        # ... nor through slurmctld (the job's record is still in its memory: MinJobAge).
        res = cluster.run(["scontrol", "update", f"JobId={job}", "AdminComment=mine"], user="sattrtest", check=False)
        assert res.returncode != 0, res
        assert _admin_comment(cluster, job, "SATTR1:") == admin
        # sattr reads it back from accounting for an admin.
        shown = cluster.sattr("show", job).stdout
        assert f"AdminComment (accounting): {admin}" in shown, shown


def test_another_tools_admin_comment_is_left_whole(cluster):
    blob = "JS1:H4sIAAAAAAAAA6tWKkktLlGyUlAqS8wpTtVRUMpLzE0F"
    with cluster.settings(actions=dict(admin_comment=True)):
        gate = cluster.gate()
        job = cluster.sbatch(f"#!/bin/bash\n#SBATCH -N1\n{gate.wait}\nexit 3\n", user="sattrtest")
        cluster.wait_running(job)
        # As a job-stats tool would (root, while the job runs).
        cluster.run(["scontrol", "update", f"JobId={job}", f"AdminComment={blob}"])
        gate.open()
        cluster.verdict(job)
        assert "SATTR1:" in cluster.comment(job)
        # The Comment is written in the same pass: by now the AdminComment entry is settled too.
        deadline = time.monotonic() + 30
        shown = ""
        while time.monotonic() < deadline and "another tool" not in shown:
            shown = cluster.sattr("show", job).stdout
            time.sleep(0.5)
        assert "AdminComment holds another tool's data" in shown, shown
        assert cluster.sacct(job, "AdminComment%400").get("AdminComment") == blob
