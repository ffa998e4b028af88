/* The evidence directory: ownership, modes, idempotence, refusing symlinks. Needs root. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../plugin/sattr.h"
#include "check.h"

void test_jobdir(void);

#define UID 4242
#define GID 4343

static char base[64];
static char root[128];
static char err[PATH_MAX + SATTR_NOTE_MAX];

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void rm_tree(const char *path)
{
	nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int create(const char *job)
{
	err[0] = '\0';
	return sattr_jobdir_create(root, job, UID, GID, err, sizeof(err));
}

/* path (relative to root) is a real directory with this owner and mode. */
static int is_dir(const char *rel, uid_t uid, gid_t gid, mode_t mode)
{
	char path[PATH_MAX];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid ||
	    st.st_gid != gid || (st.st_mode & 07777) != mode) {
		fprintf(stderr, "  %s: not a %o dir owned by %u:%u\n", path, (unsigned)mode,
			(unsigned)uid, (unsigned)gid);
		return 0;
	}
	return 1;
}

static void test_create(void)
{
	char path[PATH_MAX];
	struct stat st;

	/* Missing root: created root-owned 0755 (umask notwithstanding). */
	umask(077);
	CHECK(create("42") == 0);
	umask(022);
	CHECK(lstat(root, &st) == 0 && st.st_uid == 0 && (st.st_mode & 07777) == 0755);
	CHECK(is_dir("42", UID, GID, 0700));
	CHECK(is_dir("42/fr", UID, GID, 0700));
	CHECK(is_dir("42/probe", UID, GID, 0700));
	CHECK(is_dir("42/nccl", UID, GID, 0700));

	/* Idempotent, and repairs a mode the user loosened. */
	snprintf(path, sizeof(path), "%s/42/fr", root);
	CHECK(chmod(path, 0777) == 0);
	CHECK(create("42") == 0);
	CHECK(is_dir("42/fr", UID, GID, 0700));
}

