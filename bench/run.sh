#!/usr/bin/env bash
# One benchmark, one table, one machine: Assay against autochecklist 0.2.3 (PyPI) on the same
# scripted OpenAI-compatible backend (fixed latency per call), Assay against the critical-path
# limit of each preset, the gateway hop's overhead, and the embedded embedder's throughput.
#
#   bench/run.sh [records=100] [latency_ms=50]
#   ASSAY_BENCH_BIN=DIR bench/run.sh ...   use the `assay` and `assay-scripted-llm` binaries in DIR
#                                          (no build): two builds side by side, e.g. before and after
#
# Pipeline time is from the RunPipeline call to the run's last event (no process or mesh start);
# wall time is the whole `assay eval` process. "Fresh" is `assay eval` starting its own mesh (a cold
# process: new connections, a new heap, the backend's adaptive limit from its start); "running" is
# `assay eval --gateway` against a mesh already up (`assay up`), as a service is used: one warm-up
# run per preset, then the median of three. The critical path of tick and rlcf_direct is two
# model calls (a generation, then the scoring of a record: one batch call for tick, the items in
# parallel for rlcf_direct).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100}
LATENCY=${2:-50}
WORK=$(mktemp -d)
trap 'kill "${UP_PID:-}" "${BACKEND_PID:-}" 2>/dev/null || true; rm -rf "$WORK"' EXIT

