/* plugstack arguments, value parsing, the opt-out decision and path helpers. */
#include <stdint.h>

#include "../plugin/sattr.h"
#include "check.h"

void test_args(void);

/* Parse one argument into a fresh default config. */
static int parse1(struct sattr_config *cfg, const char *arg)
{
	char err[SATTR_NOTE_MAX];

	sattr_config_init(cfg);
	err[0] = '\0';
	return sattr_config_parse_arg(cfg, arg, err, sizeof(err));
}

/* A rejected argument leaves the whole config at its defaults, with a reason. */
static void check_rejected(const char *arg)
{
	struct sattr_config cfg, def;
	char err[SATTR_NOTE_MAX] = "";
	int rc;

	sattr_config_init(&def);
	sattr_config_init(&cfg);
	rc = sattr_config_parse_arg(&cfg, arg, err, sizeof(err));
	CHECK(rc == -1);
	CHECK(memcmp(&cfg, &def, sizeof(cfg)) == 0);
	CHECK(err[0] != '\0');
	if (rc != -1)
		fprintf(stderr, "  accepted: %s\n", arg);
}

static void test_defaults(void)
{
	struct sattr_config cfg;

	sattr_config_init(&cfg);
	CHECK(cfg.enabled == 1);
	CHECK_STR(cfg.evidence_root, "/var/tmp/slurm_attr");
	CHECK(cfg.fr_buffer == 2000);
	CHECK_STR(cfg.probe_lib, "");
	CHECK_STR(cfg.nccl_debug, "WARN");
}

static void test_valid_args(void)
{
	struct sattr_config cfg;

	CHECK(parse1(&cfg, "enabled=off") == 0 && cfg.enabled == 0);
	CHECK(parse1(&cfg, "enabled=ON") == 0 && cfg.enabled == 1);
	CHECK(parse1(&cfg, "evidence_root=/scratch/sattr") == 0);
	CHECK_STR(cfg.evidence_root, "/scratch/sattr");
	CHECK(parse1(&cfg, "evidence_root=/scratch/sattr//") == 0);
	CHECK_STR(cfg.evidence_root, "/scratch/sattr");
	CHECK(parse1(&cfg, "fr_buffer=0") == 0 && cfg.fr_buffer == 0);
	CHECK(parse1(&cfg, "fr_buffer=1000000") == 0 && cfg.fr_buffer == 1000000);
	CHECK(parse1(&cfg, "probe_lib=/opt/sattr/lib/libnccl-profiler-sattr.so") == 0);
	CHECK_STR(cfg.probe_lib, "/opt/sattr/lib/libnccl-profiler-sattr.so");
	CHECK(parse1(&cfg, "probe_lib=") == 0);
	CHECK_STR(cfg.probe_lib, "");
	CHECK(parse1(&cfg, "nccl_debug=info") == 0);
	CHECK_STR(cfg.nccl_debug, "INFO");
	CHECK(parse1(&cfg, "nccl_debug=OFF") == 0);
	CHECK_STR(cfg.nccl_debug, "");
	CHECK(parse1(&cfg, "live_partitions=gpu,gpu-long,a100_x.8") == 0);
	CHECK_STR(cfg.live_partitions, "gpu,gpu-long,a100_x.8");
	CHECK(parse1(&cfg, "live_partitions=") == 0);
	CHECK_STR(cfg.live_partitions, "");
}

/* live_partitions=: which jobs get the live watcher and worker hook */
static void test_partitions(void)
{
	CHECK(sattr_partition_listed("", "debug"));
	CHECK(sattr_partition_listed("", NULL)); /* no list: every job */
	CHECK(sattr_partition_listed("gpu", "gpu"));
	CHECK(sattr_partition_listed("cpu,gpu", "gpu"));
	CHECK(sattr_partition_listed("gpu,cpu", "gpu"));
	CHECK(sattr_partition_listed("a,gpu,b", "gpu"));
	/* near misses: prefixes, suffixes, unknown */
	CHECK(!sattr_partition_listed("gpu", "gpu-long"));
	CHECK(!sattr_partition_listed("gpu-long", "gpu"));
	CHECK(!sattr_partition_listed("gpu,cpu", "pu"));
	CHECK(!sattr_partition_listed("gpu,cpu", "gpu,cpu"));
	CHECK(!sattr_partition_listed("gpu", NULL));
	CHECK(!sattr_partition_listed("gpu", ""));
}

static void test_invalid_args(void)
{
	static const char *const bad[] = {
		"bogus=1", "enabled", "=on", "", "enabled=", "enabled=yes", "enabled=maybe",
		"Enabled=on", " enabled=on", "evidence_root=relative/dir", "evidence_root=",
		"evidence_root=/", "evidence_root=/a/../b", "evidence_root=/a/./b",
		"evidence_root=/a//b", "evidence_root=/a:b", "evidence_root=/a%h",
		"evidence_root=/a\nb", "fr_buffer=", "fr_buffer=-1", "fr_buffer=+5",
		"fr_buffer= 5", "fr_buffer=12a", "fr_buffer=1000001", "fr_buffer=99999999999",
		"fr_buffer=0x10", "probe_lib=libnccl-profiler-sattr.so",
		"probe_lib=/opt/x/profiler.so", "probe_lib=/opt/x/libfoo.so.1",
		"probe_lib=/opt/x/lib.so", "probe_lib=/opt/x/", "probe_lib=/opt:x/libp.so",
		"nccl_debug=TRACE", "nccl_debug=", "nccl_debug=WARNING",
		"live_partitions=gpu,", "live_partitions=,gpu", "live_partitions=a,,b",
		"live_partitions=gpu cpu", "live_partitions=g;x", "live_partitions=g/x",
	};
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		check_rejected(bad[i]);
}

