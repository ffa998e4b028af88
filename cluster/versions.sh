#!/usr/bin/env bash
# `make test-versions`: the native build (-Werror) and its C tests, the test cluster, the demo's
# first job and the integration suite (all but the torch tests: torch's wheel is for this
# machine's Python) on the Slurm releases sites run beside Debian 12's 22.05:
#
#   trixie  Slurm 24.11, MariaDB 11.8, gcc 14, Python 3.13
#   sid     Slurm 26.05, gcc 16, Python 3.14
#
# Each runs in a debootstrap root of its suite (cached in CACHE, apt archives too), inside its
# own network, PID, mount, UTS and IPC namespaces; the network namespace has loopback and one
# veth end with an address of its own (Slurm's daemons need a configured IPv4 interface) and no
# route anywhere: the cluster's traffic stays on its loopback.
#
#   cluster/versions.sh [SUITE...]     prepare the roots, then run the suites in parallel
#   cluster/versions.sh prepare SUITE  only build or refresh one root (needs the network)
#   cluster/versions.sh run SUITE      only run one suite in its prepared root
#   cluster/versions.sh start          prepare every root in the background and return at once:
#                                      `make test` starts it before the 22.05 stages, so a fresh
#                                      machine's debootstrap, apt and pyslurm build (minutes,
#                                      mostly network and one Cython build) overlap them; each
#                                      root's lock makes the later foreground prepare wait for
#                                      it and then find the root ready (seconds)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SATTR_VERSIONS_CACHE:-/var/cache/sattr-versions}
MIRROR=${SATTR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEFAULT_SUITES=(trixie sid)
CBASE=/var/lib/sattr-testcluster   # the test cluster's base inside a root
VENDOR=${SATTR_VENDOR:-$REPO/../shared/vendor}

# shellcheck source=cluster/rootmounts.sh
. "$REPO/cluster/rootmounts.sh"
# shellcheck source=cluster/treecopy.sh
. "$REPO/cluster/treecopy.sh"

log() { printf 'versions: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

suite_index() { case $1 in trixie) echo 1 ;; sid) echo 2 ;; *) echo 3 ;; esac; }

# Bind what a chroot needs for apt and builds, and the suite's apt archives; undone by root_unmount.
mount_root() {
    local root=$1
    root_mount "$root"
    mkdir -p "$CACHE/archives-$2" "$root/var/cache/apt/archives"
    mount --bind "$CACHE/archives-$2" "$root/var/cache/apt/archives"
}


copy_source() {  # the working tree as a newcomer has it (cluster/treecopy.sh)
    local root=$1
    copy_tree "$REPO" "$root/src"
    # ../shared/vendor beside the checkout, as here: the pyslurm release lines (cluster/pyslurm.sh)
    rm -rf "$root/shared"; mkdir -p "$root/shared/vendor"
    cp "$VENDOR"/pyslurm-*.tar.gz "$root/shared/vendor/" 2>/dev/null || log "no pyslurm sources in $VENDOR"
}

fetch_wheels() {  # fetch_wheels X.Y: the project's dependencies, pytest and the build backend
    local pyver=$1 reqs
    reqs=$(python3 - "$REPO/pyproject.toml" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = [d for d in p.get("dependencies", []) if "python_version <" not in d]
# + what cluster/pyslurm.sh builds a release line with (Cython 3: wheels for Python 3.13+)
print("\n".join(deps + p.get("optional-dependencies", {}).get("test", []) + ["setuptools>=64", "wheel", "packaging", "Cython>=3.0"]))
PY
)
    mkdir -p "$CACHE/wheels-$pyver"
    # shellcheck disable=SC2086
    python3 -m pip download -q --disable-pip-version-check -d "$CACHE/wheels-$pyver" --only-binary=:all: \
        --python-version "$pyver" --platform any --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
        $(echo "$reqs" | tr '\n' ' ') \
        > "$CACHE/wheels.log" 2>&1 || { tail -5 "$CACHE/wheels.log" >&2; die "fetching wheels failed"; }
}

