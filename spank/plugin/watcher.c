/*
 * The live watcher (slurm_attr/live): one per node per step, started here.
 *
 * Why root, from slurmstepd's privileged task context: the watcher writes root-owned
 * summaries and findings to the shared spool (the job must not be able to forge a finding
 * about another rank or node), and reads every local rank's record whoever runs the job.
 * As the job's user it could do neither safely. Why here: task_init_privileged runs as
 * root in each task just forked by slurmstepd, with the step's facts at hand; local task 0
 * starts the node's watcher, so there is one per node and step whatever the task count.
 * The watcher lives in the step's cgroup (it is forked from the task), so Slurm's own
 * cleanup of the step ends it as well as its own check that slurmstepd is gone.
 *
 * Nothing here can fail or hold the task: every error is logged and the task goes on as
 * without a watcher (whose absence the findings' coverage then shows).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin.h"

/* Batch, extern and interactive steps (slurm.h's SLURM_*_STEP values) */
#define SATTR_BATCH_STEP 0xfffffffbu
#define SATTR_FIRST_SPECIAL_STEP 0xfffffff0u

void sattr_watcher_start(spank_t sp, const struct sattr_config *cfg)
{
	char job_id[SATTR_ID_MAX], step[SATTR_ID_MAX], jobdir[SATTR_PATH_MAX + 16];
	char err[SATTR_NOTE_MAX];
	uint32_t task = 1, stepid = 0, nodeid = 0, nnodes = 0;
	gid_t gid = 0;
	struct sattr_watch_req req;
	struct sattr_watch_cmd cmd;
	const char *conf;

	if (spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS || task != 0)
		return; /* local task 0 only: one watcher per node and step */
	if (sattr_item_job_id(sp, job_id) != 0 ||
	    spank_get_item(sp, S_JOB_STEPID, &stepid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_NODEID, &nodeid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
		sattr_error("live watcher: step facts unavailable; not started");
		return;
	}
	if (stepid == SATTR_BATCH_STEP) {
		/* The batch script runs on the job's first node alone (Slurm gives 0 nodes here). */
		snprintf(step, sizeof(step), "batch");
		nnodes = 1;
		nodeid = 0;
	}
	else if (stepid >= SATTR_FIRST_SPECIAL_STEP)
		return;
	else
		snprintf(step, sizeof(step), "%u", stepid);
	/* No node list from the task's environment: that is the user's (Slurm sets none for the
	 * batch step, so an exported SLURM_STEP_NODELIST reached the watcher). The watcher reads
	 * its node's name from slurmstepd's own socket (slurm_attr/live/stepd.py). */
	if (sattr_jobdir_path(cfg, job_id, jobdir, sizeof(jobdir)) != 0)
		return;
	/* slurmstepd's own environment (the site's), not the task's (the user's) */
	conf = getenv("SLURM_ATTR_CONFIG");
	memset(&req, 0, sizeof(req));
	req.exe = cfg->live_watcher;
	req.job_id = job_id;
	req.step = step;
	req.jobdir = jobdir;
	req.config = conf != NULL && sattr_path_is_clean_abs(conf) ? conf : NULL;
	req.nodeid = nodeid;
	req.nnodes = nnodes;
	req.gid = (unsigned int)gid;
	req.stepd_pid = getppid();
	if (sattr_watch_cmd_build(&req, &cmd) != 0) {
		sattr_error("job %s: live watcher: unusable step facts; not started", job_id);
		return;
	}
	if (sattr_watch_spawn(&cmd, err, sizeof(err)) != 0)
		sattr_error("job %s: live watcher not started: %s", job_id, err);
	else
		sattr_verbose("job %s step %s: live watcher started", job_id, step);
}
