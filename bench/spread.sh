#!/usr/bin/env bash
# One open run spread over 1, 2 and 3 gateways sharing a PostgreSQL store (a throwaway server on
# loopback): N tick records (a checklist generated per input, then the record scored) on the
# scripted OpenAI-compatible backend at a fixed latency per call. `assay up` runs the stages and
# the first gateway; each further gateway is `assay serve gateway` on the same store and stages.
# The run is started on the first gateway; the others claim chunks of it. Per gateway count: the
# run's time, records/s, the bound one gateway's `gateway.concurrency` sets (concurrency / the
# 2-call critical path) times the gateways, each gateway's share of the records, and the calls.
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
CONCURRENCY=${ASSAY__GATEWAY__CONCURRENCY:-$(python3 -c '
import tomllib
print(tomllib.load(open("shared/config/default.toml", "rb"))["gateway"]["concurrency"])')}
python3 bench/anchor/make_records.py "$N" > "$WORK/records.jsonl"
export OPENAI_BASE_URL="$BASE_URL" OPENAI_API_KEY=bench OPENAI_MODEL=scripted ASSAY__CACHE__ENABLED=false RUST_LOG=warn

printf '| gateways | run s | records/s | bound records/s | of bound | per gateway (records done) | model calls | failed |\n'
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
  start=$(date +%s.%N)
  summary=$("$BIN"/assay eval --gateway "http://127.0.0.1:$P_GW" --preset tick --open \
    --data "$WORK/records.jsonl" --json 2>"$WORK/eval-$G.log") || { cat "$WORK/eval-$G.log" >&2; exit 1; }
  end=$(date +%s.%N)
  run_id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["runId"])' "$summary")
  shown=$("$BIN"/assay runs show "$run_id" --gateway "http://127.0.0.1:$P_GW" --json)
  kill "${ROUND[@]}" 2>/dev/null || true
  wait "${ROUND[@]}" 2>/dev/null || true
  python3 - "$N" "$summary" "$shown" "$LATENCY" "$CONCURRENCY" "$G" <<'PY'
import json, sys
n, summary, shown = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
latency, concurrency, g = float(sys.argv[4]) / 1000, int(sys.argv[5]), int(sys.argv[6])
run = shown.get("run", shown)
run_s = summary["pipelineSeconds"]
bound = g * concurrency / (2 * latency)
shares = ", ".join(f"{s['gateway']} {int(s.get('recordsDone', 0))}" for s in run.get("gateways", []))
print(f"| {g} | {run_s:.1f} | {n / run_s:.0f} | {bound:.0f} | {n / run_s / bound:.2f} | {shares} | "
      f"{summary['usage']['calls']} | {summary['failed']} |")
PY
done
