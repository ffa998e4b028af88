/* The live watcher's command line (what reaches argv, what is refused) and its detached
 * spawn: it runs, with our environment and no inherited descriptor, and a missing
 * executable is reported at once rather than lost. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../plugin/sattr.h"
#include "check.h"

static struct sattr_watch_req req(void)
{
	struct sattr_watch_req r;
	memset(&r, 0, sizeof(r));
	r.exe = "/usr/libexec/slurm-attr/live-watch";
	r.job_id = "1234";
	r.step = "0";
	r.jobdir = "/var/tmp/slurm_attr/1234";
	r.nodeid = 0;
	r.nnodes = 4;
	r.gid = 1000;
	r.stepd_pid = 4321;
	return r;
}

static void test_cmd(void)
{
	struct sattr_watch_req r = req();
	struct sattr_watch_cmd c;

	CHECK(sattr_watch_cmd_build(&r, &c) == 0);
	CHECK(c.argc == 17);
	CHECK_STR(c.argv[0], "/usr/libexec/slurm-attr/live-watch");
	CHECK_STR(c.argv[1], "watch");
	CHECK_STR(c.argv[5], "0");
	CHECK_STR(c.argv[6], "--nodeid");
	CHECK_STR(c.argv[15], "4321");
	CHECK_STR(c.argv[16], "--leader");
	CHECK(c.argv[17] == NULL);
	/* near miss: node 1 is no leader; a config path is passed on */
	r.nodeid = 1;
	r.config = "/etc/slurm/slurm_attr.toml";
	CHECK(sattr_watch_cmd_build(&r, &c) == 0);
	CHECK(c.argc == 18);
	CHECK_STR(c.argv[16], "--config");
	/* refused: values that could be read as options or split, relative paths */
	r = req();
	r.step = "--leader";
	CHECK(sattr_watch_cmd_build(&r, &c) == -1);
	r = req();
	r.step = "0 1";
	CHECK(sattr_watch_cmd_build(&r, &c) == -1);
	r = req();
	r.job_id = "12;rm";
	CHECK(sattr_watch_cmd_build(&r, &c) == -1);
	r = req();
	r.exe = "bin/watch";
	CHECK(sattr_watch_cmd_build(&r, &c) == -1);
	r = req();
	r.jobdir = "/var/tmp/../etc";
	CHECK(sattr_watch_cmd_build(&r, &c) == -1);
	r = req();
	r.config = "rel.toml";
	CHECK(sattr_watch_cmd_build(&r, &c) == -1);
}

/* A shell script as the watcher: writes its fds and env to a file, then exits. */
static void test_spawn(void)
{
	char dir[] = "/tmp/sattr-watch-XXXXXX", script[64], out[64], body[1024], got[4096];
	struct sattr_watch_cmd c;
	char err[256] = "";
	char keeparg[16];
	int keep, tries;
	FILE *f;
	size_t n = 0;

	CHECK(mkdtemp(dir) != NULL);
	snprintf(script, sizeof(script), "%s/watch.sh", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	snprintf(body, sizeof(body),
		 "#!/bin/sh\nif [ -e /proc/$$/fd/$2 ]; then k=open; else k=closed; fi\n"
		 "{ echo \"inherited:$k\"; env | sort; echo \"args:$*\"; } > %s.tmp; mv %s.tmp %s\n",
		 out, out, out);
	f = fopen(script, "w");
	CHECK(f != NULL);
	if (f == NULL)
		return;
	fputs(body, f);
	fclose(f);
	chmod(script, 0755);
	keep = open("/dev/null", O_RDONLY); /* without O_CLOEXEC: the spawn must close it */
	setenv("PYTHONPATH", "/home/user/evil", 1);
	memset(&c, 0, sizeof(c));
	c.argv[0] = script;
	snprintf(keeparg, sizeof(keeparg), "%d", keep);
	c.argv[1] = "watch";
	c.argv[2] = keeparg;
	c.argv[3] = NULL;
	c.argc = 3;
	CHECK(sattr_watch_spawn(&c, err, sizeof(err)) == 0);
	for (tries = 0; tries < 500 && access(out, F_OK) != 0; tries++)
		usleep(10000);
	f = fopen(out, "r");
	CHECK(f != NULL);
	if (f != NULL) {
		n = fread(got, 1, sizeof(got) - 1, f);
		fclose(f);
	}
	got[n] = '\0';
	CHECK(keep > 2 && strstr(got, "inherited:closed") != NULL);
	CHECK(strstr(got, "PYTHONPATH") == NULL);
	CHECK(strstr(got, "PATH=/usr/sbin:/usr/bin:/sbin:/bin") != NULL);
	CHECK(strstr(got, "args:watch ") != NULL);
	unsetenv("PYTHONPATH");
	close(keep);
	/* near miss: a missing executable is an error now, not a silent nothing */
	c.argv[0] = "/nonexistent/sattr-live-watch";
	CHECK(sattr_watch_spawn(&c, err, sizeof(err)) == -1);
	CHECK(strstr(err, "No such file") != NULL);
	unlink(out);
	unlink(script);
	rmdir(dir);
}

/* plugstack live_watcher=: an absolute clean path, or empty for off (the default) */
static void test_arg(void)
{
	struct sattr_config cfg;
	char err[256];

	sattr_config_init(&cfg);
	CHECK(cfg.live_watcher[0] == '\0');
	CHECK(sattr_config_parse_arg(&cfg, "live_watcher=/usr/libexec/slurm-attr/live_watch.sh", err,
				     sizeof(err)) == 0);
	CHECK_STR(cfg.live_watcher, "/usr/libexec/slurm-attr/live_watch.sh");
	CHECK(sattr_config_parse_arg(&cfg, "live_watcher=bin/watch", err, sizeof(err)) == -1);
	CHECK_STR(cfg.live_watcher, "/usr/libexec/slurm-attr/live_watch.sh"); /* unchanged */
	CHECK(sattr_config_parse_arg(&cfg, "live_watcher=/a/../b", err, sizeof(err)) == -1);
	CHECK(sattr_config_parse_arg(&cfg, "live_watcher=", err, sizeof(err)) == 0);
	CHECK(cfg.live_watcher[0] == '\0');
}

void test_watcher(void)
{
	test_arg();
	test_cmd();
	test_spawn();
}
