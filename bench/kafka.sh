#!/usr/bin/env bash
# Events per second through Kafka to Postgres with one and two `weir serve`
# workers, and what the Postgres checkpoint costs per event.
#
#   bench/kafka.sh [EVENTS]            default: 500000
#   WEIR=OTHER/weir bench/kafka.sh     the same with another build
#   KAFKA_CONFIG='"queued.min.messages" = "500000"' bench/kafka.sh
#                                      with librdkafka settings ([kafka.config] lines)
#
# Starts tansu (the Kafka-API broker of the tests, in memory) on a free port,
# generates EVENTS payments (`weir gen payments --profile bench`), produces
# them to a 4-partition topic keyed by account_id (`weir produce --kafka`),
# then, for 1 and then 2 workers (each run a fresh consumer group and a fresh
# Postgres schema), starts the workers with bench/paid_revenue.toml and
# times how long they take to read and checkpoint every event. Postgres:
# WEIR_TEST_POSTGRES (default host=127.0.0.1 user=postgres dbname=test).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-500000}
pg=${WEIR_TEST_POSTGRES:-host=127.0.0.1 user=postgres dbname=test}
# WEIR=path/to/weir runs that build instead of this tree's (to compare two builds).
if [ -n "${WEIR:-}" ]; then
    weir=$WEIR
else
    cargo build --release -q -p weir
    weir=$PWD/target/release/weir
fi
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

kport=$(port)
tansu broker --listener-url "tcp://127.0.0.1:$kport" --advertised-listener-url "tcp://127.0.0.1:$kport" \
    --storage-engine memory://tansu/ >"$dir/tansu.log" 2>&1 &
pids+=($!)
sleep 1

input="$dir/payments.jsonl"
"$weir" gen payments --events "$n" --seed 1 --profile bench --output "$input"
# The topic is created with 4 partitions by the first worker's weir.toml; create it first by a short-lived worker.
mkdir -p "$dir/contracts"
cp bench/paid_revenue.toml "$dir/contracts/"
config() { # $1: group and schema suffix
    cat <<TOML
idle_timeout = "1h"
[topics.payments]
partitions = 4
key = "account_id"
[kafka]
brokers = "127.0.0.1:$kport"
group = "bench-$1"
[postgres]
url = "$pg"
schema = "weir_bench_$1"
TOML
    # KAFKA_CONFIG: extra [kafka.config] lines, to try librdkafka settings.
    if [ -n "${KAFKA_CONFIG:-}" ]; then printf '[kafka.config]\n%s\n' "$KAFKA_CONFIG"; fi
}
wait_all() { # waits until the offsets checkpointed in Postgres sum to $1, polling every 200 ms from one
              # process (the workers' status first, then Postgres); prints the sum of checkpoint
              # seconds and their count. Args: N SCHEMA URL|TOKEN...
    python3 - "$pg" "$@" <<'PY'
import json, subprocess, sys, time, urllib.request
pg, n, schema = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def get(base, token, path):
    return urllib.request.urlopen(urllib.request.Request(base + path, headers={"Authorization": "Bearer " + token}))
def stored():
    sql = f"SELECT coalesce(sum(next_offset), 0) FROM {schema}.partitions WHERE pipeline = 'paid_revenue'"
    out = subprocess.run(["psql", "-XAtq", pg, "-c", sql], capture_output=True, text=True)
    return int(out.stdout.strip() or 0)
read_all = False
while True:
    offsets, seconds, count = 0, 0.0, 0
    try:
        for arg in sys.argv[4:]:
            base, token = arg.split("|")
            s = json.load(get(base, token, "/v1/pipelines/paid_revenue/status"))
            offsets += sum(p["next_offset"] for p in s["partitions"])
            for line in get(base, token, "/metrics").read().decode().splitlines():
                if line.startswith("weir_checkpoint_duration_seconds_sum"):
                    seconds += float(line.rsplit(" ", 1)[1])
                if line.startswith("weir_checkpoint_duration_seconds_count"):
                    count += int(float(line.rsplit(" ", 1)[1]))
    except OSError:
        offsets = 0
    # Read is not published: the time ends when the last offset is checkpointed.
    read_all = read_all or offsets >= n
    if read_all and stored() >= n:
        print(seconds, count)
        break
    time.sleep(0.2)
PY
}
start_worker() { # $1: suffix, $2: worker number; sets $base (URL|reader token) and $pid
    local p token
    p=$(port)
    config "$1" >"$dir/weir-$1.toml"
    token=$("$weir" token create --data "$dir/data-$1-$2" --role reader --name bench --pipeline '*' 2>/dev/null)
    "$weir" serve --data "$dir/data-$1-$2" --contracts "$dir/contracts" --config "$dir/weir-$1.toml" \
        --listen "127.0.0.1:$p" >"$dir/worker-$1-$2.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 1 100); do
        curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$p/v1/pipelines" >/dev/null 2>&1 && break
        sleep 0.1
    done
    base="http://127.0.0.1:$p|$token"
}
psql_run() { psql -q "$pg" -c "$1" >/dev/null 2>&1 || true; }
# A schema and the one of its typed views for BI tools (`SCHEMA_bi`).
drop_schema() { psql_run "DROP SCHEMA IF EXISTS $1 CASCADE; DROP SCHEMA IF EXISTS $1_bi CASCADE"; }

# Produce once (a worker creates the topic with 4 partitions first).
drop_schema weir_bench_setup
start_worker setup 1
setup=$pid
started=$(date +%s.%N)
"$weir" produce --topic payments --kafka "127.0.0.1:$kport" --key account_id "$input" 2>"$dir/produce.log"
ended=$(date +%s.%N)
kill -TERM "$setup" 2>/dev/null || true
drop_schema weir_bench_setup
echo "produced $n events to Kafka: $(python3 -c "print(round($n / ($ended - $started)))") events/s ($(tail -1 "$dir/produce.log"))"

tansu_pid=${pids[0]}
# CPU seconds of every postgres process on this machine (the server's backends included).
pg_cpu() { ps -C postgres -o times= | awk '{s += $1} END {print s + 0}'; }
printf '%-8s %-10s %-10s %-16s %-12s %-24s %-12s %-12s %s\n' workers events seconds events_per_second checkpoints checkpoint_us_per_event weir_cpu_s tansu_cpu_s postgres_cpu_s
for workers in 1 2; do
    suffix="w${workers}_$$"
    drop_schema "weir_bench_$suffix"
    bases=()
    started_pids=()
    t0=$(date +%s.%N)
    tansu_before=$(ps -o times= -p "$tansu_pid" | tr -d ' ')
    pg_before=$(pg_cpu)
    for w in $(seq 1 "$workers"); do
        start_worker "$suffix" "$w"
        bases+=("$base")
        started_pids+=("$pid")
    done
    read -r seconds count < <(wait_all "$n" "weir_bench_$suffix" "${bases[@]}")
    t1=$(date +%s.%N)
    cpu=0
    for p in "${started_pids[@]}"; do cpu=$((cpu + $(ps -o times= -p "$p" | tr -d ' '))); done
    tansu_cpu=$(( $(ps -o times= -p "$tansu_pid" | tr -d ' ') - tansu_before ))
    pg_used=$(( $(pg_cpu) - pg_before ))
    python3 -c "
n, t, s, c = $n, $t1 - $t0, $seconds, $count
print(f'{$workers:<8} {n:<10} {t:<10.2f} {n / t:<16.0f} {c:<12} {s / n * 1e6:<24.1f} {$cpu:<12} {$tansu_cpu:<12} {$pg_used}')"
    for p in "${started_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    drop_schema "weir_bench_$suffix"
done
