#!/usr/bin/env bash
# `make check-fresh`: the README's two commands on a plain Debian 12 server, as a site admin
# has it: a debootstrap bookworm root with only gcc, make, git, python3 and the torch wheel.
# Not part of `make test` (it installs everything from nothing: minutes).
#
# The root gets this working tree as /src. `make deps` runs first with this machine's network
# (apt and pip need it); then `make demo` and `make test` (or the targets given) run in the
# root's own network, PID, mount, UTS and IPC namespaces, as versions.sh runs its suites.
#
#   cluster/fresh.sh [TARGET...]        default: demo and `make test`'s stages but test-versions
#                                       (its debootstraps need the network the namespace lacks)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${SATTR_FRESH_ROOT:-/var/cache/sattr-fresh/bookworm}
MIRROR=${SATTR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHEELS=${TORCH_WHEEL_DIR:-/opt/wheels}
TARGETS=("$@"); [ ${#TARGETS[@]} -gt 0 ] || TARGETS=(demo test-native test-unit test-integration)

# shellcheck source=cluster/rootmounts.sh
. "$REPO/cluster/rootmounts.sh"
# shellcheck source=cluster/treecopy.sh
. "$REPO/cluster/treecopy.sh"

log() { printf 'fresh: %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "needs root"; exit 1; }

root_unmount "$ROOT"  # what a killed run left mounted
if [ ! -e "$ROOT/.sattr-debootstrap" ]; then
    command -v debootstrap >/dev/null || bash "$REPO/cluster/deps.sh" apt
    log "debootstrap bookworm into $ROOT"
    root_remove "$ROOT"; mkdir -p "$(dirname "$ROOT")"
    debootstrap --variant=minbase --include=ca-certificates,gcc,make,git,python3 bookworm "$ROOT" "$MIRROR" >/dev/null
    touch "$ROOT/.sattr-debootstrap"
fi
# The wheel on disk, where pip looks for it here; pip trusts what this machine's pip trusts.
mkdir -p "$ROOT/opt/wheels"; cp -u "$WHEELS"/torch-*.whl "$ROOT/opt/wheels/" 2>/dev/null || true
cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$ROOT/etc/sattr-pip-ca.crt"
# shared/ beside the checkout, as CI lays it (fixtures, workloads).
SHARED=${SLURM_ATTR_SHARED:-$REPO/../shared}
rm -rf "$ROOT/shared"; [ -d "$SHARED" ] && cp -a "$SHARED" "$ROOT/shared"
copy_tree "$REPO" "$ROOT/src"  # without git where the tree is a tarball (cluster/treecopy.sh)
ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
     PIP_FIND_LINKS=/opt/wheels PIP_CERT=/etc/sattr-pip-ca.crt)

inroot() {  # inroot SCRIPT: run in the root, in this network namespace
    root_mount "$ROOT"
    local rc=0
    chroot "$ROOT" /usr/bin/env -i "${ENV[@]}" /bin/bash -c "$1" || rc=$?
    root_unmount "$ROOT"
    return $rc
}

t0=$(date +%s)
log "make deps (apt + venv) in the root"
# The test cluster's hooks venv and the pyslurm wheel too: `up` makes them, but inside the
# namespace there is no PyPI (pyslurm's Cython comes from it); a real machine's `up` has it.
inroot "cd /src && make deps && bash cluster/testcluster.sh venv && bash cluster/pyslurm.sh build >/dev/null"
log "deps: $(( $(date +%s) - t0 )) s"

ns=sattr-fresh
ip netns del $ns 2>/dev/null || true; ip link del sattrvf 2>/dev/null || true
ip netns add $ns
ip link add sattrvf type veth peer name eth0 netns $ns
ip netns exec $ns sh -c "ip link set lo up && ip addr add 10.252.9.2/30 dev eth0 && ip link set eth0 up"
rc=0
for target in "${TARGETS[@]}"; do
    t1=$(date +%s)
    nsenter --net=/run/netns/$ns unshare --pid --fork --mount --uts --ipc --propagation private -- \
        bash -c '
            root=$1; hostname sattr-fresh
            mount --bind "$root" "$root"
            mount -t proc proc "$root/proc"; mount --rbind /dev "$root/dev"; mount --rbind /sys "$root/sys"
            mount -t tmpfs -o mode=755 tmpfs "$root/run"; mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
            shift
            chroot "$root" /usr/bin/env -i "$@" /bin/bash -c "cd /src && make '"$target"' || exit \$?"' \
        sh "$ROOT" "${ENV[@]}" || rc=$?
    log "make $target: exit $rc after $(( $(date +%s) - t1 )) s"
    [ $rc = 0 ] || break
done
ip netns del $ns 2>/dev/null || true; ip link del sattrvf 2>/dev/null || true
exit $rc
