/*
 * The per-job evidence directory, created as root before the tasks start.
 *
 * Every step works on directory file descriptors opened with O_NOFOLLOW, so a
 * symlink planted anywhere under the evidence root is refused, never followed,
 * and ownership changes go through fchown on the descriptor we checked.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sattr.h"

#define SATTR_DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

/* Open the evidence root, creating it root-owned 0755 if missing. */
static int sattr_open_root(const char *root, char *err, size_t errlen)
{
	struct stat st;
	int fd, e, created = 0;

	fd = open(root, SATTR_DIR_FLAGS);
	if (fd < 0 && errno == ENOENT) {
		if (mkdir(root, 0755) != 0 && errno != EEXIST) {
			snprintf(err, errlen, "mkdir %s: %s", root, strerror(errno));
			return -1;
		}
		created = 1;
		fd = open(root, SATTR_DIR_FLAGS);
	}
	if (fd < 0) {
		e = errno;
		snprintf(err, errlen, "open %s: %s%s", root, strerror(e),
			 e == ELOOP || e == ENOTDIR ? " (symlink or not a directory)" : "");
		return -1;
	}
	if (fstat(fd, &st) != 0) {
		snprintf(err, errlen, "fstat %s: %s", root, strerror(errno));
		goto fail;
	}
	if (st.st_uid != 0) {
		snprintf(err, errlen, "%s is owned by uid %u, not root; refusing it", root,
			 (unsigned int)st.st_uid);
		goto fail;
	}
	if (created && fchmod(fd, 0755) != 0) {
		snprintf(err, errlen, "fchmod %s: %s", root, strerror(errno));
		goto fail;
	}
	if (!created && (st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
		snprintf(err, errlen, "%s is group/world-writable without the sticky bit; "
			 "refusing it", root);
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return -1;
}

/*
 * Ensure parentfd/name is a real directory owned by uid:gid with mode 0700.
 * An existing one must already belong to root (ours, half-made) or to uid:
 * anything else was planted by someone else and is left alone.
 */
static int sattr_ensure_dir(int parentfd, const char *label, const char *name, uid_t uid,
			    gid_t gid, char *err, size_t errlen)
{
	struct stat st;
	int fd, e;

	if (mkdirat(parentfd, name, 0700) != 0 && errno != EEXIST) {
		snprintf(err, errlen, "mkdir %s: %s", label, strerror(errno));
		return -1;
	}
	fd = openat(parentfd, name, SATTR_DIR_FLAGS);
	if (fd < 0) {
		e = errno;
		snprintf(err, errlen, "open %s: %s%s; skipped", label, strerror(e),
			 e == ELOOP || e == ENOTDIR ? " (symlink or not a directory)" : "");
		return -1;
	}
	if (fstat(fd, &st) != 0) {
		snprintf(err, errlen, "fstat %s: %s", label, strerror(errno));
		goto fail;
	}
	if (st.st_uid != 0 && st.st_uid != uid) {
		snprintf(err, errlen, "%s exists owned by uid %u, not the job's uid %u; skipped",
			 label, (unsigned int)st.st_uid, (unsigned int)uid);
		goto fail;
	}
	if (fchown(fd, uid, gid) != 0) {
		snprintf(err, errlen, "fchown %s: %s", label, strerror(errno));
		goto fail;
	}
	if (fchmod(fd, 0700) != 0) {
		snprintf(err, errlen, "fchmod %s: %s", label, strerror(errno));
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return -1;
}

int sattr_jobdir_create(const char *evidence_root, const char *job_id, uid_t uid, gid_t gid,
			char *err, size_t errlen)
{
	static const char *const subdirs[] = { "fr", "probe", "nccl" };
	char canon[SATTR_ID_MAX];
	char label[PATH_MAX];
	int rootfd = -1, jobfd = -1, fd, rc = -1, n;
	size_t i;

	if (!sattr_path_is_clean_abs(evidence_root)) {
		snprintf(err, errlen, "evidence root '%s' is not a clean absolute path",
			 evidence_root);
		goto out;
	}
	/* The id becomes a path component: digits only, canonical form. */
	if (sattr_parse_job_id(job_id, canon) != 0 || strcmp(canon, job_id) != 0) {
		snprintf(err, errlen, "job id '%.32s' is not a job number", job_id);
		goto out;
	}
	rootfd = sattr_open_root(evidence_root, err, errlen);
	if (rootfd < 0)
		goto out;
	n = snprintf(label, sizeof(label), "%s/%s", evidence_root, job_id);
	if (n < 0 || (size_t)n >= sizeof(label)) {
		snprintf(err, errlen, "job directory path too long");
		goto out;
	}
	jobfd = sattr_ensure_dir(rootfd, label, job_id, uid, gid, err, errlen);
	if (jobfd < 0)
		goto out;
	for (i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++) {
		n = snprintf(label, sizeof(label), "%s/%s/%s", evidence_root, job_id, subdirs[i]);
		if (n < 0 || (size_t)n >= sizeof(label)) {
			snprintf(err, errlen, "job directory path too long");
			goto out;
		}
		fd = sattr_ensure_dir(jobfd, label, subdirs[i], uid, gid, err, errlen);
		if (fd < 0)
			goto out;
		close(fd);
	}
	rc = 0;
out:
	if (jobfd >= 0)
		close(jobfd);
	if (rootfd >= 0)
		close(rootfd);
	return rc;
}

/*
 * "<evidence_root>/<job_id>.start": when the job first ran anything on this node, for the
 * node epilog's kernel window (collect/window.py). Slurm 22.05 gives its node Epilog no
 * job start, and asking slurmctld from every node's epilog is one RPC per node per job.
 * Written by root (slurmstepd, the first step of the job here: batch, extern or srun),
 * 0600 in the root-owned evidence root, created exclusively, so the first step's time
 * stays and neither a later step nor the job can move it: the job ran nothing on this
 * node before it. The file's ctime is the record; the text is for people.
 * 1 created, 0 already there (an earlier step), -1 with err set.
 */
int sattr_jobstart_write(const char *evidence_root, const char *job_id, char *err, size_t errlen)
{
	char canon[SATTR_ID_MAX], name[SATTR_ID_MAX + 8], text[48];
	struct timespec now;
	int rootfd = -1, fd = -1, rc = -1, n;

	if (!sattr_path_is_clean_abs(evidence_root)) {
		snprintf(err, errlen, "evidence root '%s' is not a clean absolute path", evidence_root);
		return -1;
	}
	if (sattr_parse_job_id(job_id, canon) != 0 || strcmp(canon, job_id) != 0) {
		snprintf(err, errlen, "job id '%.32s' is not a job number", job_id);
		return -1;
	}
	rootfd = sattr_open_root(evidence_root, err, errlen);
	if (rootfd < 0)
		return -1;
	snprintf(name, sizeof(name), "%s.start", job_id);
	fd = openat(rootfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 && errno == EEXIST) {
		rc = 0;
		goto out;
	}
	if (fd < 0) {
		snprintf(err, errlen, "%s/%s: %s", evidence_root, name, strerror(errno));
		goto out;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	n = snprintf(text, sizeof(text), "%lld.%09ld\n", (long long)now.tv_sec, now.tv_nsec);
	if (n > 0 && (size_t)n < sizeof(text) && write(fd, text, (size_t)n) != n)
		snprintf(err, errlen, "%s/%s: write: %s", evidence_root, name, strerror(errno));
	rc = 1; /* the ctime is the record, written or not */
out:
	if (fd >= 0)
		close(fd);
	close(rootfd);
	return rc;
}

/*
 * May the task environment point into "<evidence_root>/<job_id>"? Called from
 * user_init (the job's euid), before tasks start. A directory that exists but is
 * not a real directory owned by uid (or by root, half-made by us and fixed by
 * task_init_privileged) was refused by jobdir_create: exporting SLURM_ATTR_DIR
 * or the FR/probe/NCCL paths into it would make the job write into, or root
 * later collect from, someone else's directory. An absent one is created by
 * task_init_privileged before the first task runs, so it is usable.
 * 1 usable, 0 refused (err says why).
 */
int sattr_jobdir_usable(const char *evidence_root, const char *job_id, uid_t uid, char *err,
			size_t errlen)
{
	struct stat st;
	int rootfd, fd, e;

	rootfd = open(evidence_root, SATTR_DIR_FLAGS);
	if (rootfd < 0 && errno == ENOENT)
		return 1; /* made root-owned, with the job dir, by task_init_privileged */
	if (rootfd < 0) {
		snprintf(err, errlen, "evidence root %s: %s", evidence_root, strerror(errno));
		return 0;
	}
	if (fstat(rootfd, &st) != 0 || st.st_uid != 0) {
		snprintf(err, errlen, "evidence root %s is not owned by root", evidence_root);
		close(rootfd);
		return 0;
	}
	fd = openat(rootfd, job_id, SATTR_DIR_FLAGS);
	e = errno;
	close(rootfd);
	if (fd < 0) {
		if (e == ENOENT)
			return 1;
		snprintf(err, errlen, "%s/%s: %s%s", evidence_root, job_id, strerror(e),
			 e == ELOOP || e == ENOTDIR ? " (symlink or not a directory)" : "");
		return 0;
	}
	if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || (st.st_uid != uid && st.st_uid != 0)) {
		snprintf(err, errlen, "%s/%s is owned by uid %u, not the job's uid %u", evidence_root,
			 job_id, (unsigned int)st.st_uid, (unsigned int)uid);
		close(fd);
		return 0;
	}
	close(fd);
	return 1;
}
