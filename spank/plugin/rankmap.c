/*
 * Which global rank ran on which node, recorded by root.
 *
 * Flight Recorder dumps and stdout name ranks; the verdict names nodes. After
 * the job, Slurm no longer knows a step's task layout, and anything in the
 * job's own directory is the user's word. So slurmstepd (root, in
 * task_init_privileged) appends "<step> <global rank>" per task to
 * <evidence_root>/<job>.ranks.<node>, a root-owned file beside the job's
 * directory; the node epilog reads it as trusted evidence and removes it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plugin.h"

/* Batch, extern and interactive steps carry no training ranks. */
#define SATTR_FIRST_SPECIAL_STEP 0xfffffff0u

static int sattr_node_name_ok(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n > 64)
		return 0;
	for (i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.'))
			return 0;
	}
	return s[0] != '.';
}

void sattr_rankmap_record(spank_t sp, const struct sattr_config *cfg)
{
	char job_id[SATTR_ID_MAX], node[128], name[256], line[64];
	uint32_t step = 0, rank = 0;
	struct stat st;
	spank_err_t rc;
	int dfd = -1, fd = -1, n;

	if (sattr_item_job_id(sp, job_id) != 0)
		goto out;
	rc = spank_get_item(sp, S_JOB_STEPID, &step);
	if (rc != ESPANK_SUCCESS) {
		sattr_error("spank_get_item S_JOB_STEPID: %s", spank_strerror(rc));
		goto out;
	}
	if (step >= SATTR_FIRST_SPECIAL_STEP)
		goto out;
	rc = spank_get_item(sp, S_TASK_GLOBAL_ID, &rank);
	if (rc != ESPANK_SUCCESS) {
		sattr_error("spank_get_item S_TASK_GLOBAL_ID: %s", spank_strerror(rc));
		goto out;
	}
	rc = spank_getenv(sp, "SLURMD_NODENAME", node, sizeof(node));
	if (rc != ESPANK_SUCCESS || !sattr_node_name_ok(node)) {
		sattr_error("job %s: no usable SLURMD_NODENAME for the rank map", job_id);
		goto out;
	}
	n = snprintf(name, sizeof(name), "%s.ranks.%s", job_id, node);
	if (n < 0 || (size_t)n >= sizeof(name))
		goto out;
	dfd = open(cfg->evidence_root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0 || fstat(dfd, &st) != 0 || st.st_uid != 0) {
		sattr_error("job %s: rank map: evidence root %s unusable", job_id, cfg->evidence_root);
		goto out;
	}
	fd = openat(dfd, name, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0) {
		sattr_error("job %s: rank map %s: %s", job_id, name, fd < 0 ? strerror(errno) : "not ours");
		goto out;
	}
	n = snprintf(line, sizeof(line), "%u %u\n", step, rank);
	/* O_APPEND makes each short line atomic among the node's tasks. */
	if (n > 0 && (size_t)n < sizeof(line) && write(fd, line, (size_t)n) != n)
		sattr_error("job %s: rank map write: %s", job_id, strerror(errno));
out:
	if (fd >= 0)
		close(fd);
	if (dfd >= 0)
		close(dfd);
}
