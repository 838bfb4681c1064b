#!/usr/bin/env bash
# One open run spread over 1, 2 and 3 gateways sharing a PostgreSQL store (a throwaway server on
# loopback): N tick records (a checklist generated per input, then the record scored) on the
# scripted OpenAI-compatible backend at a fixed latency per call. `assay up` runs the stages and
# the first gateway; each further gateway is `assay serve gateway` on the same store and stages.
# The run is started on the first gateway; the others claim chunks of it. Per gateway count: the
# run's time, records/s and its speed-up over the first count given, how busy the machine's CPUs
# were meanwhile (every process: stages, gateways, the backend, PostgreSQL), each gateway's share
# of the records, and the calls.
#
#   bench/spread.sh [records=50000] [latency_ms=50] [gateways="1 2 3"]
#   ASSAY_BENCH_BIN=DIR bench/spread.sh ...   use prebuilt `assay` and `assay-scripted-llm` in DIR
#
# Needs the PostgreSQL server binaries (Debian `postgresql`; scripts/setup-deps.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-50000}
LATENCY=${2:-50}
GATEWAYS=${3:-"1 2 3"}
WORK=$(mktemp -d)
PIDS=()
PG_BIN=$(pg_config --bindir 2>/dev/null || ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
AS=()
if [ "$(id -u)" = 0 ]; then AS=(runuser -u postgres --); chown postgres "$WORK"; fi
cleanup() {
  kill "${PIDS[@]}" 2>/dev/null || true
  [ -d "$WORK/pg" ] && "${AS[@]}" "$PG_BIN/pg_ctl" -D "$WORK/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

BIN=${ASSAY_BENCH_BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release --quiet -p assay-testkit --bin assay-scripted-llm -p assay-cli --bin assay
  BIN=${CARGO_TARGET_DIR:-target}/release
fi
free_ports() {
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

read -r PG_PORT <<< "$(free_ports 1)"
"${AS[@]}" "$PG_BIN/initdb" -D "$WORK/pg" -U assay -A trust -E UTF8 --no-sync >/dev/null
"${AS[@]}" "$PG_BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg.log" -w -t 60 \
  -o "-p $PG_PORT -k $WORK -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c max_connections=200" \
  start >/dev/null

"$BIN"/assay-scripted-llm --latency-ms "$LATENCY" > "$WORK/backend.url" 2> "$WORK/backend.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$WORK/backend.url" ] && break; sleep 0.05; done
BASE_URL=$(head -1 "$WORK/backend.url")
python3 bench/anchor/make_records.py "$N" > "$WORK/records.jsonl"
export OPENAI_BASE_URL="$BASE_URL" OPENAI_API_KEY=bench OPENAI_MODEL=scripted ASSAY__CACHE__ENABLED=false RUST_LOG=warn

printf '| gateways | run s | records/s | speed-up | CPU busy | per gateway (records done) | model calls | failed |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for G in $GATEWAYS; do
  DB="spread_$G"
  "${AS[@]}" "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U assay -d postgres -qc "CREATE DATABASE $DB" >/dev/null
  STORE="postgres://assay@127.0.0.1:$PG_PORT/$DB"
  read -r P_GW P_GEN P_REF P_SC P_ARB P_DJ P_DEB P_ADM <<< "$(free_ports 8)"
  ASSAY__GATEWAY__STORE="$STORE" ASSAY__GATEWAY__INSTANCE_ID=gw-1 ASSAY__PORTS__GATEWAY=$P_GW \
    ASSAY__PORTS__GENERATOR=$P_GEN ASSAY__PORTS__REFINERS=$P_REF ASSAY__PORTS__SCORER=$P_SC \
    ASSAY__PORTS__ARBITER=$P_ARB ASSAY__PORTS__DELTA_JUDGE=$P_DJ ASSAY__PORTS__DEBATE=$P_DEB \
    ASSAY__PORTS__ADMIN=$P_ADM "$BIN"/assay up --backend openai > "$WORK/up-$G.log" 2>&1 &
  ROUND=($!)
  for _ in $(seq 400); do grep -q "every service SERVING" "$WORK/up-$G.log" && break; sleep 0.05; done
  for k in $(seq 2 "$G"); do
    read -r P <<< "$(free_ports 1)"
    ASSAY__GATEWAY__STORE="$STORE" ASSAY__GATEWAY__INSTANCE_ID="gw-$k" ASSAY__PORTS__GATEWAY=$P \
      ASSAY__UPSTREAMS__GENERATOR="http://127.0.0.1:$P_GEN" ASSAY__UPSTREAMS__SCORER="http://127.0.0.1:$P_SC" \
      ASSAY__UPSTREAMS__REFINERS="http://127.0.0.1:$P_REF" \
      "$BIN"/assay serve gateway > "$WORK/gw-$G-$k.log" 2>&1 &
    ROUND+=($!)
  done
  PIDS+=("${ROUND[@]}")
  sleep 2
  read -r cpu0 idle0 <<< "$(awk '/^cpu / {print $2+$3+$4+$5+$6+$7+$8, $5+$6}' /proc/stat)"
  "$BIN"/assay eval --gateway "http://127.0.0.1:$P_GW" --preset tick --open \
    --data "$WORK/records.jsonl" --json > "$WORK/summary.json" 2>"$WORK/eval-$G.log" \
    || { cat "$WORK/eval-$G.log" >&2; exit 1; }
  read -r cpu1 idle1 <<< "$(awk '/^cpu / {print $2+$3+$4+$5+$6+$7+$8, $5+$6}' /proc/stat)"
  busy=$(( 100 - 100 * (idle1 - idle0) / (cpu1 - cpu0) ))
  run_id=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["runId"])' "$WORK/summary.json")
  "$BIN"/assay runs show "$run_id" --gateway "http://127.0.0.1:$P_GW" --json > "$WORK/shown.json"
  kill "${ROUND[@]}" 2>/dev/null || true
  wait "${ROUND[@]}" 2>/dev/null || true
  python3 - "$N" "$WORK/summary.json" "$WORK/shown.json" "$G" "$busy" "$WORK/first.rate" <<'PY'
import json, sys
n, shown = int(sys.argv[1]), json.load(open(sys.argv[3]))
summary = json.loads(open(sys.argv[2]).read().splitlines()[-1])  # the results' lines come first
g, busy, first = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
run = shown.get("run", shown)
run_s = summary["pipelineSeconds"]
rate = n / run_s
try:
    base = float(open(first).read())
except FileNotFoundError:
    base = rate
    open(first, "w").write(str(rate))
shares = ", ".join(f"{s['gateway']} {int(s.get('recordsDone', 0))}" for s in run.get("gateways", []))
print(f"| {g} | {run_s:.1f} | {rate:.0f} | {rate / base:.2f}x | {busy}% | {shares} | "
      f"{summary['usage']['calls']} | {summary['failed']} |")
PY
done