static void test_long_path(void)
{
	char arg[SATTR_PATH_MAX + 64];
	size_t i, off = (size_t)snprintf(arg, sizeof(arg), "evidence_root=");

	for (i = off; i < sizeof(arg) - 1; i++)
		arg[i] = (i - off) % 8 == 0 ? '/' : 'a';
	arg[sizeof(arg) - 1] = '\0';
	check_rejected(arg);
}

static void test_values(void)
{
	char id[SATTR_ID_MAX];
	uint32_t v = 7;

	CHECK(sattr_parse_bool("off") == 0 && sattr_parse_bool("FALSE") == 0);
	CHECK(sattr_parse_bool("0") == 0 && sattr_parse_bool("No") == 0);
	CHECK(sattr_parse_bool("on") == 1 && sattr_parse_bool("1") == 1);
	CHECK(sattr_parse_bool("yes") == 1 && sattr_parse_bool("true") == 1);
	CHECK(sattr_parse_bool("") == -1 && sattr_parse_bool("offf") == -1);
	CHECK(sattr_parse_bool(NULL) == -1 && sattr_parse_bool(" on") == -1);

	CHECK(sattr_parse_u32("4294967295", UINT32_MAX, &v) == 0 && v == UINT32_MAX);
	CHECK(sattr_parse_u32("4294967296", UINT32_MAX, &v) == -1);
	CHECK(sattr_parse_u32("10", 9, &v) == -1);
	CHECK(sattr_parse_u32("", 9, &v) == -1 && sattr_parse_u32(NULL, 9, &v) == -1);

	CHECK(sattr_parse_job_id("1234", id) == 0);
	CHECK_STR(id, "1234");
	CHECK(sattr_parse_job_id("007", id) == 0);
	CHECK_STR(id, "7");
	CHECK(sattr_parse_job_id("0", id) == -1);
	CHECK(sattr_parse_job_id("4294967294", id) == -1); /* NO_VAL */
	CHECK(sattr_parse_job_id("12_3", id) == -1);
	CHECK(sattr_parse_job_id("../1", id) == -1);
	CHECK(sattr_parse_job_id(NULL, id) == -1);
}

static void test_decide(void)
{
	char note[SATTR_NOTE_MAX];

	/* The option beats everything. */
	CHECK(sattr_decide_enabled(1, "off", "0", 0, note, sizeof(note)) == 1);
	CHECK(sattr_decide_enabled(0, "on", "1", 1, note, sizeof(note)) == 0);
	/* Then the user's environment. */
	CHECK(sattr_decide_enabled(-1, "off", "1", 1, note, sizeof(note)) == 0);
	CHECK(sattr_decide_enabled(-1, "no", NULL, 1, note, sizeof(note)) == 0);
	CHECK(sattr_decide_enabled(-1, "1", "0", 0, note, sizeof(note)) == 1);
	CHECK(note[0] == '\0');
	/* Then what the submitting command published, then the site. */
	CHECK(sattr_decide_enabled(-1, NULL, "0", 1, note, sizeof(note)) == 0);
	CHECK(sattr_decide_enabled(-1, NULL, "1", 0, note, sizeof(note)) == 1);
	CHECK(sattr_decide_enabled(-1, NULL, NULL, 1, note, sizeof(note)) == 1);
	CHECK(sattr_decide_enabled(-1, NULL, NULL, 0, note, sizeof(note)) == 0);
	/* A garbled SLURM_ATTR is skipped, with a note. */
	CHECK(sattr_decide_enabled(-1, "please", NULL, 1, note, sizeof(note)) == 1);
	CHECK(strstr(note, "SLURM_ATTR=please") != NULL);
	CHECK(sattr_decide_enabled(-1, "please", "0", 1, note, sizeof(note)) == 0);
}

static void test_paths(void)
{
	struct sattr_config cfg;
	char out[64];

	CHECK(sattr_path_dirname("/opt/x/libp.so", out, sizeof(out)) == 0);
	CHECK_STR(out, "/opt/x");
	CHECK(sattr_path_dirname("/libp.so", out, sizeof(out)) == 0);
	CHECK_STR(out, "/");
	CHECK(sattr_path_dirname("libp.so", out, sizeof(out)) == -1);
	CHECK(sattr_path_dirname("/opt/x/libp.so", out, 6) == -1);
	CHECK_STR(sattr_path_basename("/opt/x/libp.so"), "libp.so");
	CHECK_STR(sattr_path_basename("libp.so"), "libp.so");

	CHECK(sattr_path_is_clean_abs("/var/tmp/slurm_attr"));
	CHECK(sattr_path_is_clean_abs("/"));
	CHECK(!sattr_path_is_clean_abs("/var/tmp/"));
	CHECK(!sattr_path_is_clean_abs("var/tmp"));
	CHECK(!sattr_path_is_clean_abs("/var/.."));
	CHECK(!sattr_path_is_clean_abs(NULL));

	sattr_config_init(&cfg);
	CHECK(sattr_jobdir_path(&cfg, "1234", out, sizeof(out)) == 0);
	CHECK_STR(out, "/var/tmp/slurm_attr/1234");
	CHECK(sattr_jobdir_path(&cfg, "1234", out, 24) == -1);
}

void test_args(void)
{
	test_defaults();
	test_valid_args();
	test_invalid_args();
	test_long_path();
	test_partitions();
	test_values();
	test_decide();
	test_paths();
}
