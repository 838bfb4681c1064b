#!/usr/bin/env bash
# Faults at default settings, as a user meets them: `assay up` on an OpenAI-compatible server
# (assay-scripted-llm: schema-conforming replies after a fixed latency) that answers 20% of
# attempts 429, 10% 5xx and never answers 5%, then, through the gateway, `assay debate` over
# examples/problems.jsonl (50 problems) and `assay eval --preset tick` over N generated records;
# each once fault-free, then once per seed with faults. Prints the wall time of each run.
#
#   bench/faults/run.sh [latency_ms=200] [seeds="7 8 9 10 11"] [records=200]
#
# Builds the debug binaries it uses (`cargo build -p assay-cli -p assay-testkit`). The mesh takes
# its fixed ports (50051-50057, admin 50050).
set -euo pipefail
cd "$(dirname "$0")/../.."
LATENCY=${1:-200}
SEEDS=${2:-7 8 9 10 11}
N=${3:-200}
cargo build --quiet -p assay-cli --bin assay -p assay-testkit --bin assay-scripted-llm
ASSAY=target/debug/assay
WORK=$(mktemp -d)
trap 'kill "${UP_PID:-}" "${SERVER_PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
python3 bench/anchor/make_records.py "$N" > "$WORK/records.jsonl"

run() { # what label server-args...
  local what=$1 label=$2
  shift 2
  target/debug/assay-scripted-llm --latency-ms "$LATENCY" "$@" > "$WORK/url" 2> "$WORK/server-$label.log" &
  SERVER_PID=$!
  for _ in $(seq 100); do [ -s "$WORK/url" ] && break; sleep 0.05; done
  OPENAI_BASE_URL=$(head -1 "$WORK/url") OPENAI_API_KEY=sk-bench ASSAY__CACHE__ENABLED=false \
    ASSAY__GATEWAY__STORE=:memory: "$ASSAY" up --backend openai --model m > "$WORK/up-$label.log" 2>&1 &
  UP_PID=$!
  for _ in $(seq 1 300); do grep -q "mesh is up" "$WORK/up-$label.log" && break; sleep 0.1; done
  grep -q "mesh is up" "$WORK/up-$label.log" || { cat "$WORK/up-$label.log" >&2; exit 1; }
  local start end rc=0
  start=$(date +%s.%N)
  if [ "$what" = debate ]; then
    "$ASSAY" debate --data examples/problems.jsonl --gateway http://127.0.0.1:50051 --out "$WORK/out.jsonl" \
      2> "$WORK/run-$label.err" || rc=$?
  else
    "$ASSAY" eval --preset tick --data "$WORK/records.jsonl" --gateway http://127.0.0.1:50051 \
      --out "$WORK/out.jsonl" 2> "$WORK/run-$label.err" || rc=$?
  fi
  end=$(date +%s.%N)
  kill "$UP_PID"; wait "$UP_PID" 2>/dev/null || true
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
  printf '%-7s %-10s exit %s  %6.2f s  %s lines  %s\n' "$what" "$label" "$rc" "$(echo "$end - $start" | bc)" \
    "$(wc -l < "$WORK/out.jsonl")" "$(grep -o 'faults:.*' "$WORK/server-$label.log" || true)"
  rm -f "$WORK/url"
}

echo "${LATENCY} ms a call; faults 20% 429, 10% 5xx, 5% unanswered"
for what in debate eval; do
  run "$what" clean
  for seed in $SEEDS; do run "$what" "seed-$seed" --faults 0.2,0.1,0.05 --seed "$seed"; done
done
