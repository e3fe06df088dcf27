#!/usr/bin/env bash
# CPU seconds (user, system) of each thread of one command, read from
# /proc every 0.1 s until it exits: which thread bounds a `weir run
# --threads 2` (the reading thread `weir-read` or the engine's).
#
#   bench/thread-cpu.sh weir run CONTRACT --input FILE --output /dev/null --threads 2
set -euo pipefail
"$@" 2>/dev/null &
pid=$!
declare -A last
ticks=$(getconf CLK_TCK)
while kill -0 "$pid" 2>/dev/null; do
    for task in /proc/"$pid"/task/*; do
        stat=$(cat "$task/stat" 2>/dev/null) || continue
        name=$(cat "$task/comm" 2>/dev/null) || continue
        last["$name ${task##*/}"]=$(echo "$stat" | awk '{ print $14, $15 }')
    done
    sleep 0.1
done
wait "$pid" || true
for thread in "${!last[@]}"; do
    read -r user sys <<<"${last[$thread]}"
    awk -v t="$thread" -v u="$user" -v s="$sys" -v k="$ticks" \
        'BEGIN { printf "%s: user %.2f s, system %.2f s (to the last 0.1 s)\n", t, u / k, s / k }'
done
