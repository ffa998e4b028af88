#!/usr/bin/env bash
# Everything `make demo` and `make test` need on a Debian 12 machine, installed idempotently:
#
#   cluster/deps.sh apt     Debian packages: Slurm 22.05, MariaDB, munge, libslurm-dev, gcc, Chromium...
#   cluster/deps.sh cluster-apt   only what the test cluster and the demo need
#   cluster/deps.sh venv    a venv (VENV, default .venv) with the project, its test dependencies
#                           and torch 2.13 CPU (the wheel on disk, never a CUDA build from PyPI)
#   cluster/deps.sh all     both (the default)
#
# A second run only checks: dpkg-query for the packages, a stamp (hash of what the venv was
# built from) plus one import for the venv.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$REPO/.venv}
case $VENV in /*) ;; *) VENV=$REPO/$VENV ;; esac
TORCH_VERSION=2.13.0

# What the test cluster and the demo use: bsdextrautils: column; util-linux: unshare, flock,
# runuser, mountpoint; procps: pgrep; hostname; debootstrap: the other Slurm releases' roots.
CLUSTER_PACKAGES=(slurmctld slurmd slurm-client slurmdbd mariadb-server munge libslurm-dev
                  gcc make libc6-dev python3 python3-venv python3-dev
                  util-linux bsdextrautils bsdutils procps iproute2 hostname)
# What the tests add: chromium renders the HTML report headless; debootstrap builds the
# trixie/sid roots of `make test-versions`; prometheus (its promtool checks and unit-tests
# contrib/prometheus' alert rules) and prometheus-node-exporter (its textfile collector serves the
# metrics file) run beside the test cluster. Not in CLUSTER_PACKAGES: the versions roots do
# without them, and testcluster.sh starts them only where they are installed.
TEST_PACKAGES=(chromium debootstrap prometheus prometheus-node-exporter)

log() { printf 'deps: %s\n' "$*" >&2; }

apt_deps() {  # apt_deps PACKAGE...
    local need=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || { log "missing Debian packages (${need[*]}); run as root"; exit 1; }
    log "installing ${need[*]}"
    local made_policy=0
    # The postinsts of slurm, mariadb and prometheus would start daemons; the test cluster
    # starts its own.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    [ $made_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
    # policy-rc.d kept them from starting now, but their postinsts enabled them for the next boot:
    # a site-wide Prometheus on :9090 and node_exporter on :9100 that nothing here uses. Only
    # what this run installed; an admin's own Prometheus stays as it was.
    for p in "${need[@]}"; do
        case $p in
            prometheus|prometheus-node-exporter)
                # update-rc.d disables the systemd unit as well, with or without a running systemd
                update-rc.d "$p" disable >/dev/null 2>&1 || true ;;
        esac
    done
    return 0
}

venv_hash() {
    cat "$REPO/pyproject.toml" "$REPO/cluster/deps.sh" | sha256sum | cut -c1-16
}

venv_deps() {
    local stamp=$VENV/.sattr-deps
    if [ "$(cat "$stamp" 2>/dev/null)" = "$(venv_hash)" ] &&
       "$VENV/bin/python" -c 'import slurm_attr, sqlite_utils, pytest, torch' 2>/dev/null; then
        return 0
    fi
    # Debian's own python3 (what a site admin has); it refuses `pip install` outside a venv.
    local base=/usr/bin/python3
    [ -x $base ] || base=$(command -v python3)
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating $VENV from $base"
        "$base" -m venv "$VENV" || { log "python3 -m venv failed (is python3-venv installed? cluster/deps.sh apt)"; exit 1; }
    fi
    local pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    # The CPU wheel lies on disk (PIP_FIND_LINKS, or TORCH_WHEEL_DIR); 2.13.0+cpu sorts above
    # PyPI's 2.13.0, and the check below refuses a CUDA build if one slipped in anyway.
    local links=()
    local dir=${TORCH_WHEEL_DIR:-/opt/wheels}
    [ -d "$dir" ] && links=(--find-links "$dir")
    log "installing torch $TORCH_VERSION (CPU) and the project into $VENV"
    "${pip[@]}" "${links[@]}" "torch==$TORCH_VERSION"
    "$VENV/bin/python" - <<'EOF' || { log "torch in $VENV is not a CPU build"; exit 1; }
import torch, sys
sys.exit(0 if torch.version.cuda is None else 1)
EOF
    "${pip[@]}" "${links[@]}" -e "$REPO[test]"
    venv_hash > "$stamp"
}

case ${1:-all} in
    apt) apt_deps "${CLUSTER_PACKAGES[@]}" "${TEST_PACKAGES[@]}" ;;
    cluster-apt) apt_deps "${CLUSTER_PACKAGES[@]}" ;;
    venv) venv_deps ;;
    all) apt_deps "${CLUSTER_PACKAGES[@]}" "${TEST_PACKAGES[@]}"; venv_deps ;;
    *) echo "usage: $0 [apt|cluster-apt|venv|all]" >&2; exit 2 ;;
esac
