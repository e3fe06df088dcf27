#!/usr/bin/env bash
# Least user + system CPU time of `weir run` over several runs, for comparing
# builds on a noisy machine.
#
#   bench/best-of.sh INPUT [RUNS] [WEIR_BINARY...]
#
# INPUT: a file from `weir gen payments --profile bench`; default binary:
# target/release/weir. Runs the binaries in turn, RUNS rounds (default 4),
# over CONTRACT (default bench/paid_revenue.toml), with RUN_ARGS added
# (e.g. RUN_ARGS="--threads 1"; builds before --threads refuse it). Prints each binary's best
# and, on standard error, every run.
set -euo pipefail
cd "$(dirname "$0")/.."
input=$1
runs=${2:-4}
shift $(( $# >= 2 ? 2 : 1 ))
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/weir)
events=$(wc -l <"$input")
contract=${CONTRACT:-bench/paid_revenue.toml}
for _ in $(seq "$runs"); do
    for b in "${bins[@]}"; do
        TIMEFORMAT='%U %S'
        t=$({ time "$b" run "$contract" --input "$input" --output /dev/null ${RUN_ARGS:-} 2>/dev/null; } 2>&1)
        echo "$b $t" | tee /dev/stderr
    done
done | awk -v n="$events" '{ c = $2 + $3; if (!($1 in best) || c < best[$1]) best[$1] = c }
    END { for (b in best) printf "%s: best %.3f s CPU, %.0f events per CPU-second\n", b, best[b], n / best[b] }'
