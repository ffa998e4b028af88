/*
 * Job identity from Slurm and the evidence directory, from the two root
 * contexts that run before the tasks: slurmd's job_prolog and slurmstepd's
 * task_init_privileged.
 */
#include <stdio.h>
#include <stdlib.h>

#include "plugin.h"

/* spank_get_item writes through uid_t* / gid_t* / uint32_t*. */
_Static_assert(sizeof(uid_t) == sizeof(uint32_t), "S_JOB_UID is a 32-bit uid_t");
_Static_assert(sizeof(gid_t) == sizeof(uint32_t), "S_JOB_GID is a 32-bit gid_t");

int sattr_item_job_id(spank_t sp, char out[SATTR_ID_MAX])
{
	char raw[SATTR_ID_MAX];
	uint32_t id = 0;
	spank_err_t rc;
	int n;

	rc = spank_get_item(sp, S_JOB_ID, &id);
	if (rc != ESPANK_SUCCESS) {
		sattr_error("spank_get_item S_JOB_ID: %s", spank_strerror(rc));
		return -1;
	}
	n = snprintf(raw, sizeof(raw), "%u", id);
	if (n < 0 || (size_t)n >= sizeof(raw) || sattr_parse_job_id(raw, out) != 0) {
		sattr_error("job id %u is not usable", id);
		return -1;
	}
	return 0;
}

static void sattr_evidence_create(const struct sattr_config *cfg, const char *job_id, uid_t uid,
				  gid_t gid)
{
	char err[PATH_MAX + SATTR_NOTE_MAX];

	if (sattr_jobdir_create(cfg->evidence_root, job_id, uid, gid, err, sizeof(err)) != 0)
		sattr_error("job %s: evidence directory: %s", job_id, err);
	else
		sattr_debug("job %s: evidence directory %s/%s ready", job_id, cfg->evidence_root,
			    job_id);
}

void sattr_evidence_from_items(spank_t sp, const struct sattr_config *cfg)
{
	char job_id[SATTR_ID_MAX];
	uid_t uid;
	gid_t gid;
	spank_err_t rc;

	if (sattr_item_job_id(sp, job_id) != 0)
		return;
	rc = spank_get_item(sp, S_JOB_UID, &uid);
	if (rc != ESPANK_SUCCESS) {
		sattr_error("spank_get_item S_JOB_UID: %s", spank_strerror(rc));
		return;
	}
	rc = spank_get_item(sp, S_JOB_GID, &gid);
	if (rc != ESPANK_SUCCESS) {
		sattr_error("spank_get_item S_JOB_GID: %s", spank_strerror(rc));
		return;
	}
	sattr_evidence_create(cfg, job_id, uid, gid);
}

/* In job_prolog the job is described by the hook environment (as for Prolog=). */
void sattr_evidence_from_env(const struct sattr_config *cfg)
{
	const char *id_s = getenv("SLURM_JOB_ID");
	const char *uid_s = getenv("SLURM_JOB_UID");
	const char *gid_s = getenv("SLURM_JOB_GID");
	char job_id[SATTR_ID_MAX];
	uint32_t uid, gid;

	if (sattr_parse_job_id(id_s, job_id) != 0) {
		sattr_error("job_prolog: SLURM_JOB_ID=%.32s is not a job number",
			    id_s ? id_s : "(unset)");
		return;
	}
	/* (uid_t)-1 would mean "leave the owner alone" to fchown. */
	if (sattr_parse_u32(uid_s, UINT32_MAX - 1, &uid) != 0 ||
	    sattr_parse_u32(gid_s, UINT32_MAX - 1, &gid) != 0) {
		sattr_error("job %s: job_prolog: bad SLURM_JOB_UID=%.16s / SLURM_JOB_GID=%.16s",
			    job_id, uid_s ? uid_s : "(unset)", gid_s ? gid_s : "(unset)");
		return;
	}
	sattr_evidence_create(cfg, job_id, (uid_t)uid, (gid_t)gid);
}

/* user_init: whether the job's evidence dir may be named in the task environment. */
int sattr_evidence_usable(spank_t sp, const struct sattr_config *cfg)
{
	char job_id[SATTR_ID_MAX];
	char err[PATH_MAX + SATTR_NOTE_MAX];
	uid_t uid;
	spank_err_t rc;

	if (sattr_item_job_id(sp, job_id) != 0)
		return 0;
	rc = spank_get_item(sp, S_JOB_UID, &uid);
	if (rc != ESPANK_SUCCESS) {
		sattr_error("spank_get_item S_JOB_UID: %s", spank_strerror(rc));
		return 0;
	}
	if (sattr_jobdir_usable(cfg->evidence_root, job_id, uid, err, sizeof(err)))
		return 1;
	sattr_error("job %s: evidence directory refused (%s); no evidence variables exported",
		    job_id, err);
	return 0;
}

/* slurm_spank_init (remote): "<evidence_root>/<job>.start" if no earlier step wrote it. */
void sattr_jobstart_record(spank_t sp, const struct sattr_config *cfg)
{
	char job_id[SATTR_ID_MAX], err[PATH_MAX + SATTR_NOTE_MAX];

	if (sattr_item_job_id(sp, job_id) != 0)
		return;
	err[0] = '\0';
	if (sattr_jobstart_write(cfg->evidence_root, job_id, err, sizeof(err)) < 0 || err[0] != '\0')
		sattr_error("job %s: start record: %s", job_id, err);
}