prepare() {
    local suite=$1 root=$CACHE/$1 t0=$SECONDS
    mkdir -p "$CACHE"
    # One preparer per root (the background one `start` began, then the foreground's check).
    exec 9>"$CACHE/.prepare-$suite.lock"
    flock -n 9 || { log "$suite: waiting for the preparation under way (log: $CACHE/logs/prepare.log)"; flock 9
                    log "$suite: waited $((SECONDS - t0)) s"; }
    command -v debootstrap >/dev/null || bash "$REPO/cluster/deps.sh" apt
    root_unmount "$root"  # what a killed run left mounted (the next rm -rf would cross into it)
    if [ ! -e "$root/.sattr-debootstrap" ]; then
        log "$suite: debootstrap from $MIRROR"
        root_remove "$root.tmp"; mkdir -p "$CACHE"
        debootstrap --variant=minbase --include=ca-certificates "$suite" "$root.tmp" "$MIRROR" \
            > "$CACHE/debootstrap-$suite.log" 2>&1 || { tail -5 "$CACHE/debootstrap-$suite.log" >&2; die "$suite: debootstrap failed"; }
        root_remove "$root"; mv "$root.tmp" "$root"
        # sid's Release file may be past its Valid-Until; the archives are still signed.
        printf 'Acquire::Check-Valid-Until "false";\nAPT::Install-Recommends "false";\n' > "$root/etc/apt/apt.conf.d/99sattr"
        printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"; chmod 755 "$root/usr/sbin/policy-rc.d"
        touch "$root/.sattr-debootstrap"
    fi
    copy_source "$root"
    mount_root "$root" "$suite"
    local rc=0
    (
        # The project's own lists: what the cluster needs, then the hooks' venv (+ pytest).
        day=$(date +%Y%m%d)
        if [ "$(cat "$root/.sattr-apt-day" 2>/dev/null)" != "$day" ] || ! chroot "$root" bash /src/cluster/deps.sh cluster-apt >/dev/null 2>&1; then
            chroot "$root" env DEBIAN_FRONTEND=noninteractive bash -c 'apt-get update -qq && bash /src/cluster/deps.sh cluster-apt' \
                > "$CACHE/apt-$suite.log" 2>&1 || { tail -20 "$CACHE/apt-$suite.log" >&2; die "$suite: apt failed"; }
            echo "$day" > "$root/.sattr-apt-day"
        fi
        # The root's pip installs from wheels this machine's pip fetched (the roots' Python 3.13+
        # verifies TLS more strictly than some sites' proxies allow): pure Python or abi3 wheels.
        pyver=$(chroot "$root" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        fetch_wheels "$pyver"
        mkdir -p "$root/wheels"; mount --bind "$CACHE/wheels-$pyver" "$root/wheels"
        chroot "$root" env PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels bash -c "cd /src && bash cluster/testcluster.sh venv && { $CBASE/venv/bin/python -c 'import pytest' 2>/dev/null \
            || $CBASE/venv/bin/python -m pip install -q --disable-pip-version-check pytest; }" > "$CACHE/venv-$suite.log" 2>&1 \
            || { tail -20 "$CACHE/venv-$suite.log" >&2; die "$suite: venv failed"; }
        # The pyslurm wheel for the root's Slurm, built here (the runs have no network) once per
        # root and cached in it; exit 3: no release line (26.05), the CLI backend is tested alone.
        local prc=0
        chroot "$root" env PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels bash /src/cluster/pyslurm.sh build /usr/bin/python3 \
            > "$CACHE/pyslurm-$suite.log" 2>&1 || prc=$?
        case $prc in
            0) log "$suite: pyslurm $(basename "$(tail -1 "$CACHE/pyslurm-$suite.log")")" ;;
            3) log "$suite: no pyslurm release line; the CLI backend only" ;;
            *) tail -20 "$CACHE/pyslurm-$suite.log" >&2; die "$suite: pyslurm build failed" ;;
        esac
    ) || rc=$?
    umount "$root/wheels" 2>/dev/null || true
    root_unmount "$root"
    [ $rc = 0 ] || exit $rc
    log "$suite: root ready ($(chroot "$root" slurmd -V)) in $((SECONDS - t0)) s"
    exec 9>&-
}

start() {  # every default root, prepared in the background (its own session: make's ^C spares it)
    mkdir -p "$CACHE/logs"
    setsid bash "$0" prepare-all < /dev/null > "$CACHE/logs/prepare.log" 2>&1 &
    log "preparing ${DEFAULT_SUITES[*]} in the background (log: $CACHE/logs/prepare.log)"
}

