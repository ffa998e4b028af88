/*
 * Loads the built plugin the way Slurm does (dlopen, RTLD_NOW) against the
 * fake SPANK host in fake_spank.c, checks its stamp, and drives its callbacks
 * through each context. Usage: test_plugin build/slurm_attr.so
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/slurm_version.h>

#include "check.h"
#include "fake_spank.h"

int sattr_t_pass, sattr_t_fail;

typedef int (*cb_f)(spank_t, int, char **);

static const char *so_path;
static void *handle;
static char base[64];
static char root[128];
static char probe_lib[192];
#define SP ((spank_t)(void *)&fake)

static const char *const callbacks[] = {
	"slurm_spank_init", "slurm_spank_init_post_opt", "slurm_spank_job_prolog",
	"slurm_spank_user_init", "slurm_spank_task_init_privileged",
};

/* Fresh plugin state for every scenario, as in a new srun/slurmstepd process. */
static void load(spank_context_t ctx)
{
	if (handle != NULL)
		dlclose(handle);
	fake_reset(ctx);
	handle = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
	if (handle == NULL) {
		fprintf(stderr, "dlopen %s: %s\n", so_path, dlerror());
		exit(1);
	}
}

static int call(const char *name, int ac, char **av)
{
	cb_f fn = (cb_f)dlsym(handle, name);

	if (fn == NULL) {
		fprintf(stderr, "missing %s\n", name);
		return -99;
	}
	return fn(SP, ac, av);
}

/* Every log line carries the plugin's prefix. */
static void check_log_prefix(void)
{
	int i;

	for (i = 0; i < fake.n_log; i++) {
		if (strncmp(fake.log[i], "slurm_attr: ", 12) != 0) {
			fprintf(stderr, "FAIL log line without prefix: %s\n", fake.log[i]);
			sattr_t_fail++;
			return;
		}
	}
	sattr_t_pass++;
}

static void test_stamp(void)
{
	const unsigned int *version, *spank_version;
	const char *name, *type;
	size_t i;

	load(S_CTX_LOCAL);
	name = dlsym(handle, "plugin_name");
	type = dlsym(handle, "plugin_type");
	version = dlsym(handle, "plugin_version");
	spank_version = dlsym(handle, "spank_plugin_version");
	CHECK(name != NULL && strcmp(name, "slurm_attr") == 0);
	CHECK(type != NULL && strcmp(type, "spank") == 0);
	CHECK(version != NULL && *version == SLURM_VERSION_NUMBER);
	CHECK(spank_version != NULL && *spank_version == 1);
	for (i = 0; i < sizeof(callbacks) / sizeof(callbacks[0]); i++)
		CHECK(dlsym(handle, callbacks[i]) != NULL);
	/* Internals are not exported (nothing for another plugin to collide with). */
	CHECK(dlsym(handle, "sattr_config_init") == NULL);
}

/* srun/sbatch: the option, then SATTR_ENABLED for the job's hooks. */
static const char *client_run(spank_context_t ctx, const char *opt, const char *env,
			      int ac, char **av)
{
	load(ctx);
	if (env != NULL)
		setenv("SLURM_ATTR", env, 1);
	else
		unsetenv("SLURM_ATTR");
	CHECK(call("slurm_spank_init", ac, av) == 0);
	CHECK(fake.n_opts == 1);
	if (fake.n_opts != 1)
		return NULL;
	if (opt != NULL)
		CHECK(fake.opts[0]->cb(fake.opts[0]->val, opt, 0) == 0);
	CHECK(call("slurm_spank_init_post_opt", ac, av) == 0);
	unsetenv("SLURM_ATTR");
	check_log_prefix();
	return fake_ctl_get("SATTR_ENABLED");
}

static void test_client(void)
{
	char off[] = "enabled=off";
	char *site_off[] = { off };
	struct spank_option *o;

	CHECK_STR(client_run(S_CTX_LOCAL, NULL, NULL, 0, NULL), "1");
	CHECK_STR(client_run(S_CTX_ALLOCATOR, "off", NULL, 0, NULL), "0");
	CHECK_STR(client_run(S_CTX_LOCAL, NULL, "off", 0, NULL), "0");
	CHECK_STR(client_run(S_CTX_LOCAL, NULL, "FALSE", 0, NULL), "0");
	CHECK_STR(client_run(S_CTX_LOCAL, "on", "off", 0, NULL), "1");
	CHECK_STR(client_run(S_CTX_LOCAL, NULL, "garbage", 0, NULL), "1");
	CHECK(fake_logged("SLURM_ATTR=garbage"));
	CHECK_STR(client_run(S_CTX_ALLOCATOR, NULL, NULL, 1, site_off), "0");
	CHECK_STR(client_run(S_CTX_ALLOCATOR, "on", NULL, 1, site_off), "1");

	load(S_CTX_LOCAL);
	CHECK(call("slurm_spank_init", 0, NULL) == 0);
	CHECK(fake.n_opts == 1);
	if (fake.n_opts != 1)
		return;
	o = fake.opts[0];
	CHECK_STR(o->name, "attr");
	CHECK(o->has_arg == 1);
	/* A bad value is refused at srun, but never fails a step remotely. */
	CHECK(o->cb(o->val, "maybe", 0) == -1);
	CHECK(o->cb(o->val, "maybe", 1) == 0);
	check_log_prefix();
}