VENV=${ASSAY_BENCH_VENV:-target/bench-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet "autochecklist==0.2.3"
BIN=${ASSAY_BENCH_BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release --quiet -p assay-testkit --bin assay-scripted-llm -p assay-cli --bin assay
  BIN=${CARGO_TARGET_DIR:-target}/release
fi

"$BIN"/assay-scripted-llm --latency-ms "$LATENCY" > "$WORK/backend.url" 2> "$WORK/backend.log" &
BACKEND_PID=$!
for _ in $(seq 100); do [ -s "$WORK/backend.url" ] && break; sleep 0.05; done
BASE_URL=$(head -1 "$WORK/backend.url")
python3 bench/anchor/make_records.py "$N" > "$WORK/records.jsonl"

rows="$WORK/rows.jsonl"
: > "$rows"
for preset in tick rlcf_direct; do
  anchor=$("$VENV/bin/python" bench/anchor/autochecklist_run.py --base-url "$BASE_URL" --preset "$preset" --data "$WORK/records.jsonl")
  start=$(date +%s.%N)
  summary=$(OPENAI_BASE_URL="$BASE_URL" OPENAI_API_KEY=bench OPENAI_MODEL=scripted ASSAY__CACHE__ENABLED=false \
    ASSAY__GATEWAY__STORE=:memory: "$BIN"/assay eval --backend openai --preset "$preset" \
    --data "$WORK/records.jsonl" --out "$WORK/assay-$preset.jsonl" --json 2>/dev/null)
  end=$(date +%s.%N)
  python3 - "$preset" "$anchor" "$summary" "$start" "$end" "$LATENCY" >> "$rows" <<'PY'
import json, sys
preset, anchor, summary = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
wall = float(sys.argv[5]) - float(sys.argv[4])
critical = 2 * float(sys.argv[6]) / 1000
print(json.dumps({"preset": preset, "anchor_s": anchor["wall_s"], "anchor_scored": anchor["scored"],
                  "wall_s": wall, "pipeline_s": summary["pipelineSeconds"], "calls": summary["usage"]["calls"],
                  "failed": summary["failed"], "critical_s": critical}))
PY
done

# The same evaluations on a running mesh.
read -r P_GW P_GEN P_REF P_SC P_ARB P_DJ P_DEB <<< "$(python3 -c '
import socket
socks = [socket.socket() for _ in range(7)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
OPENAI_BASE_URL="$BASE_URL" OPENAI_API_KEY=bench OPENAI_MODEL=scripted ASSAY__CACHE__ENABLED=false \
  ASSAY__GATEWAY__STORE=:memory: ASSAY__PORTS__GATEWAY=$P_GW ASSAY__PORTS__GENERATOR=$P_GEN \
  ASSAY__PORTS__REFINERS=$P_REF ASSAY__PORTS__SCORER=$P_SC ASSAY__PORTS__ARBITER=$P_ARB \
  ASSAY__PORTS__DELTA_JUDGE=$P_DJ ASSAY__PORTS__DEBATE=$P_DEB \
  "$BIN"/assay up --backend openai > "$WORK/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 200); do grep -q "every service SERVING" "$WORK/up.log" && break; sleep 0.05; done
warm="$WORK/warm.jsonl"
: > "$warm"
for preset in tick rlcf_direct; do
  for run in 0 1 2 3; do
    # The whole process timed too (start to exit), as a user runs it against a running mesh.
    start=$(date +%s.%N)
    "$BIN"/assay eval --gateway "http://127.0.0.1:$P_GW" --preset "$preset" --data "$WORK/records.jsonl" \
      --out "$WORK/warm-$preset.jsonl" --json 2>/dev/null > "$WORK/warm-summary.json"
    end=$(date +%s.%N)
    python3 -c "import json, sys; d = json.load(open('$WORK/warm-summary.json')); print(json.dumps({'preset': '$preset', 'run': $run, 'pipeline_s': d['pipelineSeconds'], 'wall_s': $end - $start, 'failed': d['failed']}))" >> "$warm"
  done
done
kill "$UP_PID" && wait "$UP_PID" 2>/dev/null || true
UP_PID=

# The in-process benches build from this checkout: skipped when timing prebuilt binaries.
if [ -z "${ASSAY_BENCH_BIN:-}" ]; then
  CALLS=${CALLS:-500} cargo bench --quiet -p assay-tests --bench mesh_overhead 2>/dev/null > "$WORK/overhead.txt" || true
  if "$BIN"/assay models fetch >/dev/null 2>&1; then
    cargo bench --quiet -p assay-embedded --bench local -- embed 2>/dev/null > "$WORK/embed.txt" || true
  fi
fi

python3 - "$rows" "$WORK/overhead.txt" "$WORK/embed.txt" "$N" "$LATENCY" "$warm" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
warm = {}
for l in open(sys.argv[6]):
    w = json.loads(l)
    if w["run"] > 0:
        warm.setdefault(w["preset"], []).append(w)
def read(path):
    try:
        return open(path).read()
    except OSError:
        return ""
overhead, embed, n, latency = read(sys.argv[2]), read(sys.argv[3]), sys.argv[4], sys.argv[5]
print(f"| measure ({n} records, {latency} ms per model call) | Assay | reference | ratio |")
print("|---|---|---|---|")
for r in rows:
    p = r["preset"]
    print(f"| {p}: pipeline time vs autochecklist 0.2.3 ({r['anchor_scored']} scored) | {r['pipeline_s']:.3f} s "
          f"| {r['anchor_s']:.3f} s | {r['anchor_s'] / r['pipeline_s']:.1f}x faster |")
    print(f"| {p}: whole `assay eval` process vs autochecklist | {r['wall_s']:.3f} s | {r['anchor_s']:.3f} s "
          f"| {r['anchor_s'] / r['wall_s']:.1f}x faster |")
    print(f"| {p}: pipeline time vs critical path (2 calls), fresh `assay eval` | {r['pipeline_s']:.3f} s "
          f"| {r['critical_s']:.3f} s | {r['pipeline_s'] / r['critical_s']:.2f}x the limit |")
    if warm.get(p):
        w = statistics.median(x["pipeline_s"] for x in warm[p])
        failed = sum(x["failed"] for x in warm[p])
        print(f"| {p}: pipeline time vs critical path (2 calls), running mesh (median of 3, {failed} failed) "
              f"| {w:.3f} s | {r['critical_s']:.3f} s | {w / r['critical_s']:.2f}x the limit |")
        ww = statistics.median(x["wall_s"] for x in warm[p])
        print(f"| {p}: whole `assay eval --gateway` process, running mesh (median of 3) vs autochecklist "
              f"| {ww:.3f} s | {r['anchor_s']:.3f} s | {r['anchor_s'] / ww:.1f}x faster, {ww / r['critical_s']:.2f}x the limit |")
    print(f"| {p}: model calls, failed records | {r['calls']}, {r['failed']} | | |")
m = re.search(r"scorer direct.*?p50\s+([\d.]+) ms", overhead)
g = re.search(r"gateway -> scorer.*?p50\s+([\d.]+) ms", overhead)
if m and g:
    print(f"| gateway hop (Evaluate -> scorer vs scorer direct, p50, 0 ms backend) | {float(g.group(1)):.3f} ms "
          f"| {float(m.group(1)):.3f} ms | +{float(g.group(1)) - float(m.group(1)):.3f} ms per hop |")
e = re.search(r"batch1 (\d+) sent/s, batch32 (\d+) sent/s", embed)
if e:
    print(f"| embedded MiniLM embeddings, batch 32 (batch 1) | {e.group(2)} sentences/s ({e.group(1)}) | 200 sentences/s goal "
          f"| {int(e.group(2)) / 200:.2f}x the goal |")
PY
