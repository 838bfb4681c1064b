#!/usr/bin/env bash
# Faults at default settings, as a user meets them: `assay up` on an OpenAI-compatible server
# (bench/faults/server.py) that refuses 20% of attempts with 429, 10% with 503 and never answers
# 5%, then `assay debate` over examples/problems.jsonl (50 problems) through the gateway; once
# fault-free, then once per seed with faults. Prints the wall time of each run.
#
#   bench/faults/run.sh [latency_ms=200] [seeds="7 8 9 10 11"]
#
# Uses $ASSAY, else the newer of target/release/assay and target/debug/assay (an old release
# binary is not what the tree says). The mesh takes its fixed ports (50051-50057, admin 50050);
# the server listens on 18000.
set -euo pipefail
cd "$(dirname "$0")/../.."
LATENCY=${1:-200}
SEEDS=${2:-7 8 9 10 11}
if [ -z "${ASSAY:-}" ]; then
  ASSAY=target/debug/assay
  if [ target/release/assay -nt "$ASSAY" ]; then ASSAY=target/release/assay; fi
fi
[ -x "$ASSAY" ] || { echo "build the CLI first: cargo build -p assay-cli" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'kill "${UP_PID:-}" "${SERVER_PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

run() { # faults seed label
  FAULTS=$1 SEED=$2 LATENCY_MS=$LATENCY python3 bench/faults/server.py 18000 > "$WORK/server-$3.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 100); do curl -sf -o /dev/null http://127.0.0.1:18000/v1/models && break; sleep 0.1; done
  OPENAI_BASE_URL=http://127.0.0.1:18000/v1 OPENAI_API_KEY=sk-bench ASSAY__CACHE__ENABLED=false \
    ASSAY__GATEWAY__STORE=:memory: "$ASSAY" up --backend openai --model m > "$WORK/up-$3.log" 2>&1 &
  UP_PID=$!
  for _ in $(seq 1 300); do grep -q "mesh is up" "$WORK/up-$3.log" && break; sleep 0.1; done
  grep -q "mesh is up" "$WORK/up-$3.log" || { cat "$WORK/up-$3.log" >&2; exit 1; }
  local start end rc=0
  start=$(date +%s.%N)
  "$ASSAY" debate --data examples/problems.jsonl --gateway http://127.0.0.1:50051 --out "$WORK/out-$3.jsonl" \
    2> "$WORK/debate-$3.err" || rc=$?
  end=$(date +%s.%N)
  printf '%-10s exit %s  %6.2f s  %s\n' "$3" "$rc" "$(echo "$end - $start" | bc)" \
    "$(grep -o 'progress: [0-9]*/[0-9]* ([0-9]* failed)' "$WORK/debate-$3.err" | tail -1)"
  kill "$UP_PID"; wait "$UP_PID" 2>/dev/null || true
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
}

echo "assay debate, 50 problems, ${LATENCY} ms a call ($ASSAY)"
run 0 0 clean
for seed in $SEEDS; do run 1 "$seed" "seed-$seed"; done
