/*
 * Task environment for one step: build the plan (envplan.c) from what the
 * job's environment holds, then apply it with spank_setenv/spank_unsetenv.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plugin.h"

static int sattr_spank_lookup(void *ctx, const char *name, char *buf, size_t len)
{
	spank_err_t rc = spank_getenv((spank_t)ctx, name, buf, (int)len);

	if (rc == ESPANK_SUCCESS)
		return 1;
	if (rc == ESPANK_ENV_NOEXIST)
		return 0;
	sattr_error("spank_getenv %s: %s", name, spank_strerror(rc));
	return -1;
}

/* Checked as the job's user (user_init runs with the user's euid). */
static int sattr_probe_present(const struct sattr_config *cfg)
{
	struct stat st;

	return cfg->probe_lib[0] != '\0' && stat(cfg->probe_lib, &st) == 0 &&
	       S_ISREG(st.st_mode) && access(cfg->probe_lib, R_OK) == 0;
}

static void sattr_apply_op(spank_t sp, const struct sattr_env_op *op)
{
	spank_err_t rc;

	if (op->unset) {
		rc = spank_unsetenv(sp, op->name);
		if (rc != ESPANK_SUCCESS)
			sattr_error("spank_unsetenv %s: %s", op->name, spank_strerror(rc));
		return;
	}
	rc = spank_setenv(sp, op->name, op->value, op->overwrite);
	if (rc == ESPANK_ENV_EXISTS && !op->overwrite)
		return; /* the user's value, which we never override */
	if (rc != ESPANK_SUCCESS)
		sattr_error("spank_setenv %s: %s", op->name, spank_strerror(rc));
}

void sattr_env_apply(spank_t sp, const struct sattr_config *cfg, int enabled)
{
	struct sattr_env_plan *plan = NULL;
	struct sattr_env_request req;
	char job_id[SATTR_ID_MAX];
	char jobdir[PATH_MAX];
	size_t i;
	int rc;

	if (sattr_item_job_id(sp, job_id) != 0)
		goto out;
	if (sattr_jobdir_path(cfg, job_id, jobdir, sizeof(jobdir)) != 0) {
		sattr_error("job %s: job directory path too long", job_id);
		goto out;
	}
	/* Large (LD_LIBRARY_PATH-sized values): heap, not slurmstepd's stack. */
	plan = calloc(1, sizeof(*plan));
	if (plan == NULL) {
		sattr_error("job %s: out of memory", job_id);
		goto out;
	}
	req = (struct sattr_env_request){
		.cfg = cfg,
		.jobdir = jobdir,
		.probe_present = enabled && sattr_probe_present(cfg),
		.lookup = sattr_spank_lookup,
		.ctx = sp,
	};
	rc = enabled ? sattr_env_plan_on(&req, plan) : sattr_env_plan_off(&req, plan);
	for (i = 0; i < plan->n_notes; i++)
		sattr_info("job %s: %s", job_id, plan->notes[i]);
	if (rc != 0) {
		sattr_error("job %s: task environment not set", job_id);
		goto out;
	}
	for (i = 0; i < plan->n_ops; i++)
		sattr_apply_op(sp, &plan->ops[i]);
	sattr_debug("job %s: attribution %s, %zu task variable change(s)", job_id,
		    enabled ? "on" : "off", plan->n_ops);
out:
	free(plan);
}

/* task_init, each task: the per-rank worker-server socket and the start-up hook
 * (envplan.c sattr_env_plan_task; only with worker_hook= set). */
void sattr_env_apply_task(spank_t sp, const struct sattr_config *cfg)
{
	struct sattr_env_plan *plan = NULL;
	struct sattr_env_request req;
	char job_id[SATTR_ID_MAX];
	char jobdir[PATH_MAX];
	uint32_t rank;
	spank_err_t rc;
	size_t i;

	if (cfg->worker_hook[0] == '\0' || sattr_item_job_id(sp, job_id) != 0)
		return;
	rc = spank_get_item(sp, S_TASK_GLOBAL_ID, &rank);
	if (rc != ESPANK_SUCCESS) {
		sattr_error("spank_get_item S_TASK_GLOBAL_ID: %s", spank_strerror(rc));
		return;
	}
	if (sattr_jobdir_path(cfg, job_id, jobdir, sizeof(jobdir)) != 0)
		return;
	plan = calloc(1, sizeof(*plan));
	if (plan == NULL)
		return;
	req = (struct sattr_env_request){
		.cfg = cfg, .jobdir = jobdir, .lookup = sattr_spank_lookup, .ctx = sp,
	};
	if (sattr_env_plan_task(&req, rank, plan) == 0) {
		for (i = 0; i < plan->n_notes; i++)
			sattr_info("job %s: %s", job_id, plan->notes[i]);
		for (i = 0; i < plan->n_ops; i++)
			sattr_apply_op(sp, &plan->ops[i]);
	}
	free(plan);
}
