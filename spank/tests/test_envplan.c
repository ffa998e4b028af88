/* Which task variables the plugin sets, given what the user already set. */
#include <stdlib.h>

#include "../plugin/sattr.h"
#include "check.h"

void test_envplan(void);

#define JOBDIR "/var/tmp/slurm_attr/1234"
#define PROBE_LIB "/opt/sattr/lib/libnccl-profiler-sattr.so"

/* A job environment: NULL-terminated name/value pairs; a NULL value = unreadable. */
struct fake_env {
	const char *const *pairs;
};

static int fake_lookup(void *ctx, const char *name, char *buf, size_t len)
{
	const struct fake_env *env = ctx;
	size_t i;
	int n;

	for (i = 0; env->pairs != NULL && env->pairs[i] != NULL; i += 2) {
		if (strcmp(env->pairs[i], name) != 0)
			continue;
		if (env->pairs[i + 1] == NULL)
			return -1;
		n = snprintf(buf, len, "%s", env->pairs[i + 1]);
		return n < 0 || (size_t)n >= len ? -1 : 1;
	}
	return 0;
}

static struct sattr_env_plan *plan;
static struct sattr_config cfg;

static int run(int on, int probe_present, const char *const *pairs)
{
	struct fake_env env = { pairs };
	struct sattr_env_request req = {
		.cfg = &cfg,
		.jobdir = JOBDIR,
		.probe_present = probe_present,
		.lookup = fake_lookup,
		.ctx = &env,
	};

	return on ? sattr_env_plan_on(&req, plan) : sattr_env_plan_off(&req, plan);
}

static const struct sattr_env_op *op(const char *name)
{
	size_t i;

	for (i = 0; i < plan->n_ops; i++) {
		if (strcmp(plan->ops[i].name, name) == 0)
			return &plan->ops[i];
	}
	return NULL;
}

/* name is set to value, with the given overwrite flag. */
static int sets(const char *name, const char *value, int overwrite)
{
	const struct sattr_env_op *o = op(name);

	if (o == NULL || o->unset || strcmp(o->value, value) != 0 || o->overwrite != overwrite) {
		fprintf(stderr, "  %s: %s\n", name,
			o == NULL ? "no op" : o->unset ? "unset" : o->value);
		return 0;
	}
	return 1;
}

static int unsets(const char *name)
{
	const struct sattr_env_op *o = op(name);

	return o != NULL && o->unset;
}

static int noted(const char *fragment)
{
	size_t i;

	for (i = 0; i < plan->n_notes; i++) {
		if (strstr(plan->notes[i], fragment) != NULL)
			return 1;
	}
	return 0;
}

static void test_defaults_empty_env(void)
{
	static const char *const env[] = { NULL };

	sattr_config_init(&cfg);
	CHECK(run(1, 0, env) == 0);
	CHECK(sets("TORCH_FR_BUFFER_SIZE", "2000", 0));
	CHECK(sets("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000", 0));
	CHECK(sets("TORCH_FR_DUMP_TEMP_FILE", JOBDIR "/fr/nccl_trace_rank_", 0));
	CHECK(sets("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", JOBDIR "/fr/nccl_trace_rank_", 0));
	CHECK(sets("TORCH_NCCL_DUMP_ON_TIMEOUT", "1", 0));
	CHECK(sets("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", JOBDIR "/fr/pipe_rank_", 0));
	CHECK(sets("NCCL_DEBUG", "WARN", 0));
	CHECK(sets("NCCL_DEBUG_FILE", JOBDIR "/nccl/nccl.%h.%p.log", 0));
	CHECK(sets("SLURM_ATTR_DIR", JOBDIR, 1));
	CHECK(op("NCCL_PROFILER_PLUGIN") == NULL && op("LD_LIBRARY_PATH") == NULL);
	CHECK(op("SLURM_ATTR_PROBE_DIR") == NULL);
	CHECK(plan->n_ops == 9 && plan->n_notes == 0);
}

