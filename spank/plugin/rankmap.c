/*
 * Which global rank ran on which node, recorded by root.
 *
 * Flight Recorder dumps and stdout name ranks; the verdict names nodes. After
 * the job, Slurm no longer knows a step's task layout, and anything in the
 * job's own directory is the user's word. So slurmstepd (root, in
 * task_init_privileged) appends one line per task to
 * <evidence_root>/<job>.ranks.<step>.<nodeid>, a root-owned file beside the
 * job's directory: "<step> <global rank> <nodeid> <step node list>". The node
 * name itself is not in the step's environment at that point, so the epilog
 * finds it as the nodeid-th host of the step's node list, reads the file as
 * trusted evidence and removes it.
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

/* A hostlist expression: names, digits, ranges; nothing that could split a line. */
static int sattr_nodelist_ok(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n >= 1024)
		return 0;
	for (i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.' || c == '[' || c == ']' || c == ','))
			return 0;
	}
	return 1;
}

void sattr_rankmap_record(spank_t sp, const struct sattr_config *cfg)
{
	char job_id[SATTR_ID_MAX], nodes[1024], name[256], line[1200];
	uint32_t step = 0, rank = 0, nodeid = 0;
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
	rc = spank_get_item(sp, S_JOB_NODEID, &nodeid);
	if (rc != ESPANK_SUCCESS) {
		sattr_error("spank_get_item S_JOB_NODEID: %s", spank_strerror(rc));
		goto out;
	}
	rc = spank_getenv(sp, "SLURM_STEP_NODELIST", nodes, sizeof(nodes));
	if (rc != ESPANK_SUCCESS)
		rc = spank_getenv(sp, "SLURM_NODELIST", nodes, sizeof(nodes));
	if (rc != ESPANK_SUCCESS || !sattr_nodelist_ok(nodes)) {
		sattr_verbose("job %s: no usable step node list for the rank map", job_id);
		goto out;
	}
	n = snprintf(name, sizeof(name), "%s.ranks.%u.%u", job_id, step, nodeid);
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
	n = snprintf(line, sizeof(line), "%u %u %u %s\n", step, rank, nodeid, nodes);
	/* O_APPEND makes each short line atomic among the node's tasks. */
	if (n > 0 && (size_t)n < sizeof(line) && write(fd, line, (size_t)n) != n)
		sattr_error("job %s: rank map write: %s", job_id, strerror(errno));
out:
	if (fd >= 0)
		close(fd);
	if (dfd >= 0)
		close(dfd);
}