run() {
    local suite=$1 root=$CACHE/$1 i ns
    i=$(suite_index "$suite"); ns=sattr-$suite
    [ -e "$root/.sattr-debootstrap" ] || die "$suite: no root; run: $0 prepare $suite"
    ip netns del "$ns" 2>/dev/null || true
    ip netns add "$ns"
    ip link del "sattrv$i" 2>/dev/null || true
    ip link add "sattrv$i" type veth peer name eth0 netns "$ns"
    ip netns exec "$ns" sh -c "ip link set lo up && ip addr add 10.252.$i.2/30 dev eth0 && ip link set eth0 up"
    # The tests as they run on 22.05, minus the ones that need torch in the root.
    # SATTR_VERSIONS_PYTEST narrows the run to some tests (no C tests; no demo unless
    # SATTR_VERSIONS_DEMO=1) while debugging one.
    local tests=${SATTR_VERSIONS_PYTEST:-"tests/integration -m 'cluster and not torch'"} demo="env SATTR_DEMO_FR=0 bash cluster/demo.sh"
    local native="make -s -C spank all test"
    if [ -n "${SATTR_VERSIONS_PYTEST:-}" ]; then
        native="make -s -C spank all probe-harness"
        [ "${SATTR_VERSIONS_DEMO:-0}" = 1 ] || demo=:
    fi
    local inner="set -e; cd /src
        # Stopped, not killed with the namespace: no job is left in slurmctld's saved state.
        trap 'bash cluster/testcluster.sh down >/dev/null 2>&1' EXIT
        phase() { local name=\$1 t=\$SECONDS rc=0; shift; \"\$@\" || rc=\$?; echo \"PHASE \$name: \$((SECONDS - t)) s, exit \$rc\"; return \$rc; }
        phase build+C-tests $native
        # rules/regextree.py against this Python's own regex parser (3.13, 3.14 here; 3.11 in
        # the unit suite): a change in the stdlib's tree is named, and the cluster suite still runs
        tree_rc=0
        phase regex-tree $CBASE/venv/bin/python -m pytest tests/unit/test_rules_regextree.py -q -p no:cacheprovider || tree_rc=\$?
        phase cluster-up bash cluster/testcluster.sh up
        phase demo $demo
        # Not the last command of the script (bash would exec it): PID 1 stays this bash, which
        # reaps the daemons the tests stop.
        phase suite $CBASE/venv/bin/python -m pytest $tests -q -ra -p no:cacheprovider || exit \$?
        exit \$tree_rc"
    local rc=0
    # nsenter keeps this mount namespace's /sys (ip netns exec would remount it without cgroups).
    nsenter --net="/run/netns/$ns" unshare --pid --fork --mount --uts --ipc --propagation private -- \
        bash -c '
            root=$1; hostname "sattr-$2"
            # The root is a mount point of its own, so `unshare -m` inside it (each pretend
            # node has its own mount namespace) can set propagation on "/".
            mount --bind "$root" "$root"
            mount -t proc proc "$root/proc"
            mount --rbind /dev "$root/dev"
            # /dev/shm of its own: the harness names its segment for the job id, and the
            # roots and the host cluster number their jobs alike (a stale sattr-harness-144
            # of another user broke task 144 of a later run)
            mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
            mount --rbind /sys "$root/sys"
            mount -t tmpfs -o mode=755 tmpfs "$root/run"
            mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
            exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
                HOME=/root LANG=C.UTF-8 /bin/bash -c "$3"' sh "$root" "$suite" "$inner" || rc=$?
    ip netns del "$ns" 2>/dev/null || true
    ip link del "sattrv$i" 2>/dev/null || true
    return $rc
}

all() {
    local suites=("$@") s pids=() rc=0 t0
    [ ${#suites[@]} -gt 0 ] || suites=("${DEFAULT_SUITES[@]}")
    for s in "${suites[@]}"; do prepare "$s"; done
    mkdir -p "$CACHE/logs"
    for s in "${suites[@]}"; do
        t0=$(date +%s)
        ( r=0; run "$s" > "$CACHE/logs/$s.log" 2>&1 || r=$?; echo "$r $(( $(date +%s) - t0 ))" > "$CACHE/logs/$s.rc" ) &
        pids+=($!)
    done
    wait "${pids[@]}" || true
    for s in "${suites[@]}"; do
        local r secs; read -r r secs < "$CACHE/logs/$s.rc"
        echo "== $s ($(chroot "$CACHE/$s" slurmd -V)): exit $r in ${secs}s; log $CACHE/logs/$s.log"
        grep -E '^(FAILED|ERROR|PHASE)|[0-9]+ (passed|failed)' "$CACHE/logs/$s.log" | tail -20 || true
        [ "$r" = 0 ] || { rc=1; tail -40 "$CACHE/logs/$s.log"; }
    done
    return $rc
}

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, namespaces)"
case ${1:-} in
    prepare) prepare "$2" ;;
    prepare-all) for s in "${DEFAULT_SUITES[@]}"; do prepare "$s"; done ;;
    start) start ;;
    run) run "$2" ;;
    *) all "$@" ;;
esac