static void test_user_choices_win(void)
{
	static const char *const legacy_buf[] = { "TORCH_NCCL_TRACE_BUFFER_SIZE", "50", NULL };
	static const char *const new_dump[] = { "TORCH_FR_DUMP_TEMP_FILE", "/home/u/fr_", NULL };
	static const char *const legacy_dump[] = { "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/x/", NULL };
	static const char *const mine[] = { "TORCH_NCCL_DUMP_ON_TIMEOUT", "0",
					    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "/tmp/p",
					    "SLURM_ATTR_DIR", "/elsewhere", NULL };

	sattr_config_init(&cfg);
	CHECK(run(1, 0, legacy_buf) == 0);
	CHECK(op("TORCH_FR_BUFFER_SIZE") == NULL && op("TORCH_NCCL_TRACE_BUFFER_SIZE") == NULL);
	CHECK(op("TORCH_FR_DUMP_TEMP_FILE") != NULL);

	CHECK(run(1, 0, new_dump) == 0);
	CHECK(op("TORCH_FR_DUMP_TEMP_FILE") == NULL);
	CHECK(op("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == NULL);
	CHECK(op("TORCH_FR_BUFFER_SIZE") != NULL);

	CHECK(run(1, 0, legacy_dump) == 0);
	CHECK(op("TORCH_FR_DUMP_TEMP_FILE") == NULL);
	CHECK(op("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == NULL);

	CHECK(run(1, 0, mine) == 0);
	CHECK(op("TORCH_NCCL_DUMP_ON_TIMEOUT") == NULL);
	CHECK(op("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") == NULL);
	/* SLURM_ATTR_DIR is ours and always points at this job. */
	CHECK(sets("SLURM_ATTR_DIR", JOBDIR, 1));
}

static void test_nccl_debug(void)
{
	static const char *const level[] = { "NCCL_DEBUG", "INFO", NULL };
	static const char *const file[] = { "NCCL_DEBUG_FILE", "/home/u/nccl.log", NULL };
	static const char *const empty_level[] = { "NCCL_DEBUG", "", NULL };
	static const char *const unreadable[] = { "NCCL_DEBUG", NULL, NULL };
	char err[SATTR_NOTE_MAX];

	sattr_config_init(&cfg);
	CHECK(run(1, 0, level) == 0);
	CHECK(op("NCCL_DEBUG") == NULL && op("NCCL_DEBUG_FILE") == NULL);
	CHECK(run(1, 0, file) == 0);
	CHECK(op("NCCL_DEBUG") == NULL && op("NCCL_DEBUG_FILE") == NULL);
	CHECK(run(1, 0, empty_level) == 0);
	CHECK(op("NCCL_DEBUG") == NULL && op("NCCL_DEBUG_FILE") == NULL);
	CHECK(run(1, 0, unreadable) == 0);
	CHECK(op("NCCL_DEBUG") == NULL && op("NCCL_DEBUG_FILE") == NULL);
	CHECK(noted("could not read NCCL_DEBUG"));

	CHECK(sattr_config_parse_arg(&cfg, "nccl_debug=off", err, sizeof(err)) == 0);
	CHECK(run(1, 0, NULL) == 0);
	CHECK(op("NCCL_DEBUG") == NULL && op("NCCL_DEBUG_FILE") == NULL);
	CHECK(sattr_config_parse_arg(&cfg, "nccl_debug=INFO", err, sizeof(err)) == 0);
	CHECK(run(1, 0, NULL) == 0);
	CHECK(sets("NCCL_DEBUG", "INFO", 0));
}

static void test_fr_buffer_zero(void)
{
	sattr_config_init(&cfg);
	cfg.fr_buffer = 0;
	CHECK(run(1, 0, NULL) == 0);
	CHECK(sets("TORCH_FR_BUFFER_SIZE", "0", 0));
	CHECK(sets("TORCH_NCCL_TRACE_BUFFER_SIZE", "0", 0));
}

/* Values under evidence_root were left by an enclosing step or another job. */
static void test_stale_ours_replaced(void)
{
	static const char *const stale[] = {
		"TORCH_FR_DUMP_TEMP_FILE", "/var/tmp/slurm_attr/99/fr/nccl_trace_rank_",
		"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "/var/tmp/slurm_attr/99/fr/pipe_rank_",
		"NCCL_DEBUG_FILE", "/var/tmp/slurm_attr/99/nccl/nccl.%h.%p.log",
		"NCCL_DEBUG", "WARN",
		"TORCH_FR_BUFFER_SIZE", "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE", "2000",
		NULL,
	};
	static const char *const lookalike[] = {
		"TORCH_FR_DUMP_TEMP_FILE", "/var/tmp/slurm_attr_other/fr_", NULL,
	};

	sattr_config_init(&cfg);
	CHECK(run(1, 0, stale) == 0);
	CHECK(sets("TORCH_FR_DUMP_TEMP_FILE", JOBDIR "/fr/nccl_trace_rank_", 1));
	CHECK(sets("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", JOBDIR "/fr/nccl_trace_rank_", 0));
	CHECK(sets("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", JOBDIR "/fr/pipe_rank_", 1));
	CHECK(sets("NCCL_DEBUG_FILE", JOBDIR "/nccl/nccl.%h.%p.log", 1));
	CHECK(op("NCCL_DEBUG") == NULL);
	CHECK(op("TORCH_FR_BUFFER_SIZE") == NULL);

	CHECK(run(1, 0, lookalike) == 0);
	CHECK(op("TORCH_FR_DUMP_TEMP_FILE") == NULL);
}

static void test_probe(void)
{
	static const char *const ld[] = { "LD_LIBRARY_PATH", "/usr/local/cuda/lib64", NULL };
	static const char *const ld_empty[] = { "LD_LIBRARY_PATH", "", NULL };
	static const char *const other[] = { "NCCL_PROFILER_PLUGIN", "inspector", NULL };
	static const char *const inherited[] = {
		"NCCL_PROFILER_PLUGIN", "libnccl-profiler-sattr.so",
		"LD_LIBRARY_PATH", "/opt/sattr/lib:/x",
		"SLURM_ATTR_PROBE_DIR", "/var/tmp/slurm_attr/1234/probe", NULL,
	};
	static const char *const inherited_lost_path[] = {
		"NCCL_PROFILER_PLUGIN", "libnccl-profiler-sattr.so",
		"LD_LIBRARY_PATH", "/x:/opt/sattr/lib", NULL,
	};
	static const char *const ld_unreadable[] = { "LD_LIBRARY_PATH", NULL, NULL };

	sattr_config_init(&cfg);
	snprintf(cfg.probe_lib, sizeof(cfg.probe_lib), "%s", PROBE_LIB);

	CHECK(run(1, 1, NULL) == 0);
	/* By file name, never the absolute path (NCCL 2.27.3 cannot load one). */
	CHECK(sets("NCCL_PROFILER_PLUGIN", "libnccl-profiler-sattr.so", 0));
	CHECK(sets("LD_LIBRARY_PATH", "/opt/sattr/lib", 1));
	CHECK(sets("SLURM_ATTR_PROBE_DIR", JOBDIR "/probe", 1));
	CHECK(plan->n_ops == 12);

	CHECK(run(1, 1, ld) == 0);
	CHECK(sets("LD_LIBRARY_PATH", "/opt/sattr/lib:/usr/local/cuda/lib64", 1));
	CHECK(run(1, 1, ld_empty) == 0);
	CHECK(sets("LD_LIBRARY_PATH", "/opt/sattr/lib", 1));

	CHECK(run(1, 0, NULL) == 0);
	CHECK(op("NCCL_PROFILER_PLUGIN") == NULL && op("LD_LIBRARY_PATH") == NULL);
	CHECK(op("SLURM_ATTR_PROBE_DIR") == NULL);
	CHECK(noted("not a readable file"));

	CHECK(run(1, 1, other) == 0);
	CHECK(op("NCCL_PROFILER_PLUGIN") == NULL && op("LD_LIBRARY_PATH") == NULL);
	CHECK(op("SLURM_ATTR_PROBE_DIR") == NULL);
	CHECK(noted("NCCL_PROFILER_PLUGIN=inspector"));

	CHECK(run(1, 1, inherited) == 0);
	CHECK(op("NCCL_PROFILER_PLUGIN") == NULL && op("LD_LIBRARY_PATH") == NULL);
	CHECK(sets("SLURM_ATTR_PROBE_DIR", JOBDIR "/probe", 1));

	CHECK(run(1, 1, inherited_lost_path) == 0);
	CHECK(op("NCCL_PROFILER_PLUGIN") == NULL);
	CHECK(sets("LD_LIBRARY_PATH", "/opt/sattr/lib:/x:/opt/sattr/lib", 1));

	CHECK(run(1, 1, ld_unreadable) == 0);
	CHECK(op("NCCL_PROFILER_PLUGIN") == NULL && op("LD_LIBRARY_PATH") == NULL);
	CHECK(noted("could not read LD_LIBRARY_PATH"));
}

static void test_probe_ld_too_long(void)
{
	const char *env[] = { "LD_LIBRARY_PATH", NULL, NULL };
	char *big = malloc(SATTR_ENV_VALUE_MAX);

	CHECK(big != NULL);
	if (big == NULL)
		return;
	memset(big, 'x', SATTR_ENV_VALUE_MAX - 2);
	big[0] = '/';
	big[SATTR_ENV_VALUE_MAX - 2] = '\0';
	env[1] = big;
	sattr_config_init(&cfg);
	snprintf(cfg.probe_lib, sizeof(cfg.probe_lib), "%s", PROBE_LIB);
	CHECK(run(1, 1, env) == 0);
	CHECK(op("NCCL_PROFILER_PLUGIN") == NULL && op("LD_LIBRARY_PATH") == NULL);
	CHECK(noted("LD_LIBRARY_PATH would be longer"));
	free(big);
}

/* An opted-out step inside an enabled job drops what points into the evidence dir. */
static void test_off(void)
{
	static const char *const batch[] = {
		"TORCH_FR_DUMP_TEMP_FILE", JOBDIR "/fr/nccl_trace_rank_",
		"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", JOBDIR "/fr/nccl_trace_rank_",
		"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "/home/u/pipe_",
		"TORCH_FR_BUFFER_SIZE", "2000",
		"NCCL_DEBUG_FILE", JOBDIR "/nccl/nccl.%h.%p.log", "NCCL_DEBUG", "WARN",
		"SLURM_ATTR_DIR", JOBDIR, "SLURM_ATTR_PROBE_DIR", JOBDIR "/probe",
		"NCCL_PROFILER_PLUGIN", "libnccl-profiler-sattr.so",
		"LD_LIBRARY_PATH", "/opt/sattr/lib:/usr/lib64", NULL,
	};
	static const char *const user[] = {
		"NCCL_DEBUG_FILE", "/home/u/n.log", "NCCL_DEBUG", "WARN",
		"NCCL_PROFILER_PLUGIN", "inspector", "LD_LIBRARY_PATH", "/opt/sattr/lib", NULL,
	};
	static const char *const only_ld[] = {
		"NCCL_PROFILER_PLUGIN", "libnccl-profiler-sattr.so",
		"LD_LIBRARY_PATH", "/opt/sattr/lib", NULL,
	};

	sattr_config_init(&cfg);
	snprintf(cfg.probe_lib, sizeof(cfg.probe_lib), "%s", PROBE_LIB);
	CHECK(run(0, 1, batch) == 0);
	CHECK(unsets("TORCH_FR_DUMP_TEMP_FILE") && unsets("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"));
	CHECK(op("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") == NULL);
	CHECK(op("TORCH_FR_BUFFER_SIZE") == NULL);
	CHECK(unsets("NCCL_DEBUG_FILE") && unsets("NCCL_DEBUG"));
	CHECK(unsets("SLURM_ATTR_DIR") && unsets("SLURM_ATTR_PROBE_DIR"));
	CHECK(unsets("NCCL_PROFILER_PLUGIN"));
	CHECK(sets("LD_LIBRARY_PATH", "/usr/lib64", 1));

	CHECK(run(0, 1, user) == 0);
	CHECK(plan->n_ops == 0);

	CHECK(run(0, 1, only_ld) == 0);
	CHECK(unsets("NCCL_PROFILER_PLUGIN") && unsets("LD_LIBRARY_PATH"));

	CHECK(run(0, 1, NULL) == 0);
	CHECK(plan->n_ops == 0);
}

#define HOOK "/opt/slurm-attr/hook"

/* task_init's plan: the per-rank worker-server socket and the hook on PYTHONPATH. */
static int run_task(unsigned int rank, const char *const *pairs)
{
	struct fake_env env = { pairs };
	struct sattr_env_request req = {
		.cfg = &cfg, .jobdir = JOBDIR, .lookup = fake_lookup, .ctx = &env,
	};

	return sattr_env_plan_task(&req, rank, plan);
}

static void test_worker_server(void)
{
	static const char *const on[] = { "SLURM_ATTR_DIR", JOBDIR, NULL };
	static const char *const py[] = { "SLURM_ATTR_DIR", JOBDIR, "PYTHONPATH", "/home/u/lib", NULL };
	static const char *const again[] = { "SLURM_ATTR_DIR", JOBDIR,
					     "PYTHONPATH", HOOK ":/home/u/lib",
					     "TORCH_WORKER_SERVER_SOCKET", JOBDIR "/ws/rank_0.sock",
					     NULL };
	static const char *const user[] = { "SLURM_ATTR_DIR", JOBDIR,
					    "TORCH_WORKER_SERVER_SOCKET", "/tmp/my.sock", NULL };
	static const char *const other_job[] = { "SLURM_ATTR_DIR", "/var/tmp/slurm_attr/99", NULL };
	static const char *const none[] = { NULL };
	char err[256];
	static const char *const off_env[] = { "PYTHONPATH", HOOK ":/home/u/lib",
					       "TORCH_WORKER_SERVER_SOCKET", JOBDIR "/ws/rank_3.sock",
					       NULL };

	/* off by default: nothing, even with this job's evidence dir */
	sattr_config_init(&cfg);
	CHECK(cfg.worker_hook[0] == '\0');
	CHECK(run_task(3, on) == 0 && plan->n_ops == 0);

	CHECK(sattr_config_parse_arg(&cfg, "worker_hook=" HOOK, err, sizeof(err)) == 0);
	CHECK(run_task(3, on) == 0);
	CHECK(sets("TORCH_WORKER_SERVER_SOCKET", JOBDIR "/ws/rank_3.sock", 0));
	CHECK(sets("PYTHONPATH", HOOK, 1));
	CHECK(plan->n_ops == 2);

	/* the user's PYTHONPATH is kept, after the hook */
	CHECK(run_task(12, py) == 0);
	CHECK(sets("TORCH_WORKER_SERVER_SOCKET", JOBDIR "/ws/rank_12.sock", 0));
	CHECK(sets("PYTHONPATH", HOOK ":/home/u/lib", 1));

	/* an enclosing step's (batch -> srun) values: the socket replaced, the path kept */
	CHECK(run_task(5, again) == 0);
	CHECK(sets("TORCH_WORKER_SERVER_SOCKET", JOBDIR "/ws/rank_5.sock", 1));
	CHECK(op("PYTHONPATH") == NULL && plan->n_ops == 1);

	/* near misses: the user's own socket (their server), no evidence dir for this job
	 * (attribution off or the dir refused), another job's dir inherited */
	CHECK(run_task(3, user) == 0 && plan->n_ops == 0 && noted("worker server hook not added"));
	CHECK(run_task(3, none) == 0 && plan->n_ops == 0);
	CHECK(run_task(3, other_job) == 0 && plan->n_ops == 0);

	/* opted out: ours removed, the user's PYTHONPATH left as it was */
	CHECK(run(0, 0, off_env) == 0);
	CHECK(unsets("TORCH_WORKER_SERVER_SOCKET"));
	CHECK(sets("PYTHONPATH", "/home/u/lib", 1));

	/* a relative hook dir is refused at parse time */
	sattr_config_init(&cfg);
	CHECK(sattr_config_parse_arg(&cfg, "worker_hook=hook", err, sizeof(err)) != 0);
	CHECK(cfg.worker_hook[0] == '\0');
}

void test_envplan(void)
{
	plan = calloc(1, sizeof(*plan));
	CHECK(plan != NULL);
	if (plan == NULL)
		return;
	test_defaults_empty_env();
	test_user_choices_win();
	test_nccl_debug();
	test_fr_buffer_zero();
	test_stale_ours_replaced();
	test_probe();
	test_probe_ld_too_long();
	test_off();
	test_worker_server();
	free(plan);
	plan = NULL;
}
