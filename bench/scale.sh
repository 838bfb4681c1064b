#!/usr/bin/env bash
# Runs at production scale: one open run of N tick records (a checklist generated per distinct
# input, then the record scored) through a running mesh (`assay up`, SQLite store on disk) on the
# scripted OpenAI-compatible backend at a fixed latency per call, for each N given. Per size: the
# mesh's peak RSS (VmHWM of the `assay up` process), the run's time and records/s against the
# bound that gateway.concurrency sets (concurrency / the 2-call critical path), the model calls
# served, and the store's bytes per record.
#
#   bench/scale.sh [sizes="10000 100000 1000000"] [latency_ms=50]
#   ASSAY_BENCH_BIN=DIR bench/scale.sh ...   use prebuilt `assay` and `assay-scripted-llm` in DIR
#
# Every size runs on a fresh mesh and a fresh store; `assay eval --open` streams the file into one
# open run (AppendRecords) and writes --out from the paged results (ListRunResults).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${1:-"10000 100000 1000000"}
LATENCY=${2:-50}
WORK=$(mktemp -d)
trap 'kill "${UP_PID:-}" "${BACKEND_PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

BIN=${ASSAY_BENCH_BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release --quiet -p assay-testkit --bin assay-scripted-llm -p assay-cli --bin assay
  BIN=${CARGO_TARGET_DIR:-target}/release
fi

"$BIN"/assay-scripted-llm --latency-ms "$LATENCY" > "$WORK/backend.url" 2> "$WORK/backend.log" &
BACKEND_PID=$!
for _ in $(seq 100); do [ -s "$WORK/backend.url" ] && break; sleep 0.05; done
BASE_URL=$(head -1 "$WORK/backend.url")
# gateway.concurrency as shipped (shared/config/default.toml), unless ASSAY__GATEWAY__CONCURRENCY sets it.
CONCURRENCY=${ASSAY__GATEWAY__CONCURRENCY:-$(python3 -c '
import tomllib
print(tomllib.load(open("shared/config/default.toml", "rb"))["gateway"]["concurrency"])')}

printf '| records | run s | records/s | bound records/s | of bound | model calls | failed | peak RSS MB | store bytes/record |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for N in $SIZES; do
  python3 bench/anchor/make_records.py "$N" > "$WORK/records.jsonl"
  rm -f "$WORK"/runs.db*
  read -r P_GW P_GEN P_REF P_SC P_ARB P_DJ P_DEB P_ADM <<< "$(python3 -c '
import socket
socks = [socket.socket() for _ in range(8)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
  OPENAI_BASE_URL="$BASE_URL" OPENAI_API_KEY=bench OPENAI_MODEL=scripted ASSAY__CACHE__ENABLED=false \
    ASSAY__GATEWAY__STORE="$WORK/runs.db" ASSAY__PORTS__GATEWAY=$P_GW ASSAY__PORTS__GENERATOR=$P_GEN \
    ASSAY__PORTS__REFINERS=$P_REF ASSAY__PORTS__SCORER=$P_SC ASSAY__PORTS__ARBITER=$P_ARB \
    ASSAY__PORTS__DELTA_JUDGE=$P_DJ ASSAY__PORTS__DEBATE=$P_DEB ASSAY__PORTS__ADMIN=$P_ADM RUST_LOG=warn \
    "$BIN"/assay up --backend openai > "$WORK/up.log" 2>&1 &
  UP_PID=$!
  for _ in $(seq 200); do grep -q "every service SERVING" "$WORK/up.log" && break; sleep 0.05; done
  start=$(date +%s.%N)
  summary=$("$BIN"/assay eval --gateway "http://127.0.0.1:$P_GW" --preset tick --open \
    --data "$WORK/records.jsonl" --out "$WORK/out.jsonl" --json 2>"$WORK/eval.log") || { cat "$WORK/eval.log" >&2; exit 1; }
  end=$(date +%s.%N)
  rss_kb=$(awk '/VmHWM/ {print $2}' "/proc/$UP_PID/status")
  kill "$UP_PID" && wait "$UP_PID" 2>/dev/null || true
  UP_PID=
  store_bytes=$(du -cb "$WORK"/runs.db* | tail -1 | cut -f1)
  lines=$(wc -l < "$WORK/out.jsonl")
  python3 - "$N" "$summary" "$start" "$end" "$LATENCY" "$CONCURRENCY" "$rss_kb" "$store_bytes" "$lines" <<'PY'
import json, sys
n, summary = int(sys.argv[1]), json.loads(sys.argv[2])
wall = float(sys.argv[4]) - float(sys.argv[3])
latency, concurrency = float(sys.argv[5]) / 1000, int(sys.argv[6])
rss_mb, store, lines = int(sys.argv[7]) / 1024, int(sys.argv[8]), int(sys.argv[9])
run_s = summary["pipelineSeconds"]
bound = concurrency / (2 * latency)
assert lines == n, f"{lines} result lines for {n} records"
print(f"| {n} | {run_s:.1f} | {n / run_s:.0f} | {bound:.0f} | {n / run_s / bound:.2f} | "
      f"{summary['usage']['calls']} | {summary['failed']} | {rss_mb:.0f} | {store / n:.0f} |")
PY
done
