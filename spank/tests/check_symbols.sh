#!/bin/sh
# The plugin's dynamic symbol table: what Slurm's loader looks up is exported,
# our internals are not, and spank_* are left for the host to resolve.
# Usage: check_symbols.sh build/slurm_attr.so
set -u
so=${1:?usage: check_symbols.sh PLUGIN.so}
nm=${NM:-nm}
pass=0
fail=0

defined=$("$nm" -D --defined-only "$so") || { echo "$nm failed on $so"; echo "0 passed, 1 failed"; exit 1; }
undefined=$("$nm" -D --undefined-only "$so")

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

for sym in plugin_name plugin_type plugin_version spank_plugin_version \
	slurm_spank_init slurm_spank_init_post_opt slurm_spank_job_prolog \
	slurm_spank_user_init slurm_spank_task_init_privileged; do
	if echo "$defined" | awk '{print $3}' | grep -qx "$sym"; then ok; else bad "$sym not exported"; fi
done

if echo "$defined" | awk '{print $3}' | grep -q '^sattr_'; then
	bad "internal sattr_* symbols exported"
else
	ok
fi

# Resolved at load time by srun/slurmstepd, never linked from libslurm.
if echo "$undefined" | awk '{print $2}' | grep -qx spank_setenv; then ok; else bad "spank_setenv not left undefined"; fi
if readelf -d "$so" | grep -q 'NEEDED.*libslurm'; then bad "linked against libslurm"; else ok; fi
if readelf -d "$so" | grep -q 'BIND_NOW\|FLAGS.*NOW'; then ok; else bad "not linked with -z now"; fi
if readelf -lW "$so" | grep -q GNU_RELRO; then ok; else bad "no RELRO segment"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
