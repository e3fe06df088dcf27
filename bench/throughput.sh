#!/usr/bin/env bash
# Throughput and memory of `weir run` over generated payments.
#
#   bench/throughput.sh [EVENTS...]     default: 5000000
#
# For each size: generates the stream once (`weir gen payments --profile
# bench`: ~150 bytes an event, 10,000 accounts, 5% out of order by up to 20 s,
# 1% exact duplicates), runs bench/paid_revenue.toml over it, and prints the
# user + system CPU time of the whole `weir run` process, events per
# CPU-second and peak resident memory (one thread: `--threads 1`).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p weir
weir=target/release/weir
dir=${TMPDIR:-/tmp}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(5000000)
printf '%-10s %-8s %-8s %-10s %-22s %s\n' events user_s sys_s bytes/ev events_per_cpu_second peak_rss
for n in "${sizes[@]}"; do
    input="$dir/weir-bench-payments-$n.jsonl"
    [ -s "$input" ] || "$weir" gen payments --events "$n" --seed 1 --profile bench --output "$input"
    log=$(mktemp)
    TIMEFORMAT='%U %S'
    { time "$weir" run bench/paid_revenue.toml --input "$input" --output /dev/null --threads 1 2>"$log"; } 2>"$log.time"
    read -r user sys <"$log.time"
    bytes=$(stat -c %s "$input")
    rss=$(grep 'peak memory' "$log" | awk '{print $3, $4}')
    rate=$(awk -v n="$n" -v u="$user" -v s="$sys" 'BEGIN { printf "%.0f", n / (u + s) }')
    per=$(awk -v b="$bytes" -v n="$n" 'BEGIN { printf "%.0f", b / n }')
    printf '%-10s %-8s %-8s %-10s %-22s %s\n' "$n" "$user" "$sys" "$per" "$rate" "$rss"
    rm -f "$log" "$log.time"
done
