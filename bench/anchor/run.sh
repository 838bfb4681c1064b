#!/usr/bin/env bash
# Benchmark against the anchor: autochecklist 0.2.3 (PyPI) and Assay evaluate the same records against
# the same scripted OpenAI-compatible backend with a fixed latency per call. Prints wall times and
# ratios per preset.
#
#   bench/anchor/run.sh [records=100] [latency_ms=50] [presets="tick rlcf_direct"]
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-100}
LATENCY=${2:-50}
PRESETS=${3:-"tick rlcf_direct"}
WORK=$(mktemp -d)
trap 'kill "${BACKEND_PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

VENV=${ASSAY_BENCH_VENV:-target/bench-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet "autochecklist==0.2.3"

cargo build --release --quiet -p assay-testkit --bin assay-scripted-llm -p assay-cli --bin assay

target/release/assay-scripted-llm --latency-ms "$LATENCY" > "$WORK/backend.url" 2> "$WORK/backend.log" &
BACKEND_PID=$!
for _ in $(seq 100); do [ -s "$WORK/backend.url" ] && break; sleep 0.05; done
BASE_URL=$(head -1 "$WORK/backend.url")
echo "scripted backend at $BASE_URL, ${LATENCY} ms per call; $N records"

python3 bench/anchor/make_records.py "$N" > "$WORK/records.jsonl"

for preset in $PRESETS; do
  anchor=$("$VENV/bin/python" bench/anchor/autochecklist_run.py --base-url "$BASE_URL" --preset "$preset" --data "$WORK/records.jsonl")
  anchor_s=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["wall_s"])' "$anchor")
  start=$(date +%s.%N)
  summary=$(OPENAI_BASE_URL="$BASE_URL" OPENAI_API_KEY=bench OPENAI_MODEL=scripted ASSAY__CACHE__ENABLED=false \
    target/release/assay eval --backend openai --preset "$preset" --data "$WORK/records.jsonl" \
    --out "$WORK/assay-$preset.jsonl" --json 2>/dev/null)
  end=$(date +%s.%N)
  assay_s=$(python3 -c "print(round($end - $start, 3))")
  python3 - "$preset" "$anchor" "$summary" "$assay_s" <<'PY'
import json, sys
preset, anchor, summary, assay_s = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), float(sys.argv[4])
print(json.dumps({
    "preset": preset,
    "records": anchor["records"],
    "autochecklist_s": anchor["wall_s"],
    "assay_s": assay_s,
    "ratio": round(anchor["wall_s"] / assay_s, 1),
    "assay_calls": summary.get("calls"),
    "assay_failed": summary.get("failed"),
    "autochecklist_scored": anchor["scored"],
}))
PY
done
