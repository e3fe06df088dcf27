#!/usr/bin/env bash
# `weir run` on one thread and on two, alternately, over the same file.
#
#   bench/threads.sh INPUT [ROUNDS] [CONTRACT]
#
# Default: 3 rounds of bench/paid_revenue.toml; rows and ledger written to
# files in $TMPDIR. Prints each run's wall time, events per second, user +
# system CPU, events per CPU-second and peak memory, and checks that both
# settings wrote the same rows and ledger.
set -euo pipefail
cd "$(dirname "$0")/.."
input=$1
rounds=${2:-3}
contract=${3:-bench/paid_revenue.toml}
weir=${WEIR:-target/release/weir}
out=${TMPDIR:-/tmp}/weir-threads
mkdir -p "$out"
events=$(wc -l <"$input")
for r in $(seq "$rounds"); do
    for t in 1 2; do
        /usr/bin/time -f "%e %U %S %M" -o "$out/time" "$weir" run "$contract" --input "$input" \
            --output "$out/rows$t" --ledger "$out/ledger$t" --threads "$t" 2>/dev/null
        read -r wall user sys rss <"$out/time"
        awk -v r="$r" -v t="$t" -v n="$events" -v w="$wall" -v u="$user" -v s="$sys" -v m="$rss" 'BEGIN {
            printf "round %d threads %d: wall %.2f s, %.0f events/s; cpu %.2f s, %.0f events per CPU-second; peak %.0f MiB\n",
                r, t, w, n / w, u + s, n / (u + s), m / 1024 }'
    done
    cmp -s "$out/rows1" "$out/rows2" && cmp -s "$out/ledger1" "$out/ledger2" ||
        { echo "round $r: one thread and two wrote different output" >&2; exit 1; }
done
