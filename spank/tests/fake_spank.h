/* A stand-in for the spank_* and slurm_* symbols that srun/slurmstepd provide. */
#ifndef SATTR_FAKE_SPANK_H
#define SATTR_FAKE_SPANK_H

#include <stdint.h>
#include <sys/types.h>

#include <slurm/spank.h>

#define FAKE_MAX 64

struct fake_spank {
	spank_context_t ctx;
	uint32_t job_id;
	uid_t uid;
	gid_t gid;
	uint32_t task_id, global_task_id, step_id, node_id, nnodes; /* 0, 0, 0, 0, 1 */
	struct spank_option *opts[FAKE_MAX];
	int n_opts;
	char *env[FAKE_MAX][2]; /* the job's environment (remote context) */
	int n_env;
	char *ctl[FAKE_MAX][2]; /* job-control environment (local/allocator) */
	int n_ctl;
	char log[FAKE_MAX][512];
	int n_log;
};

extern struct fake_spank fake;

void fake_reset(spank_context_t ctx);
const char *fake_env_get(const char *name);
void fake_env_put(const char *name, const char *value);
const char *fake_ctl_get(const char *name);
int fake_logged(const char *fragment);

#endif
