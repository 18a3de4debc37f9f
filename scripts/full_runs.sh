#!/usr/bin/env bash
# The full-size reproductions, run seed by seed with every finished cell committed to the repository, so
# a run that stops (a machine that goes away) resumes on any machine from what is committed.
#
#   bash scripts/full_runs.sh [TARGET ...]        (default: every target, cheapest first)
#
# Each target runs in a scratch results directory (NTPREF_SCRATCH, default /tmp/ntpref-full) seeded with
# the committed cells of docs/results/*/full/cells/; after each seed the new cells are copied back and
# committed (only those files). When a target's planned seeds are done, its summary and figures are
# rebuilt from the committed cells and committed too (tests/test_committed_results.py holds every target
# whose full grid is committed to its summary), by
#
#   ntpref reproduce TARGET --full --summarize-only --out docs/results
#
# The verdicts in docs/reproductions.md that quote those numbers are then for a person to update.
# Runs at nice 19 with NTPREF_WORKERS worker processes (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=${NTPREF_SCRATCH:-/tmp/ntpref-full}
workers=${NTPREF_WORKERS:-2}
# target:seeds to reach (an empty count: the target's whole full grid in one run)
plan=(twostage: generalization: joint: optimizers: approx: approx-redraw: ntk:5 init:5 length-kernel:10 width:10 projsgd:10 length:10 rnn:20)
[ $# -gt 0 ] && plan=("$@")

sync_in() {  # committed cells -> scratch (every target: some copy cells of another)
    for dir in docs/results/*/full/cells; do
        [ -d "$dir" ] || continue
        target=$(basename "$(dirname "$(dirname "$dir")")")
        mkdir -p "$scratch/$target/full/cells"
        cp -n "$dir"/*.npz "$scratch/$target/full/cells/" 2>/dev/null || true
    done
}

commit_cells() {  # scratch cells of $1 -> repository, one commit of only those files
    local target=$1 message=$2 dest="docs/results/$1/full/cells"
    mkdir -p "$dest"
    cp -u "$scratch/$target/full/cells"/*.npz "$dest/" 2>/dev/null || true
    commit_paths "$message" "$dest"
}

commit_summary() {  # the summary and figures of $1 rebuilt from its committed cells, committed
    local target=$1
    nice -n 19 ntpref reproduce "$target" --full --summarize-only --out docs/results -q >/dev/null
    commit_paths "reproduce $target: full-size summary and figures rebuilt from the committed cells" \
        "docs/results/$target/full"
}

commit_paths() {  # one commit of only the path $2 (message $1)
    local message=$1 dest=$2
    for attempt in $(seq 1 60); do   # the developer's own git commands may hold the index lock
        if git add -- "$dest" 2>/dev/null; then
            if git diff --cached --quiet -- "$dest"; then return 0; fi
            if git commit --quiet -m "$message" --only -- "$dest" 2>/dev/null; then return 0; fi
        fi
        sleep 5
    done
    echo "full_runs: could not commit $dest" >&2
}

sync_in
for item in "${plan[@]}"; do
    target=${item%%:*}
    seeds=${item#*:}
    [ "$seeds" = "$item" ] && seeds=""
    if [ -z "$seeds" ]; then
        nice -n 19 ntpref reproduce "$target" --full --workers "$workers" --out "$scratch" -q >/dev/null
        commit_cells "$target" "reproduce $target: full-size cells"
    else
        for n in $(seq 1 "$seeds"); do
            nice -n 19 ntpref reproduce "$target" --full --seeds "$n" --workers "$workers" --out "$scratch" -q >/dev/null
            commit_cells "$target" "reproduce $target: full-size cells, seeds 1..$n complete (and every other cell finished since the last commit)"
        done
    fi
    commit_summary "$target"
    echo "full_runs: $target done $(date -u +%FT%TZ)"
done
