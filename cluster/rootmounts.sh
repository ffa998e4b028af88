# Sourced by versions.sh and fresh.sh: the host's /proc, /dev and /sys bound into a debootstrap
# root, and undone. The /dev bind is the host's own devtmpfs, so an `rm -rf` of a root that
# still has it mounted deletes the host's device nodes (it happened here: a cache dir moved
# aside while a killed run's mounts were still in it, then removed). Every removal of a root
# therefore goes through root_remove: unmount first, never cross into another filesystem.

root_mount() {  # the host's /proc, /dev and /sys in root $1, for chroot (apt, builds, tests)
    mount -t proc proc "$1/proc"
    mount --rbind /dev "$1/dev"; mount --make-rslave "$1/dev"
    mount --rbind /sys "$1/sys"; mount --make-rslave "$1/sys"
}

root_unmount() {  # everything mounted at or below $1 in this mount namespace, deepest first
    local root m
    root=$(realpath -m "$1")
    awk -v r="$root" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/mounts | sort -r -u |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
}

root_remove() {  # rm -rf of a root, and of nothing mounted into it
    local root
    root=$(realpath -m "$1")
    root_unmount "$root"
    if awk -v r="$root" 'index($2, r "/") == 1 {found = 1} END {exit !found}' /proc/mounts; then
        printf 'refusing to remove %s: something is still mounted below it\n' "$root" >&2
        return 1
    fi
    rm -rf --one-file-system "$root"
}