static void test_refuse_links(void)
{
	char target[PATH_MAX], link[PATH_MAX], file[PATH_MAX];
	struct stat st;
	FILE *f;

	snprintf(target, sizeof(target), "%s/target", base);
	CHECK(mkdir(target, 0755) == 0);

	/* The job directory is a symlink: never chown through it. */
	snprintf(link, sizeof(link), "%s/43", root);
	CHECK(symlink(target, link) == 0);
	CHECK(create("43") == -1);
	CHECK(strstr(err, "symlink") != NULL);
	CHECK(lstat(target, &st) == 0 && st.st_uid == 0 && (st.st_mode & 07777) == 0755);

	/* The job directory is a file. */
	snprintf(file, sizeof(file), "%s/44", root);
	f = fopen(file, "w");
	CHECK(f != NULL);
	if (f != NULL)
		fclose(f);
	CHECK(create("44") == -1);
	CHECK(lstat(file, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0);

	/* A subdirectory replaced by a symlink (the user owns the job dir). */
	CHECK(create("45") == 0);
	snprintf(link, sizeof(link), "%s/45/probe", root);
	CHECK(rmdir(link) == 0 && symlink(target, link) == 0);
	CHECK(create("45") == -1);
	CHECK(lstat(target, &st) == 0 && st.st_uid == 0);

	/* A directory planted by someone else is left alone. */
	snprintf(link, sizeof(link), "%s/46", root);
	CHECK(mkdir(link, 0777) == 0 && chown(link, 5555, 5555) == 0);
	CHECK(create("46") == -1);
	CHECK(strstr(err, "uid 5555") != NULL);
	CHECK(lstat(link, &st) == 0 && st.st_uid == 5555);
}

static void test_refuse_root(void)
{
	char saved[sizeof(root)], link[sizeof(root)];

	CHECK(chmod(root, 0775) == 0);
	CHECK(create("47") == -1);
	CHECK(strstr(err, "writable") != NULL);
	CHECK(chmod(root, 01777) == 0);
	CHECK(create("47") == 0); /* sticky /tmp-style roots are accepted */
	CHECK(chmod(root, 0755) == 0 && chown(root, 1000, 0) == 0);
	CHECK(create("48") == -1);
	CHECK(strstr(err, "not root") != NULL);
	CHECK(chown(root, 0, 0) == 0);

	snprintf(saved, sizeof(saved), "%s", root);
	snprintf(link, sizeof(link), "%s/rootlink", base);
	CHECK(symlink(saved, link) == 0);
	snprintf(root, sizeof(root), "%s", link);
	CHECK(create("49") == -1);
	snprintf(root, sizeof(root), "%s", "relative/root");
	CHECK(create("49") == -1);
	snprintf(root, sizeof(root), "%s", saved);
}

/* The task environment may name the dir only if it is the job's (or absent, made later). */
static void test_usable(void)
{
	char path[PATH_MAX];

	err[0] = '\0';
	CHECK(sattr_jobdir_usable(root, "42", UID, err, sizeof(err)) == 1); /* created above */
	CHECK(sattr_jobdir_usable(root, "50", UID, err, sizeof(err)) == 1); /* absent */
	/* Near miss of "42": planted by another uid, refused. */
	CHECK(sattr_jobdir_usable(root, "46", UID, err, sizeof(err)) == 0);
	CHECK(strstr(err, "uid 5555") != NULL);
	CHECK(sattr_jobdir_usable(root, "43", UID, err, sizeof(err)) == 0); /* symlink */
	CHECK(sattr_jobdir_usable(root, "44", UID, err, sizeof(err)) == 0); /* a file */
	snprintf(path, sizeof(path), "%s/42", root);
	CHECK(chown(path, 7777, 7777) == 0);
	CHECK(sattr_jobdir_usable(root, "42", UID, err, sizeof(err)) == 0);
	CHECK(chown(path, UID, GID) == 0);
}

static void test_bad_job_ids(void)
{
	static const char *const bad[] = { "007", "abc", "", "../42", "42/..", "0", "4294967295" };
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(create(bad[i]) == -1);
}

/* The job's first step on the node: created once, root 0600, never through a link. */
static void test_jobstart(void)
{
	char path[PATH_MAX], target[PATH_MAX];
	struct stat st, again;

	err[0] = '\0';
	CHECK(sattr_jobstart_write(root, "4711", err, sizeof(err)) == 1 && err[0] == '\0');
	snprintf(path, sizeof(path), "%s/4711.start", root);
	CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && (st.st_mode & 07777) == 0600);
	CHECK(st.st_size > 10); /* "<seconds>.<ns>\n" */
	/* A later step of the same job: the first time stays. */
	sleep(1);
	CHECK(sattr_jobstart_write(root, "4711", err, sizeof(err)) == 0);
	CHECK(lstat(path, &again) == 0 && again.st_ctime == st.st_ctime && again.st_ino == st.st_ino);
	/* Near miss: a symlink planted under the name is neither followed nor replaced. */
	snprintf(target, sizeof(target), "%s/planted", base);
	snprintf(path, sizeof(path), "%s/4712.start", root);
	CHECK(symlink(target, path) == 0);
	CHECK(sattr_jobstart_write(root, "4712", err, sizeof(err)) == 0);
	CHECK(access(target, F_OK) != 0 && lstat(path, &st) == 0 && S_ISLNK(st.st_mode));
	/* Not a job number: nothing written. */
	CHECK(sattr_jobstart_write(root, "../4713", err, sizeof(err)) == -1);
	CHECK(sattr_jobstart_write("relative/root", "4713", err, sizeof(err)) == -1);
}

void test_jobdir(void)
{
	if (geteuid() != 0) {
		printf("jobdir tests skipped: they need root (fchown)\n");
		return;
	}
	snprintf(base, sizeof(base), "/tmp/sattr_test.XXXXXX");
	CHECK(mkdtemp(base) != NULL);
	snprintf(root, sizeof(root), "%s/evidence", base);
	test_create();
	test_refuse_links();
	test_refuse_root();
	test_usable();
	test_bad_job_ids();
	test_jobstart();
	rm_tree(base);
}
