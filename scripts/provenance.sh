#!/usr/bin/env bash
# The commit a GPU run's rows name, printed on one line (scripts/gpu_check.sh exports it as ATTNBENCH_GIT_COMMIT):
# - ATTNBENCH_GIT_COMMIT when set (set it where the copy's git metadata may be stale: a copied working tree can carry
#   an older .git than its files). Where it names the copy's own HEAD while the tracked files differ from that HEAD,
#   it names a tree these files are not, and it gets "-dirty" (a commit written as `$(git rev-parse HEAD)` on such
#   a copy names the stale metadata's commit, not the files');
# - else the commit from git, "-dirty" when tracked files are modified;
# - else (a copy of the tree without its git metadata) the first line of a file .provenance written beside it;
# - else "unknown".
dirty() { [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; }
if [ -n "${ATTNBENCH_GIT_COMMIT:-}" ]; then
    commit="$ATTNBENCH_GIT_COMMIT"
    if head="$(git rev-parse --short=7 HEAD 2>/dev/null)" && [[ "$commit" != *-dirty ]] \
        && [[ "$commit" == "$head"* || "$head" == "$commit"* ]] && dirty; then
        echo "provenance: ATTNBENCH_GIT_COMMIT=$commit is this copy's git HEAD, but its tracked files differ from it:" \
             "the rows say $commit-dirty (give the commit the files are)" >&2
        commit="$commit-dirty"
    fi
elif git rev-parse --short=12 HEAD >/dev/null 2>&1; then
    commit="$(git rev-parse --short=12 HEAD)"
    dirty && commit="$commit-dirty"
elif [ -f .provenance ]; then
    commit="$(head -n 1 .provenance)"
else
    commit="unknown"
fi
echo "$commit"
