/*
 * sattr-comment: write a finished job's Comment or AdminComment in accounting.
 *
 *   sattr-comment CLUSTER JOBID|ARRAYJOBID_TASKID Comment|AdminComment < text
 *   sattr-comment --batch CLUSTER < records
 *
 * --batch: many jobs over one slurmdbd connection (a worker's batch of verdicts, a
 * re-application after a slurmctld restart). Records are JOBID NUL FIELD NUL TEXT NUL;
 * each gets one line on stdout, "JOBID RC message", RC as below, committed one by one so
 * one job's failure leaves the others written. Slurmdbd lost mid-way: the line says 3 and
 * the rest are not tried (no line: the caller keeps them queued).
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

static int sattr_digits_n(const char *s, size_t n)
{
	size_t i;

	if (n == 0 || n > 10)
		return 0;
	for (i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return 0;
	return 1;
}

/*
 * JOBID or ARRAYJOBID_TASKID. An array task must be named by both: accounting selects by
 * job id "id_job=N or id_array_job=N", so the task whose own id is the array's (the array's
 * last record) named by its number alone would select every task of the array.
 */
static int sattr_job_id(const char *s)
{
	const char *u = strchr(s, '_');

	if (!u)
		return sattr_digits_n(s, strlen(s));
	return sattr_digits_n(s, (size_t)(u - s)) && sattr_digits_n(u + 1, strlen(u + 1));
}

#define SATTR_BATCH_MAX 10000 /* records per run: a bound on what one run may do */

static void sattr_step_cond(slurmdb_job_cond_t *cond, slurm_selected_step_t *step, const char *cluster,
			    const char *jobid)
{
	memset(cond, 0, sizeof(*cond));
	cond->cluster_list = slurm_list_create(NULL);
	slurm_list_append(cond->cluster_list, (void *)cluster);
	memset(step, 0, sizeof(*step));
	step->array_task_id = strchr(jobid, '_') ? (uint32_t)strtoul(strchr(jobid, '_') + 1, NULL, 10) : NO_VAL;
	step->het_job_offset = NO_VAL;
	step->step_id.job_id = (uint32_t)strtoul(jobid, NULL, 10);
	step->step_id.step_id = NO_VAL;
	step->step_id.step_het_comp = NO_VAL;
	/* No destructor: the element is the caller's, not from Slurm's allocator. */
	cond->step_list = slurm_list_create(NULL);
	slurm_list_append(cond->step_list, step);
	/* As sacctmgr sets them: no default time window, the job's flags not filtered. */
	cond->flags = JOBCOND_FLAG_NO_DEFAULT_USAGE;
	cond->db_flags = SLURMDB_JOB_FLAG_NOTSET;
}

/* One job's field; the exit codes above, the reason in msg. */
static int sattr_modify(void *db, const char *cluster, const char *jobid, const char *field, char *text,
			char *msg, size_t msglen)
{
	slurmdb_job_cond_t cond;
	/* The whole job (allocation), as `sacctmgr modify job where jobid=N` selects it. */
	slurm_selected_step_t step;
	slurmdb_job_rec_t *job;
	sattr_list_t ret;
	int rc = 5;

	msg[0] = '\0';
	sattr_step_cond(&cond, &step, cluster, jobid);
	job = slurmdb_create_job_rec();
	if (strcmp(field, "Comment") == 0)
		job->derived_es = text;
	else
		job->admin_comment = text;
	ret = slurmdb_job_modify(db, &cond, job);
	if (ret && slurm_list_count(ret) > 0) {
		rc = slurmdb_connection_commit(db, 1) == SLURM_SUCCESS ? 0 : 5;
		if (rc)
			snprintf(msg, msglen, "commit failed: %s", slurm_strerror(errno));
	} else if (ret) {
		snprintf(msg, msglen, "nothing modified: job %s not in accounting for cluster %s", jobid, cluster);
		rc = 4;
	} else {
		snprintf(msg, msglen, "modify failed: %s", slurm_strerror(errno));
		rc = errno == SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT ? 3 : 5;
	}
	/* The text is the caller's: detach it before the record would be freed. */
	job->derived_es = NULL;
	job->admin_comment = NULL;
	if (ret)
		slurm_list_destroy(ret);
	slurm_list_destroy(cond.step_list);
	slurm_list_destroy(cond.cluster_list);
	return rc;
}

static int sattr_field_ok(const char *f)
{
	return strcmp(f, "Comment") == 0 || strcmp(f, "AdminComment") == 0;
}

static void *sattr_connect(void)
{
	uint16_t flags = 0;
	void *db;

	slurm_init(NULL);
	db = slurmdb_connection_get(&flags);
	if (!db)
		fprintf(stderr, "sattr-comment: cannot connect to slurmdbd: %s\n", slurm_strerror(errno));
	return db;
}

/* Reads one NUL-terminated item of at most cap bytes; 1 read, 0 clean end, -1 too long or cut. */
static int sattr_item(char *buf, size_t cap)
{
	size_t n = 0;
	int c;

	while ((c = getchar()) != EOF) {
		if (c == '\0') {
			buf[n] = '\0';
			return 1;
		}
		if (n == cap)
			return -1;
		buf[n++] = (char)c;
	}
	return n == 0 ? 0 : -1;
}

static int sattr_batch(const char *cluster)
{
	static char jobid[32], field[32], text[SATTR_TEXT_MAX + 1];
	char msg[256];
	void *db = NULL;
	int n = 0, got, rc;

	while (n < SATTR_BATCH_MAX && (got = sattr_item(jobid, sizeof(jobid) - 1)) == 1) {
		if (sattr_item(field, sizeof(field) - 1) != 1 || sattr_item(text, SATTR_TEXT_MAX) != 1) {
			fprintf(stderr, "sattr-comment: record %d cut or too long\n", n + 1);
			break;
		}
		n++;
		if (!sattr_job_id(jobid) || !sattr_field_ok(field)) {
			printf("%s 2 bad record\n", sattr_job_id(jobid) ? jobid : "-");
			continue;
		}
		if (!db && !(db = sattr_connect()))
			return 3;
		rc = sattr_modify(db, cluster, jobid, field, text, msg, sizeof(msg));
		printf("%s %d %s\n", jobid, rc, msg);
		fflush(stdout);
		if (rc == 3)
			break; /* slurmdbd gone: every further modify would wait out the same timeout */
	}
	if (db)
		slurmdb_connection_close(&db);
	return 0;
}

int main(int argc, char **argv)
{
	static char text[SATTR_TEXT_MAX + 1];
	char msg[256];
	void *db;
	size_t n;
	int rc;

	if (argc == 3 && strcmp(argv[1], "--batch") == 0)
		return sattr_batch(argv[2]);
	if (argc != 4 || !sattr_job_id(argv[2]) || !sattr_field_ok(argv[3])) {
		fprintf(stderr, "usage: sattr-comment CLUSTER JOBID Comment|AdminComment < text\n"
				"       sattr-comment --batch CLUSTER < JOBID\\0FIELD\\0TEXT\\0...\n");
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
	if (!(db = sattr_connect()))
		return 3;
	rc = sattr_modify(db, argv[1], argv[2], argv[3], text, msg, sizeof(msg));
	if (rc)
		fprintf(stderr, "sattr-comment: %s\n", msg);
	slurmdb_connection_close(&db);
	return rc;
}