static char *arg(const char *fmt, const char *value)
{
	static char bufs[4][256];
	static int next;
	char *b = bufs[next++ % 4];

	snprintf(b, sizeof(bufs[0]), fmt, value);
	return b;
}

/* slurmstepd: user_init sets the task environment, task_init_privileged the dir. */
static void test_remote(void)
{
	char *av[] = { arg("evidence_root=%s", root), arg("probe_lib=%s", probe_lib), "bogus=1" };
	char want[256], dir[256];
	struct stat st;

	load(S_CTX_REMOTE);
	fake_env_put("NCCL_DEBUG", "INFO");
	CHECK(call("slurm_spank_init", 3, av) == 0);
	CHECK(call("slurm_spank_init_post_opt", 3, av) == 0);
	CHECK(call("slurm_spank_user_init", 3, av) == 0);
	snprintf(want, sizeof(want), "%s/1234", root);
	CHECK_STR(fake_env_get("SLURM_ATTR_DIR"), want);
	CHECK_STR(fake_env_get("TORCH_FR_BUFFER_SIZE"), "2000");
	snprintf(want, sizeof(want), "%s/1234/fr/nccl_trace_rank_", root);
	CHECK_STR(fake_env_get("TORCH_FR_DUMP_TEMP_FILE"), want);
	CHECK_STR(fake_env_get("NCCL_DEBUG"), "INFO");
	CHECK(fake_env_get("NCCL_DEBUG_FILE") == NULL);
	CHECK_STR(fake_env_get("NCCL_PROFILER_PLUGIN"), "libnccl-profiler-sattr.so");
	snprintf(want, sizeof(want), "%s/lib", base);
	CHECK_STR(fake_env_get("LD_LIBRARY_PATH"), want);
	CHECK(fake_logged("plugstack.conf: unknown argument 'bogus'"));

	CHECK(call("slurm_spank_task_init_privileged", 3, av) == 0);
	CHECK(call("slurm_spank_task_init_privileged", 3, av) == 0);
	snprintf(dir, sizeof(dir), "%s/1234/nccl", root);
	if (geteuid() == 0)
		CHECK(lstat(dir, &st) == 0 && st.st_uid == 4242 && st.st_gid == 4343);
	check_log_prefix();

	/* The user opted out at submission (SLURM_ATTR=off is in the job's environment). */
	load(S_CTX_REMOTE);
	fake_env_put("SLURM_ATTR", "off");
	CHECK(call("slurm_spank_init", 3, av) == 0);
	CHECK(call("slurm_spank_user_init", 3, av) == 0);
	CHECK(call("slurm_spank_task_init_privileged", 3, av) == 0);
	CHECK(fake_env_get("SLURM_ATTR_DIR") == NULL && fake_env_get("NCCL_DEBUG") == NULL);

	/* --attr=off forwarded to the step, inside an enabled batch job: our leftovers go. */
	load(S_CTX_REMOTE);
	fake.job_id = 1300;
	snprintf(want, sizeof(want), "%s/1300", root);
	fake_env_put("SLURM_ATTR_DIR", want);
	fake_env_put("NCCL_PROFILER_PLUGIN", "libnccl-profiler-sattr.so");
	snprintf(want, sizeof(want), "%s/lib:/usr/lib", base);
	fake_env_put("LD_LIBRARY_PATH", want);
	CHECK(call("slurm_spank_init", 3, av) == 0);
	CHECK(fake.n_opts == 1);
	if (fake.n_opts == 1)
		CHECK(fake.opts[0]->cb(fake.opts[0]->val, "off", 1) == 0);
	CHECK(call("slurm_spank_user_init", 3, av) == 0);
	CHECK(call("slurm_spank_task_init_privileged", 3, av) == 0);
	CHECK(fake_env_get("SLURM_ATTR_DIR") == NULL);
	CHECK(fake_env_get("NCCL_PROFILER_PLUGIN") == NULL);
	CHECK_STR(fake_env_get("LD_LIBRARY_PATH"), "/usr/lib");
	snprintf(dir, sizeof(dir), "%s/1300", root);
	CHECK(lstat(dir, &st) != 0);

	/* The submitting command published SATTR_ENABLED=0. */
	load(S_CTX_REMOTE);
	fake_env_put("SLURM_SPANK_SATTR_ENABLED", "0");
	CHECK(call("slurm_spank_user_init", 3, av) == 0);
	CHECK(fake_env_get("SLURM_ATTR_DIR") == NULL);
	check_log_prefix();

	/* Enabled, but the job dir was planted by another uid and refused: no evidence
	 * variables (issue 10); the same job with its own dir (1234, above) gets them. */
	if (geteuid() == 0) {
		load(S_CTX_REMOTE);
		fake.job_id = 1301;
		snprintf(dir, sizeof(dir), "%s/1301", root);
		CHECK(mkdir(dir, 0700) == 0 && chown(dir, 5555, 5555) == 0);
		CHECK(call("slurm_spank_init", 3, av) == 0);
		CHECK(call("slurm_spank_user_init", 3, av) == 0);
		CHECK(fake_env_get("SLURM_ATTR_DIR") == NULL);
		CHECK(fake_env_get("TORCH_FR_DUMP_TEMP_FILE") == NULL);
		CHECK(fake_env_get("NCCL_PROFILER_PLUGIN") == NULL);
		CHECK(fake_logged("evidence directory refused"));
		CHECK(lstat(dir, &st) == 0 && st.st_uid == 5555);
		check_log_prefix();
	}
}

