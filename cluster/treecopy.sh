# Sourced by versions.sh and fresh.sh: the working tree copied into a debootstrap root as a
# newcomer has it: what git tracks plus untracked files it does not ignore, where the tree is a
# git checkout of its own; the tree less what .gitignore names where it is not (a source
# tarball, or one unpacked inside some other repository).

copy_tree() {  # copy_tree REPO DEST: DEST is emptied first
    local repo=$1 dest=$2
    rm -rf "$dest"; mkdir -p "$dest"
    if [ "$(git -C "$repo" rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$repo" && pwd -P)" ]; then
        (cd "$repo" && git ls-files -z -c -o --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$dest"
    else
        local excludes=()
        [ ! -f "$repo/.gitignore" ] || mapfile -t excludes < <(gitignore_excludes < "$repo/.gitignore")
        tar -C "$repo" --anchored --exclude=./.git --no-anchored "${excludes[@]}" -cf - . | tar -xf - -C "$dest"
    fi
}

gitignore_excludes() {  # .gitignore's patterns as tar options, for `tar -C REPO ... .`
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in
            ''|'#'*) ;;
            '!'*) printf 'copy without git: .gitignore re-include %s is not applied\n' "$line" >&2 ;;
            /*) line=${line#/}; printf -- '--anchored\n--exclude=./%s\n--no-anchored\n' "${line%/}" ;;
            *) printf -- '--exclude=%s\n' "${line%/}" ;;
        esac
    done
}
