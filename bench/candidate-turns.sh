#!/usr/bin/env bash
# `weir bench candidate` for several builds in turn, one line a run, then
# each build's build times and ratios sorted: the candidate's figure swings
# with the machine, so a before/after pair needs its runs interleaved.
#
#   bench/candidate-turns.sh EVENTS ROUNDS [--early] WEIR_BINARY...
set -euo pipefail
events=$1
rounds=$2
shift 2
early=()
if [ "${1:-}" = "--early" ]; then
    early=(--early)
    shift
fi
for _ in $(seq "$rounds"); do
    for b in "$@"; do
        # The servers' own lines are left out; a failed run stops the rounds and says which build.
        if ! line=$("$b" bench candidate --events "$events" "${early[@]}" 2>/dev/null | grep '^candidate'); then
            echo "$b: weir bench candidate failed; run it alone to see why" >&2
            exit 1
        fi
        # "... version 2 built in 21.54 s, ... weir run on the same events 7.19 s, ...; ratio 0.33"
        awk -v b="$b" '{
            for (i = 1; i <= NF; i++) {
                if ($i == "built" && $(i + 1) == "in") built = $(i + 2)
                if ($i == "events" && $(i - 1) == "same") run = $(i + 1)
                if ($i == "ratio") ratio = $(i + 1)
            }
            printf "%s built %s run %s ratio %s\n", b, built, run, ratio
        }' <<<"$line"
    done
done | tee /dev/stderr | sort -k1,1 -k3,3n | awk '
    { builds[$1] = builds[$1] " " $3; ratios[$1] = ratios[$1] " " $7 }
    END { for (b in builds) printf "%s\n  built (s):%s\n  ratio:    %s\n", b, builds[b], ratios[b] }'
