/*
 * The user's opt-out: --attr=on|off beats SLURM_ATTR in the environment,
 * which beats what the submitting command published, which beats the site.
 */
#include <stdlib.h>

#include "plugin.h"

static int sattr_opt_attr = -1; /* -1: --attr not given */

static int sattr_opt_cb(int val, const char *optarg, int remote)
{
	int v = sattr_parse_bool(optarg);

	(void)val;
	if (v >= 0) {
		sattr_opt_attr = v;
		return 0;
	}
	/* Reject at srun/sbatch; in slurmstepd a bad value must not fail the step. */
	sattr_error("invalid --attr=%s: expected on or off", optarg ? optarg : "");
	return remote ? 0 : -1;
}

static struct spank_option sattr_opt = {
	.name = "attr",
	.arginfo = "on|off",
	.usage = "Failure attribution for this job (slurm_attr): on (default) or off. "
		 "Also SLURM_ATTR=off in the environment.",
	.has_arg = 1,
	.val = 0,
	.cb = sattr_opt_cb,
};

void sattr_option_register(spank_t sp)
{
	spank_err_t rc = spank_option_register(sp, &sattr_opt);

	if (rc != ESPANK_SUCCESS)
		sattr_error("cannot register --attr: %s", spank_strerror(rc));
}

void sattr_optout_publish(spank_t sp, const struct sattr_config *cfg)
{
	char note[SATTR_NOTE_MAX];
	spank_err_t rc;
	int on;

	on = sattr_decide_enabled(sattr_opt_attr, getenv(SATTR_USER_ENV), getenv(SATTR_CTL_IN_JOB),
				  cfg->enabled, note, sizeof(note));
	if (note[0] != '\0')
		sattr_info("%s", note);
	rc = spank_job_control_setenv(sp, SATTR_CTL_NAME, on ? "1" : "0", 1);
	if (rc != ESPANK_SUCCESS)
		sattr_error("spank_job_control_setenv %s: %s", SATTR_CTL_NAME, spank_strerror(rc));
}

/* spank_getenv into buf; NULL when unset or unreadable. */
static const char *sattr_job_getenv(spank_t sp, const char *name, char *buf, int len)
{
	spank_err_t rc = spank_getenv(sp, name, buf, len);

	if (rc == ESPANK_SUCCESS)
		return buf;
	if (rc != ESPANK_ENV_NOEXIST)
		sattr_error("spank_getenv %s: %s", name, spank_strerror(rc));
	return NULL;
}

int sattr_enabled_remote(spank_t sp, const struct sattr_config *cfg)
{
	static int cached = -1;
	char attr[64], published[64], note[SATTR_NOTE_MAX];

	if (cached >= 0)
		return cached;
	cached = sattr_decide_enabled(
		sattr_opt_attr, sattr_job_getenv(sp, SATTR_USER_ENV, attr, sizeof(attr)),
		sattr_job_getenv(sp, SATTR_CTL_IN_JOB, published, sizeof(published)), cfg->enabled,
		note, sizeof(note));
	if (note[0] != '\0')
		sattr_info("%s", note);
	return cached;
}

int sattr_live_remote(spank_t sp, const struct sattr_config *cfg)
{
	static int cached = -1;
	char part[SATTR_PARTS_MAX];
	const char *job_part;

	if (cached >= 0)
		return cached;
	if (!sattr_enabled_remote(sp, cfg))
		return cached = 0;
	if (cfg->live_partitions[0] == '\0')
		return cached = 1;
	/* slurmstepd sets it from the launch request. A user who changes it in their own step's
	 * environment only turns their own job's live watch on or off (--attr=off already can). */
	job_part = sattr_job_getenv(sp, "SLURM_JOB_PARTITION", part, sizeof(part));
	cached = sattr_partition_listed(cfg->live_partitions, job_part);
	if (!cached)
		sattr_debug("partition %s is not in live_partitions=%s: no live watch",
			    job_part != NULL ? job_part : "(unknown)", cfg->live_partitions);
	return cached;
}

int sattr_enabled_job_script(const struct sattr_config *cfg)
{
	char note[SATTR_NOTE_MAX];

	/* spank_getenv is not available here; the hook environment is ours. */
	return sattr_decide_enabled(-1, NULL, getenv(SATTR_CTL_IN_HOOKS), cfg->enabled, note,
				    sizeof(note));
}
