/*
 * sattr-comment: write a finished job's Comment or AdminComment in accounting.
 *
 *   sattr-comment CLUSTER JOBID Comment|AdminComment < text
 *
 * Why not sacctmgr: `sacctmgr modify job ... set Comment=...` lowercases the
 * whole value on Slurm 22.05 (quoted or not), which would rewrite the user's
 * own comment and our SATTR1: marker. This calls the same accounting API
 * (slurmdb_job_modify) with the text as given. Exit codes: 0 written,
 * 2 usage, 3 slurmdbd unreachable, 4 no such job in accounting (yet), 5 error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/slurm.h>
#include <slurm/slurmdb.h>

/*
 * Slurm's list handle is `List` (typedef struct xlist *) in 22.05 and `list_t`
 * (typedef struct xlist) from 23.x on, where newer headers drop `List`. Both name
 * `struct xlist`, so spelling it out is right for every release without a version
 * test (whichever release first shipped list_t does not matter here).
 */
typedef struct xlist *sattr_list_t;

/*
 * Exported by libslurm but not declared in its public headers (all releases). The step
 * list is filled here rather than with slurm_addto_step_list(), which newer headers do
 * not declare and whose signature follows the list type.
 */
extern slurmdb_job_rec_t *slurmdb_create_job_rec(void);

/* Far above [comment] max_len; longer input is refused, never cut silently. */
#define SATTR_TEXT_MAX 16384

static int sattr_digits(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n > 10)
		return 0;
	for (i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	static char text[SATTR_TEXT_MAX + 1];
	char jobid[16];
	uint16_t flags = 0;
	void *db = NULL;
	slurmdb_job_cond_t cond;
	slurmdb_job_rec_t *job = NULL;
	sattr_list_t ret = NULL;
	/* The whole job (allocation), as `sacctmgr modify job where jobid=N` selects it. */
	static slurm_selected_step_t step;
	size_t n;
	int rc = 5;

	if (argc != 4 || !sattr_digits(argv[2]) ||
	    (strcmp(argv[3], "Comment") != 0 && strcmp(argv[3], "AdminComment") != 0)) {
		fprintf(stderr, "usage: sattr-comment CLUSTER JOBID Comment|AdminComment < text\n");
		return 2;
	}
	n = fread(text, 1, SATTR_TEXT_MAX, stdin);
	text[n] = '\0';
	if (n == SATTR_TEXT_MAX && fgetc(stdin) != EOF) {
		fprintf(stderr, "sattr-comment: text longer than %d bytes\n", SATTR_TEXT_MAX);
		return 2;
	}
	while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
		text[--n] = '\0';
	snprintf(jobid, sizeof(jobid), "%s", argv[2]);

	slurm_init(NULL);
	db = slurmdb_connection_get(&flags);
	if (!db) {
		fprintf(stderr, "sattr-comment: cannot connect to slurmdbd: %s\n", slurm_strerror(errno));
		return 3;
	}
	memset(&cond, 0, sizeof(cond));
	cond.cluster_list = slurm_list_create(NULL);
	slurm_list_append(cond.cluster_list, argv[1]);
	step.array_task_id = NO_VAL;
	step.het_job_offset = NO_VAL;
	step.step_id.job_id = (uint32_t)strtoul(jobid, NULL, 10);
	step.step_id.step_id = NO_VAL;
	step.step_id.step_het_comp = NO_VAL;
	/* No destructor: the element is static, not from Slurm's allocator. */
	cond.step_list = slurm_list_create(NULL);
	slurm_list_append(cond.step_list, &step);
	/* As sacctmgr sets them: no default time window, the job's flags not filtered. */
	cond.flags = JOBCOND_FLAG_NO_DEFAULT_USAGE;
	cond.db_flags = SLURMDB_JOB_FLAG_NOTSET;
	job = slurmdb_create_job_rec();
	if (strcmp(argv[3], "Comment") == 0)
		job->derived_es = text;
	else
		job->admin_comment = text;

	ret = slurmdb_job_modify(db, &cond, job);
	if (ret && slurm_list_count(ret) > 0) {
		rc = slurmdb_connection_commit(db, 1) == SLURM_SUCCESS ? 0 : 5;
		if (rc)
			fprintf(stderr, "sattr-comment: commit failed: %s\n", slurm_strerror(errno));
	} else if (ret) {
		fprintf(stderr, "sattr-comment: nothing modified: job %s not in accounting for cluster %s\n",
			jobid, argv[1]);
		rc = 4;
	} else {
		fprintf(stderr, "sattr-comment: modify failed: %s\n", slurm_strerror(errno));
		rc = errno == SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT ? 3 : 5;
	}
	/* The text is ours (static): detach it before the record would be freed. */
	job->derived_es = NULL;
	job->admin_comment = NULL;
	slurmdb_connection_close(&db);
	return rc;
}
