"""The SPANK plugin as users meet it: variables in every task, user values win, opt-out works."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster

FR_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
           "NCCL_DEBUG", "NCCL_DEBUG_FILE", "SLURM_ATTR_DIR")


def _task_envs(out: str) -> dict[int, dict[str, str]]:
    """`srun -l env` output -> {task: {name: value}}."""
    envs: dict[int, dict[str, str]] = {}
    for line in out.splitlines():
        task, sep, rest = line.partition(": ")
        if not sep or not task.strip().isdigit() or "=" not in rest:
            continue
        k, _, v = rest.partition("=")
        envs.setdefault(int(task), {})[k] = v
    return envs


def test_every_task_gets_fr_and_nccl_env_in_the_job_dir(cluster):
    proc = cluster.run(["srun", "-N2", "-l", "--export=ALL", "env"], user="sattrtest")
    envs = _task_envs(proc.stdout)
    assert sorted(envs) == [0, 1]
    for env in envs.values():
        job_id = env["SLURM_JOB_ID"]
        jobdir = str(cluster.base / "evidence" / job_id)
        assert env["SLURM_ATTR_DIR"] == jobdir
        assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{jobdir}/fr/nccl_trace_rank_"
        assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{jobdir}/fr/nccl_trace_rank_"
        assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"].startswith(f"{jobdir}/fr/")
        assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
        assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
        assert env["NCCL_DEBUG"] == "WARN"
        assert env["NCCL_DEBUG_FILE"].startswith(f"{jobdir}/nccl/")
        assert not env["TORCH_FR_DUMP_TEMP_FILE"].startswith(env.get("HOME", "/nonexistent"))


def test_job_dir_is_the_users_and_private(cluster):
    proc = cluster.run(["srun", "-N1", "sh", "-c", 'stat -c "%U %a %F" "$SLURM_ATTR_DIR" "$SLURM_ATTR_DIR/fr"'],
                       user="sattrtest")
    lines = proc.stdout.strip().splitlines()
    assert lines == ["sattrtest 700 directory", "sattrtest 700 directory"], lines


def test_values_the_user_set_win(cluster):
    proc = cluster.run(["srun", "-N1", "-l", "env"], user="sattrtest",
                       env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "77", "NCCL_DEBUG": "INFO",
                            "TORCH_FR_DUMP_TEMP_FILE": "/tmp/mine_"})
    env = _task_envs(proc.stdout)[0]
    # The user chose the legacy buffer name: we set neither name, so theirs is in force.
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "77"
    assert "TORCH_FR_BUFFER_SIZE" not in env
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/tmp/mine_"
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env
    # NCCL_DEBUG set by the user: neither NCCL variable is ours.
    assert env["NCCL_DEBUG"] == "INFO"
    assert "NCCL_DEBUG_FILE" not in env
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


@pytest.mark.parametrize("how", ["flag", "env", "sbatch_line"])
def test_opt_out_removes_everything(cluster, how):
    if how == "flag":
        out = cluster.run(["srun", "-N2", "-l", "--attr=off", "env"], user="sattrtest").stdout
    elif how == "env":
        out = cluster.run(["srun", "-N2", "-l", "env"], user="sattrtest", env={"SLURM_ATTR": "off"}).stdout
    else:
        job = cluster.sbatch("#!/bin/bash\n#SBATCH --attr=off\n#SBATCH -N2\nsrun -l env\n", user="sattrtest")
        cluster.wait_state(job)
        out = (cluster.base / "work" / "sattrtest" / f"slurm-{job}.out").read_text()
    envs = _task_envs(out)
    assert len(envs) == 2
    for env in envs.values():
        present = [v for v in FR_VARS if v in env]
        assert present == [], f"{how}: opted out but got {present}"


def test_sbatch_job_gets_env_in_batch_script_and_steps(cluster):
    job = cluster.sbatch("#!/bin/bash\n#SBATCH -N2\necho batch=$TORCH_FR_DUMP_TEMP_FILE\nsrun -l printenv SLURM_ATTR_DIR\n",
                         user="sattrtest")
    cluster.wait_state(job)
    out = (cluster.base / "work" / "sattrtest" / f"slurm-{job}.out").read_text()
    jobdir = str(cluster.base / "evidence" / job)
    assert f"batch={jobdir}/fr/nccl_trace_rank_" in out
    assert f"0: {jobdir}" in out and f"1: {jobdir}" in out


def test_help_lists_the_option(cluster):
    for tool in ("srun", "sbatch", "salloc"):
        out = cluster.run([tool, "--help"]).stdout
        assert "--attr=on|off" in out, tool


def test_bad_option_value_is_refused(cluster):
    proc = cluster.run(["srun", "-N1", "--attr=maybe", "true"], check=False)
    assert proc.returncode != 0
    assert "attr" in proc.stderr
