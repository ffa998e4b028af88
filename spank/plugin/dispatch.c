/*
 * SPANK entry points: route each callback by context, never fail a job.
 *
 *   srun/sbatch/salloc (local, allocator): register --attr, publish the
 *       opt-out decision as the job-control variable SATTR_ENABLED.
 *   slurmd job_prolog (job script, root): create the evidence directory.
 *   slurmstepd (remote): init records the job's first step on the node (<job>.start);
 *       user_init sets the task environment once per step;
 *       task_init_privileged creates the evidence directory if the prolog
 *       did not (slurmd started before the plugin was configured).
 */
#include <stdlib.h>

#include "plugin.h"

SPANK_PLUGIN(slurm_attr, 1);

static struct sattr_config sattr_cfg;
static int sattr_cfg_loaded;

/* Parse plugstack.conf arguments once per process; bad ones are skipped. */
static const struct sattr_config *sattr_config(int ac, char **av)
{
	spank_context_t ctx;
	char err[SATTR_NOTE_MAX];
	int i;

	if (sattr_cfg_loaded)
		return &sattr_cfg;
	sattr_config_init(&sattr_cfg);
	ctx = spank_context();
	for (i = 0; i < ac; i++) {
		if (av[i] == NULL || sattr_config_parse_arg(&sattr_cfg, av[i], err, sizeof(err)) == 0)
			continue;
		/* A user at srun cannot fix plugstack.conf; the daemons' logs get it. */
		if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR)
			sattr_verbose("plugstack.conf: %s; ignored", err);
		else
			sattr_error("plugstack.conf: %s; ignored", err);
	}
	sattr_cfg_loaded = 1;
	return &sattr_cfg;
}

static int sattr_is_client(spank_context_t ctx)
{
	return ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	const struct sattr_config *cfg = sattr_config(ac, av);

	/* Registered here (not via spank_options[]) so sbatch and salloc see it. */
	if (sattr_is_client(ctx) || ctx == S_CTX_REMOTE)
		sattr_option_register(sp);
	/* Every step (batch, extern, srun), before anything of the job runs here: the first one
	 * records the job's start on this node for the node epilog (kept even when opted out). */
	if (ctx == S_CTX_REMOTE)
		sattr_jobstart_record(sp, cfg);
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	/* Before the allocation request, so the job's hooks get SPANK_SATTR_ENABLED. */
	if (sattr_is_client(spank_context()))
		sattr_optout_publish(sp, sattr_config(ac, av));
	return 0;
}

int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
	const struct sattr_config *cfg;

	(void)sp;
	if (spank_context() != S_CTX_JOB_SCRIPT)
		return 0;
	cfg = sattr_config(ac, av);
	if (sattr_enabled_job_script(cfg))
		sattr_evidence_from_env(cfg);
	return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	const struct sattr_config *cfg;
	int enabled;

	if (spank_context() != S_CTX_REMOTE)
		return 0;
	cfg = sattr_config(ac, av);
	enabled = sattr_enabled_remote(sp, cfg);
	/* A refused evidence dir: no evidence variables (the "off" plan also removes ours). */
	if (enabled && !sattr_evidence_usable(sp, cfg))
		enabled = 0;
	sattr_env_apply(sp, cfg, enabled);
	return 0;
}

/* Each task, as the user, before exec: the per-rank worker-server socket (worker_hook=). */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	const struct sattr_config *cfg;

	if (spank_context() != S_CTX_REMOTE)
		return 0;
	cfg = sattr_config(ac, av);
	if (cfg->worker_hook[0] != '\0' && sattr_live_remote(sp, cfg))
		sattr_env_apply_task(sp, cfg);
	return 0;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	static int attempted;
	const struct sattr_config *cfg;

	if (spank_context() != S_CTX_REMOTE)
		return 0;
	cfg = sattr_config(ac, av);
	/* Every task: the rank map is the scheduler's fact, kept even when opted out. */
	sattr_rankmap_record(sp, cfg);
	/* Local task 0 of each step starts the node's live watcher (live_watcher= set, and the
	 * job's partition in live_partitions= when that is set). */
	if (cfg->live_watcher[0] != '\0' && sattr_live_remote(sp, cfg))
		sattr_watcher_start(sp, cfg);
	/* The directory once per slurmstepd, not once per task: the result cannot change. */
	if (attempted)
		return 0;
	attempted = 1;
	if (sattr_enabled_remote(sp, cfg))
		sattr_evidence_from_items(sp, cfg);
	return 0;
}
