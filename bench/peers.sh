#!/usr/bin/env bash
# weir and Apache Flink 2.3 (PyFlink) side by side on the same generated files.
#
#   bench/peers.sh [ROUNDS] [WORKLOAD...]
#
# WORKLOAD is payments:N, q7a:N or q5a:N; default: 3 rounds of
# payments:5000000 q7a:2000000 q5a:2000000.
#
# Each workload's file is generated once by the peer's own seeded generator
# (../shared/peers, copied to $PEERS_DIR, default $TMPDIR/weir-peers, since
# that folder may be read-only), with its truth. Then, ROUNDS times, weir and
# Flink run in turn on it:
#   weir:  `weir run bench/{paid_revenue,nexmark_q7a,nexmark_q5a}.toml`, rows and
#          ledger written to files, timed by /usr/bin/time (user + system CPU
#          of the whole process, peak RSS);
#   flink: the peer's run.sh (JVM CPU from job submission to its end, planning
#          and start-up excluded, as the peer reports it).
# Both outputs are judged by the peer's check.py against the same truth (weir's
# rows turned into the peer's CSV by bench/peer_rows.py). One line per run,
# then per workload the ratio of events per CPU-second, weir / Flink, over the
# rounds.
#
# THREADS is weir's --threads (default 1: Flink runs at parallelism 1; both are
# compared per CPU-second).
# WEIR names a weir binary to measure (default: target/release/weir, built).
# Needs Java 17 and PY, a Python with apache-flink==2.3.0:
#   python3 -m venv ENV && ENV/bin/pip install apache-flink==2.3.0
#   PY=ENV/bin/python bench/peers.sh
# Not part of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=${1:-3}
shift || true
workloads=("$@")
[ ${#workloads[@]} -gt 0 ] || workloads=(payments:5000000 q7a:2000000 q5a:2000000)
PY=${PY:?set PY to a python with apache-flink==2.3.0 (python3 -m venv ENV && ENV/bin/pip install apache-flink==2.3.0)}
"$PY" -c 'import pyflink' 2>/dev/null || { echo "PY=$PY has no pyflink; install apache-flink==2.3.0 into it" >&2; exit 2; }
SEED=${SEED:-42}
THREADS=${THREADS:-1}
export SEED PY
peers=${PEERS_DIR:-${TMPDIR:-/tmp}/weir-peers}
shared=${PEERS_SRC:-$root/../shared/peers}
[ -d "$shared" ] || { echo "no peer jobs at $shared; set PEERS_SRC" >&2; exit 2; }
mkdir -p "$peers"
chmod -R u+w "$peers"
cp -r "$shared/flink" "$shared/nexmark" "$peers/"
chmod -R u+w "$peers"
[ -n "${WEIR:-}" ] || cargo build --release -q -p weir
weir=${WEIR:-$root/target/release/weir}
log=$peers/peers-$(date +%Y%m%d-%H%M%S).txt

# events file, truth file, peer folder, contract, row shape of a workload
layout() {
    local kind=${1%%:*} n=${1##*:}
    case $kind in
        payments) echo "$peers/flink/data/events_${n}_s$SEED.jsonl $peers/flink/data/events_${n}_s$SEED.truth.json flink bench/paid_revenue.toml payments" ;;
        q7a | q5a) echo "$peers/nexmark/data/nex_${n}_s$SEED.jsonl $peers/nexmark/data/nex_${n}_s$SEED.truth.json nexmark bench/nexmark_$kind.toml $kind" ;;
        *) echo "unknown workload $1: use payments:N, q7a:N or q5a:N" >&2; exit 2 ;;
    esac
}

