#!/usr/bin/env bash
# Every run of several builds of `weir run`, in turn: wall time, CPU
# (user + system) and peak memory of each, for before/after pairs on a
# noisy machine (bench/best-of.sh keeps only each build's best).
#
#   bench/turns.sh CONTRACT INPUT ROUNDS THREADS WEIR_BINARY...
#
# Prints one line a run, then each build's runs sorted.
set -euo pipefail
contract=$1
input=$2
rounds=$3
threads=$4
shift 4
times=$(mktemp)
trap 'rm -f "$times"' EXIT
for _ in $(seq "$rounds"); do
    for b in "$@"; do
        /usr/bin/time -f "%e %U %S %M" -o "$times" "$b" run "$contract" --input "$input" \
            --output /dev/null --threads "$threads" 2>/dev/null
        read -r wall user sys rss <"$times"
        awk -v b="$b" -v w="$wall" -v u="$user" -v s="$sys" -v m="$rss" \
            'BEGIN { printf "%s wall %.2f cpu %.2f peak_mib %.0f\n", b, w, u + s, m / 1024 }'
    done
done | tee /dev/stderr | sort -k1,1 -k5,5n | awk '
    { walls[$1] = walls[$1] " " $3; cpus[$1] = cpus[$1] " " $5 }
    END { for (b in walls) printf "%s\n  wall:%s\n  cpu: %s\n", b, walls[b], cpus[b] }'
