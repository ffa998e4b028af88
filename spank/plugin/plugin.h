/*
 * slurm_attr SPANK plugin: the parts that talk to Slurm.
 */
#ifndef SATTR_PLUGIN_H
#define SATTR_PLUGIN_H

#include <slurm/spank.h>

#include "sattr.h"

/* Every line names the plugin, so admins can grep one prefix. */
#define sattr_error(fmt, ...) slurm_error("slurm_attr: " fmt, ##__VA_ARGS__)
#define sattr_info(fmt, ...) slurm_info("slurm_attr: " fmt, ##__VA_ARGS__)
#define sattr_verbose(fmt, ...) slurm_verbose("slurm_attr: " fmt, ##__VA_ARGS__)
#define sattr_debug(fmt, ...) slurm_debug("slurm_attr: " fmt, ##__VA_ARGS__)

/* Job-control name: Prolog/Epilog/EpilogSlurmctld see SPANK_SATTR_ENABLED=0|1,
 * the job's tasks SLURM_SPANK_SATTR_ENABLED. */
#define SATTR_CTL_NAME "SATTR_ENABLED"
#define SATTR_CTL_IN_JOB "SLURM_SPANK_" SATTR_CTL_NAME
#define SATTR_CTL_IN_HOOKS "SPANK_" SATTR_CTL_NAME
#define SATTR_USER_ENV "SLURM_ATTR"

/* optout.c: --attr=on|off, SLURM_ATTR, and publishing the decision */
SATTR_HIDDEN void sattr_option_register(spank_t sp);
SATTR_HIDDEN void sattr_optout_publish(spank_t sp, const struct sattr_config *cfg);
SATTR_HIDDEN int sattr_enabled_remote(spank_t sp, const struct sattr_config *cfg);
SATTR_HIDDEN int sattr_enabled_job_script(const struct sattr_config *cfg);
/* Attribution on and, with live_partitions= set, the job's partition listed: the live watcher
 * and the worker hook apply to this step. */
SATTR_HIDDEN int sattr_live_remote(spank_t sp, const struct sattr_config *cfg);

/* evidence.c: job identity and the evidence directory from a root context */
SATTR_HIDDEN int sattr_item_job_id(spank_t sp, char out[SATTR_ID_MAX]);
SATTR_HIDDEN void sattr_evidence_from_items(spank_t sp, const struct sattr_config *cfg);
SATTR_HIDDEN void sattr_evidence_from_env(const struct sattr_config *cfg);
SATTR_HIDDEN int sattr_evidence_usable(spank_t sp, const struct sattr_config *cfg);
/* the job's first step on this node: <evidence_root>/<job>.start (jobdir.c writes it) */
SATTR_HIDDEN void sattr_jobstart_record(spank_t sp, const struct sattr_config *cfg);

/* rankmap.c: <evidence_root>/<job>.ranks.<node>, written by root per task */
SATTR_HIDDEN void sattr_rankmap_record(spank_t sp, const struct sattr_config *cfg);

/* env.c: task environment */
SATTR_HIDDEN void sattr_env_apply(spank_t sp, const struct sattr_config *cfg, int enabled);
SATTR_HIDDEN void sattr_env_apply_task(spank_t sp, const struct sattr_config *cfg);

/* watcher.c: the live watcher, started once per step and node (task 0) */
SATTR_HIDDEN void sattr_watcher_start(spank_t sp, const struct sattr_config *cfg);

#endif /* SATTR_PLUGIN_H */
