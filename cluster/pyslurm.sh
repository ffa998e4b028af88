#!/usr/bin/env bash
# The pyslurm wheel that matches this machine's Slurm, built once from ../shared/vendor/ and cached.
#
# PySlurm has one release line per Slurm major.minor (PyPI carries only 25.11; older lines are
# branches, vendored as pyslurm-<line>.x.tar.gz). A line works only with the Slurm it was built
# for, and the Cython build takes minutes, so the wheel is cached per machine, keyed by the
# installed Slurm's full version and the Python tag: a second run (a second `testcluster.sh up`)
# finds it and builds nothing.
#
#   cluster/pyslurm.sh build   [PYTHON]     build unless cached; print the wheel's path
#   cluster/pyslurm.sh path    [PYTHON]     print the cached wheel's path; exit 1 when not built
#   cluster/pyslurm.sh install PYTHON...    build unless cached, install into each interpreter's
#                                           venv (skipped when that wheel is already installed)
#   cluster/pyslurm.sh line                 the pyslurm release line for this Slurm; exit 3: none
#
# PYTHON defaults to Debian's /usr/bin/python3 (what every venv of this project is made from).
# Exit 3: no vendored release line for this Slurm (e.g. 26.05): callers use the CLI backend.
# Needs libslurm-dev (headers) and gcc; Cython 0.29.37 comes from the configured pip index.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENDOR=${SATTR_VENDOR:-$REPO/../shared/vendor}
CACHE=${SATTR_PYSLURM_CACHE:-/var/cache/sattr-pyslurm}
INC=${SLURM_INCLUDE_DIR:-/usr/include}

log() { printf 'pyslurm.sh: %s\n' "$*" >&2; }
die() { log "$1"; exit "${2:-1}"; }

slurm_full() {  # the installed Slurm's version, e.g. 22.05.8 (slurmd -V needs no config)
    local v
    v=$(slurmd -V 2>/dev/null | sed -n 's/^slurm[-a-z]* \([0-9][0-9.]*\).*/\1/p' | head -1)
    [ -n "$v" ] || v=$(sed -n 's/^#define SLURM_VERSION_STRING "\([0-9.]*\)".*/\1/p' "$INC/slurm/slurm_version.h" 2>/dev/null)
    [ -n "$v" ] || die "no Slurm found (slurmd -V, $INC/slurm/slurm_version.h)"
    echo "$v"
}

headers_version() {  # major.minor of the headers the wheel would be built against
    local hex; hex=$(sed -n 's/^#define SLURM_VERSION_NUMBER \(0x[0-9a-fA-F]*\).*/\1/p' "$INC/slurm/slurm_version.h" 2>/dev/null)
    [ -n "$hex" ] || return 1
    printf '%02d.%02d\n' $(( (hex >> 16) & 0xff )) $(( (hex >> 8) & 0xff ))
}

release_line() {  # 22.05.8 -> 22.5 (pyslurm's own numbering: its branches are 22.5.x, 24.11.x)
    local mm=${1%.*}
    echo "$((10#${mm%%.*})).$((10#${mm#*.}))"
}

pytag() { "$1" -c 'import sys; print("cp%d%d" % sys.version_info[:2])'; }

wheel_dir() { echo "$CACHE/slurm-$(slurm_full)-$(pytag "$1")"; }

cached_wheel() { ls "$(wheel_dir "$1")"/pyslurm-*.whl 2>/dev/null | head -1 || true; }

libdir_for() {  # pyslurm 22.5 links libslurm.so; 23.x and later link libslurmfull.so
    local d
    for d in ${SLURM_LIB_DIR:-} /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/slurm-wlm /usr/lib64 /usr/lib64/slurm /usr/lib/slurm; do
        [ -n "$d" ] && [ -e "$d/$1" ] && { echo "$d"; return 0; }
    done
    return 1
}