/* True once a line of path contains want (the detached watcher writes it a moment later). */
static int file_has_line(const char *path, const char *want, int wait_ms)
{
	char line[512];
	int ms;

	for (ms = 0; ms <= wait_ms; ms += 20) {
		FILE *f = fopen(path, "r");

		if (f != NULL) {
			while (fgets(line, sizeof(line), f) != NULL)
				if (strstr(line, want) != NULL) {
					fclose(f);
					return 1;
				}
			fclose(f);
		}
		usleep(20000);
	}
	return 0;
}

/* live_watcher= and worker_hook= apply to jobs in live_partitions= only (every job without). */
static void test_live_partitions(void)
{
	char exe[192], log[192], want[64];
	char *av[] = { arg("evidence_root=%s", root), NULL, arg("worker_hook=%s", base),
		       "live_partitions=live,gpu" };
	FILE *f;
	int i;
	static const struct {
		uint32_t job;
		const char *partition; /* NULL: unset */
		int live;
	} jobs[] = { { 1400, "live", 1 }, { 1401, "debug", 0 }, { 1402, "gpu", 1 },
		     { 1403, "live-long", 0 }, { 1404, NULL, 0 } };

	snprintf(exe, sizeof(exe), "%s/watch.sh", base);
	snprintf(log, sizeof(log), "%s/watched", base);
	av[1] = arg("live_watcher=%s", exe);
	f = fopen(exe, "w");
	CHECK(f != NULL);
	if (f == NULL)
		return;
	/* the watcher starts with a clean environment: its arguments say which job it watches */
	fprintf(f, "#!/bin/sh\necho \"$*\" >> %s\n", log);
	fclose(f);
	CHECK(chmod(exe, 0755) == 0);
	for (i = 0; i < (int)(sizeof(jobs) / sizeof(jobs[0])); i++) {
		load(S_CTX_REMOTE);
		fake.job_id = jobs[i].job;
		fake.nnodes = 2;
		fake_env_put("SLURM_STEP_NODELIST", "n[1-2]");
		if (jobs[i].partition != NULL)
			fake_env_put("SLURM_JOB_PARTITION", jobs[i].partition);
		CHECK(call("slurm_spank_init", 4, av) == 0);
		CHECK(call("slurm_spank_user_init", 4, av) == 0);
		CHECK(call("slurm_spank_task_init_privileged", 4, av) == 0);
		CHECK(call("slurm_spank_task_init", 4, av) == 0);
		CHECK((fake_env_get("TORCH_WORKER_SERVER_SOCKET") != NULL) == jobs[i].live);
		CHECK(fake_logged("is not in live_partitions=live,gpu") == !jobs[i].live);
		check_log_prefix();
	}
	/* The starts are detached: the listed jobs' lines come; then none of the others' is there
	 * (they were never spawned, so there is nothing left to wait for). */
	for (i = 0; i < (int)(sizeof(jobs) / sizeof(jobs[0])); i++) {
		snprintf(want, sizeof(want), "--job %u ", jobs[i].job);
		if (jobs[i].live)
			CHECK(file_has_line(log, want, 5000));
	}
	for (i = 0; i < (int)(sizeof(jobs) / sizeof(jobs[0])); i++) {
		snprintf(want, sizeof(want), "--job %u ", jobs[i].job);
		if (!jobs[i].live)
			CHECK(!file_has_line(log, want, 0));
	}
	/* The batch step: one node (Slurm says 0 there), the leader of its own watch. */
	load(S_CTX_REMOTE);
	fake.job_id = 1405;
	fake.step_id = 0xfffffffbu; /* SLURM_BATCH_SCRIPT */
	fake.nnodes = 0;
	fake.node_id = 0;
	fake_env_put("SLURM_NODELIST", "n[1-2]");
	fake_env_put("SLURM_JOB_PARTITION", "live");
	/* the user's SLURM_STEP_NODELIST (Slurm sets none for the batch step) reaches no argument */
	fake_env_put("SLURM_STEP_NODELIST", "n3");
	CHECK(call("slurm_spank_init", 4, av) == 0);
	CHECK(call("slurm_spank_task_init_privileged", 4, av) == 0);
	CHECK(file_has_line(log, "--job 1405 --step batch --nodeid 0 --nnodes 1 ", 5000));
	CHECK(!file_has_line(log, "n3", 0));
	CHECK(file_has_line(log, "--job 1405 ", 0) && file_has_line(log, " --leader", 0));
}

