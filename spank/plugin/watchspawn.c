/*
 * Starting the live watcher (slurm_attr/live): its command line and a detached spawn.
 * Pure: no Slurm, so the unit tests run it.
 *
 * Called from a task's privileged context (root, just forked by slurmstepd, before the
 * user's program): it must never delay or fail that task. The watcher is double-forked
 * (its parent is init, not the task: the task's exec and exit never wait on it), in its
 * own session, with no inherited descriptor but /dev/null on 0-2, and an environment of
 * our own making (the task's is the user's: PYTHONPATH or LD_PRELOAD must not reach a
 * root process). A close-on-exec pipe tells whether the exec itself worked, so "cannot
 * start" is known and logged at once; the wait is one fork and one exec, not the watcher.
 */
#define _GNU_SOURCE 1
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sattr.h"

static int sattr_add(struct sattr_watch_cmd *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int sattr_add(struct sattr_watch_cmd *c, const char *fmt, ...)
{
	va_list ap;
	int n;
	size_t room = sizeof(c->buf) - c->used;

	if (c->argc + 1 >= SATTR_WATCH_ARGS)
		return -1;
	va_start(ap, fmt);
	n = vsnprintf(c->buf + c->used, room, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= room)
		return -1;
	c->argv[c->argc++] = c->buf + c->used;
	c->argv[c->argc] = NULL;
	c->used += (size_t)n + 1;
	return 0;
}

/* Names and ids that become arguments: nothing a shell or our parser could misread. */
static int sattr_word_ok(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n >= 1024 || s[0] == '-')
		return 0;
	for (i = 0; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
		      ch == '-' || ch == '_' || ch == '.'))
			return 0;
	}
	return 1;
}

int sattr_watch_cmd_build(const struct sattr_watch_req *r, struct sattr_watch_cmd *c)
{
	memset(c, 0, sizeof(*c));
	if (r->exe == NULL || !sattr_path_is_clean_abs(r->exe) || !sattr_word_ok(r->job_id) ||
	    !sattr_word_ok(r->step) ||
	    r->jobdir == NULL || !sattr_path_is_clean_abs(r->jobdir))
		return -1;
	if (sattr_add(c, "%s", r->exe) || sattr_add(c, "watch") ||
	    sattr_add(c, "--job") || sattr_add(c, "%s", r->job_id) ||
	    sattr_add(c, "--step") || sattr_add(c, "%s", r->step) ||
	    sattr_add(c, "--nodeid") || sattr_add(c, "%u", r->nodeid) ||
	    sattr_add(c, "--nnodes") || sattr_add(c, "%u", r->nnodes) ||
	    sattr_add(c, "--jobdir") || sattr_add(c, "%s", r->jobdir) ||
	    sattr_add(c, "--gid") || sattr_add(c, "%u", r->gid) ||
	    sattr_add(c, "--stepd-pid") || sattr_add(c, "%ld", (long)r->stepd_pid))
		return -1;
	if (r->nodeid == 0 && sattr_add(c, "--leader"))
		return -1;
	if (r->config != NULL && r->config[0] != '\0') {
		if (!sattr_path_is_clean_abs(r->config) || sattr_add(c, "--config") ||
		    sattr_add(c, "%s", r->config))
			return -1;
	}
	return 0;
}

/* Everything but 0-2 closed; 0-2 on /dev/null. */
static void sattr_detach_fds(int keep)
{
	long max = sysconf(_SC_OPEN_MAX);
	int fd, nul = open("/dev/null", O_RDWR);

	if (nul >= 0) {
		dup2(nul, 0);
		dup2(nul, 1);
		dup2(nul, 2);
	}
	if (max < 0 || max > 65536)
		max = 65536;
	for (fd = 3; fd < max; fd++)
		if (fd != keep)
			close(fd);
}

int sattr_watch_spawn(const struct sattr_watch_cmd *c, char *err, size_t errlen)
{
	static char *const env[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8",
				     "PYTHONNOUSERSITE=1", NULL };
	int pfd[2], status = 0, child_errno = 0;
	pid_t pid, got;
	ssize_t n;

	if (c->argc == 0) {
		snprintf(err, errlen, "no command");
		return -1;
	}
	if (pipe2(pfd, O_CLOEXEC) != 0) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		close(pfd[0]);
		close(pfd[1]);
		return -1;
	}
	if (pid == 0) {
		/* middle child: a new session, then the watcher, then leave at once */
		sigset_t all;
		sigemptyset(&all);
		sigprocmask(SIG_SETMASK, &all, NULL);
		signal(SIGPIPE, SIG_DFL);
		close(pfd[0]);
		if (setsid() < 0)
			_exit(1);
		pid = fork();
		if (pid != 0)
			_exit(pid < 0 ? 1 : 0);
		sattr_detach_fds(pfd[1]);
		if (chdir("/") != 0)
			_exit(1);
		umask(022);
		setpriority(PRIO_PROCESS, 0, 19);
		execve(c->argv[0], c->argv, env);
		child_errno = errno;
		if (write(pfd[1], &child_errno, sizeof(child_errno)) < 0)
			_exit(127);
		_exit(127);
	}
	close(pfd[1]);
	do
		got = waitpid(pid, &status, 0);
	while (got < 0 && errno == EINTR);
	if (got != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		snprintf(err, errlen, "fork/setsid failed");
		close(pfd[0]);
		return -1;
	}
	/* EOF: the exec succeeded (the pipe closed on exec); 4 bytes: it failed, errno. */
	do
		n = read(pfd[0], &child_errno, sizeof(child_errno));
	while (n < 0 && errno == EINTR);
	close(pfd[0]);
	if (n == (ssize_t)sizeof(child_errno)) {
		snprintf(err, errlen, "exec %s: %s", c->argv[0], strerror(child_errno));
		return -1;
	}
	return 0;
}