build() {
    local py=$1 full line tarball out src benv lib
    full=$(slurm_full)
    line=$(release_line "$full")
    tarball=$VENDOR/pyslurm-$line.x.tar.gz
    [ -f "$tarball" ] || die "no pyslurm release line for Slurm $full ($tarball missing): the CLI backend is used" 3
    [ "$(headers_version || true)" = "${full%.*}" ] \
        || die "headers in $INC/slurm are $(headers_version || echo missing), the installed Slurm is $full (install libslurm-dev)"
    out=$(wheel_dir "$py")
    mkdir -p "$CACHE"
    # One builder per machine: a second caller waits and then finds the wheel.
    exec 8>"$CACHE/.lock"
    flock 8
    local have; have=$(cached_wheel "$py")
    if [ -n "$have" ]; then echo "$have"; return 0; fi
    case $line in 22.5) lib=$(libdir_for libslurm.so) ;; *) lib=$(libdir_for libslurmfull.so) ;; esac \
        || die "no libslurm to link against (libslurm-dev)"
    # A build venv of its own: pyslurm 22.5 pins setuptools==59.2 for build isolation, which the
    # index here lacks; any setuptools with Cython < 3 builds it (Cython 3 breaks the 22.5 line).
    # Later lines take Cython 3, the first with wheels for Python 3.13+ (trixie, sid).
    local cython='Cython>=3.0'
    [ "$line" != 22.5 ] || cython='Cython==0.29.37'
    benv=$CACHE/buildenv-$(pytag "$py")-$line
    if ! "$benv/bin/python" -c 'import Cython, setuptools, wheel, packaging' 2>/dev/null; then
        rm -rf "$benv"
        "$py" -m venv "$benv"
        # (build runs inside $(...), where set -e does not reach: a failure must be said here)
        "$benv/bin/python" -m pip install -q --disable-pip-version-check "$cython" 'setuptools>=64' wheel packaging >&2 \
            || die "cannot install the build tools ($cython, setuptools, wheel) from the pip index"
    fi
    # Global, not local: the EXIT trap runs after this function's locals are gone.
    tmp=$(mktemp -d "$CACHE/build.XXXXXX")
    trap 'rm -rf "${tmp:-}"' EXIT
    tar -xzf "$tarball" -C "$tmp"
    src=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d -name 'pyslurm*' | head -1)
    [ -d "$src" ] || die "$tarball holds no pyslurm source dir"
    log "building pyslurm $line.x for Slurm $full ($(pytag "$py")); takes minutes (Cython), once per machine"
    local t0=$SECONDS
    SLURM_LIB_DIR=$lib SLURM_INCLUDE_DIR=$INC PYSLURM_BUILD_JOBS=$(nproc) \
        "$benv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
        -w "$tmp/wheels" "$src" >&2 || die "building pyslurm failed"
    mkdir -p "$out"
    local whl; whl=$(ls "$tmp"/wheels/pyslurm-*.whl | head -1)
    # Renamed into place: a reader never sees a half-copied wheel.
    cp "$whl" "$out/.partial" && mv "$out/.partial" "$out/$(basename "$whl")"
    log "built $(basename "$whl") in $((SECONDS - t0)) s -> $out"
    echo "$out/$(basename "$whl")"
}

install_into() {  # install_into PYTHON: the cached wheel into that interpreter's venv, once
    local py=$1 whl prefix sum
    whl=$(build "$py")
    prefix=$("$py" -c 'import sys; print(sys.prefix)')
    sum=$(sha256sum "$whl" | cut -c1-16)
    # Checked without importing it: pyslurm's import needs a readable slurm.conf.
    if [ "$(cat "$prefix/.pyslurm-wheel" 2>/dev/null)" = "$sum" ] && "$py" -c 'import importlib.metadata as m; m.version("pyslurm")' 2>/dev/null; then
        return 0
    fi
    "$py" -m pip install -q --disable-pip-version-check --no-deps --no-index --force-reinstall "$whl" >&2
    echo "$sum" > "$prefix/.pyslurm-wheel"
    chmod -R a+rX "$prefix/lib" 2>/dev/null || true
    log "installed $(basename "$whl") into $prefix"
}

cmd=${1:-build}; shift || true
case $cmd in
    build) build "${1:-/usr/bin/python3}" ;;
    path) w=$(cached_wheel "${1:-/usr/bin/python3}"); [ -n "$w" ] || exit 1; echo "$w" ;;
    install)
        [ $# -ge 1 ] || die "usage: $0 install PYTHON..."
        for p in "$@"; do install_into "$p"; done ;;
    line)
        l=$(release_line "$(slurm_full)")
        [ -f "$VENDOR/pyslurm-$l.x.tar.gz" ] || die "no pyslurm release line for Slurm $(slurm_full)" 3
        echo "$l" ;;
    *) die "usage: $0 build|path|install|line [PYTHON...]" ;;
esac