generate() {
    local n=${1##*:} ev tr dir _c _s
    read -r ev tr dir _c _s <<<"$(layout "$1")"
    [ -s "$ev" ] && [ -s "$tr" ] && return
    mkdir -p "$(dirname "$ev")"
    echo "# generating $1" >&2
    if [ "$dir" = flink ]; then
        python3 "$peers/flink/gen.py" "$n" "$ev.tmp" "$tr.tmp" --seed "$SEED"
    else
        python3 "$peers/nexmark/nexgen.py" "$n" "$ev.tmp" "$tr.tmp" --seed "$SEED"
    fi
    mv "$ev.tmp" "$ev"
    mv "$tr.tmp" "$tr"
}

run_weir() {
    local kind=${1%%:*} n=${1##*:} ev tr dir contract shape out check
    read -r ev tr dir contract shape <<<"$(layout "$1")"
    out=$peers/weir-out/$kind-$n
    rm -rf "$out"
    mkdir -p "$out"
    /usr/bin/time -f "%e %U %S %M" -o "$out/time" "$weir" run "$contract" --input "$ev" \
        --output "$out/rows.jsonl" --ledger "$out/ledger.jsonl" --threads "$THREADS" 2>"$out/summary"
    python3 bench/peer_rows.py "$out/rows.jsonl" "$out/csv" --shape "$shape" 2>>"$out/summary"
    if [ "$dir" = flink ]; then
        check=$(python3 "$peers/flink/check.py" "$tr" "$out/csv" --events "$ev" 2>/dev/null | sed -n 's/^CHECK //p')
    else
        check=$(python3 "$peers/nexmark/check.py" "$tr" "$out/csv" --query "$kind" 2>/dev/null | sed -n 's/^CHECK //p')
    fi
    read -r wall user sys rss <"$out/time"
    python3 - "$1" "$n" "$wall" "$user" "$sys" "$rss" "$check" "$(wc -l <"$out/ledger.jsonl")" <<'EOF'
import json, sys
w, n, wall, user, sys_s, rss, chk, ledger = sys.argv[1:]
c = json.loads(chk)
n, cpu = int(n), float(user) + float(sys_s)
truth = c.get("truth_groups", c.get("truth_rows"))
ok = c["matched"] == truth and c.get("extra", 0) == 0 and c.get("differing", 0) == 0 and c.get("missing", 0) == 0
print(f"weir {w} wall_s={float(wall):.2f} cpu_s={cpu:.2f} events_per_cpu_s={n / cpu:.0f} "
      f"peak_rss_mb={int(rss) / 1024:.0f} matched={c['matched']}/{truth} ok={ok} ledger_lines={ledger}")
EOF
}

run_flink() {
    local kind=${1%%:*} n=${1##*:} dir line
    read -r _ _ dir _ _ <<<"$(layout "$1")"
    if [ "$dir" = flink ]; then
        line=$("$peers/flink/run.sh" "$n" | tail -1)
    else
        line=$("$peers/nexmark/run.sh" "$kind" "$n" | tail -1)
    fi
    python3 - "$1" "$n" "$line" <<'EOF'
import sys
w, n, line = sys.argv[1], int(sys.argv[2]), sys.argv[3]
f = dict(p.split("=", 1) for p in line.split() if "=" in p)
m = f["matched"].split("/")
ok = f.get("ok", str(m[0] == m[1] and f["differing"] == "0" and f["missing"] == "0" and f["extra"] == "0"))
print(f"flink {w} job_s={f['job_s']} cpu_s={float(f['jvm_cpu_s']):.2f} "
      f"events_per_cpu_s={n / float(f['jvm_cpu_s']):.0f} peak_rss_mb={f['jvm_peak_rss_mb']} "
      f"matched={f['matched']} ok={ok} other_procs_cpu_s={f['other_procs_cpu_s']}")
EOF
}

for w in "${workloads[@]}"; do generate "$w"; done
for r in $(seq "$rounds"); do
    for w in "${workloads[@]}"; do
        echo "# round $r $w $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$log"
        run_weir "$w" | tee -a "$log"
        run_flink "$w" | tee -a "$log"
    done
done
echo "# summary (events per CPU-second, weir / flink, each round's pair)" | tee -a "$log"
python3 - "$log" <<'EOF' | tee -a "$log"
import re, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(weir|flink) (\S+) .*events_per_cpu_s=(\d+).* ok=(\w+)", line)
    if m:
        runs.setdefault(m.group(2), {"weir": [], "flink": [], "ok": True})
        runs[m.group(2)][m.group(1)].append(int(m.group(3)))
        runs[m.group(2)]["ok"] &= m.group(4) == "True"
for w, r in runs.items():
    ratios = sorted(a / b for a, b in zip(r["weir"], r["flink"]))
    med = ratios[len(ratios) // 2]
    print(f"{w}: weir {min(r['weir']):,}-{max(r['weir']):,}, flink {min(r['flink']):,}-{max(r['flink']):,} "
          f"events per CPU-second; ratio {ratios[0]:.1f}-{ratios[-1]:.1f} (median {med:.1f}); "
          f"{'both exact every run' if r['ok'] else 'A RUN DID NOT MATCH THE TRUTH'}")
EOF
echo "# log: $log"
