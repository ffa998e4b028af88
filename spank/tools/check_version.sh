#!/bin/sh
# check_version.sh SLURM_VERSION_H: refuse to install when the headers the plugin is built
# against are not the running Slurm's major.minor (the SPANK version stamp must match).
set -eu
hdr=$1
num=$(sed -n 's/^#define SLURM_VERSION_NUMBER *//p' "$hdr")
[ -n "$num" ] || { echo "check_version: no SLURM_VERSION_NUMBER in $hdr" >&2; exit 1; }
built=$(printf '%d.%02d' $(( (num >> 16) & 255 )) $(( (num >> 8) & 255 )))
# `slurmd -V` needs no slurm.conf; on a login node without slurmd, sinfo or srun answer.
running=""
for tool in slurmd slurmctld sinfo srun; do
    command -v $tool >/dev/null 2>&1 || continue
    running=$($tool -V 2>/dev/null | sed -n 's/^slurm[-a-z]* \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p' | head -1)
    [ -n "$running" ] && break
done
if [ -z "$running" ]; then
    echo "check_version: no Slurm found on this machine (slurmd/sinfo -V); built for $built" >&2
    exit 1
fi
r_major=${running%%.*}; r_minor=${running#*.}
r_minor=$(echo "$r_minor" | sed "s/^0*//"); running=$(printf "%d.%02d" "$r_major" "${r_minor:-0}")
if [ "$built" != "$running" ]; then
    echo "check_version: the plugin is built against Slurm $built headers but this machine runs Slurm $running;" >&2
    echo "  install the libslurm-dev matching the running Slurm (or set SLURM_INCLUDE) and rebuild" >&2
    exit 1
fi
echo "check_version: Slurm $running matches the headers"