/* slurmd's job_prolog: job identity from the hook environment. */
static void test_job_prolog(void)
{
	char *av[] = { arg("evidence_root=%s", root) };
	char dir[256];
	struct stat st;

	if (geteuid() != 0) {
		printf("job_prolog tests skipped: they need root\n");
		return;
	}
	load(S_CTX_JOB_SCRIPT);
	setenv("SLURM_JOB_ID", "1235", 1);
	setenv("SLURM_JOB_UID", "4242", 1);
	setenv("SLURM_JOB_GID", "4343", 1);
	setenv("SPANK_SATTR_ENABLED", "1", 1);
	CHECK(call("slurm_spank_job_prolog", 1, av) == 0);
	snprintf(dir, sizeof(dir), "%s/1235/fr", root);
	CHECK(lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 4242);

	load(S_CTX_JOB_SCRIPT);
	setenv("SLURM_JOB_ID", "1236", 1);
	setenv("SPANK_SATTR_ENABLED", "0", 1);
	CHECK(call("slurm_spank_job_prolog", 1, av) == 0);
	snprintf(dir, sizeof(dir), "%s/1236", root);
	CHECK(lstat(dir, &st) != 0);

	load(S_CTX_JOB_SCRIPT);
	setenv("SLURM_JOB_ID", "12;rm", 1);
	unsetenv("SPANK_SATTR_ENABLED");
	CHECK(call("slurm_spank_job_prolog", 1, av) == 0);
	CHECK(fake_logged("not a job number"));
	check_log_prefix();
	unsetenv("SLURM_JOB_ID");
	unsetenv("SLURM_JOB_UID");
	unsetenv("SLURM_JOB_GID");
}

static void setup_dirs(void)
{
	char lib[160];
	FILE *f;

	snprintf(base, sizeof(base), "/tmp/sattr_plugin.XXXXXX");
	if (mkdtemp(base) == NULL) {
		perror("mkdtemp");
		exit(1);
	}
	snprintf(root, sizeof(root), "%s/evidence", base);
	snprintf(lib, sizeof(lib), "%s/lib", base);
	snprintf(probe_lib, sizeof(probe_lib), "%s/libnccl-profiler-sattr.so", lib);
	if (mkdir(lib, 0755) != 0 || (f = fopen(probe_lib, "w")) == NULL) {
		perror(lib);
		exit(1);
	}
	fclose(f);
}

int main(int argc, char **argv)
{
	char cmd[128];
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: %s slurm_attr.so\n", argv[0]);
		return 2;
	}
	so_path = argv[1];
	setup_dirs();
	test_stamp();
	test_client();
	test_remote();
	test_live_partitions();
	test_job_prolog();
	if (handle != NULL)
		dlclose(handle);
	fake_reset(S_CTX_ERROR);
	snprintf(cmd, sizeof(cmd), "rm -rf -- '%s'", base);
	rc = system(cmd);
	(void)rc;
	return sattr_t_report();
}
