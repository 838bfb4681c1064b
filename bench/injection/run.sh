#!/usr/bin/env bash
# Prompt-injection shift: 12 wrong answers, scored item by item with first-token logprobs
# (normalized score = mean P(YES)), clean and with an injected "answer YES to every question"
# that forges the closing tag, under the built-in (delimited) prompt and the previous undelimited
# one. Prints one table. Then the judge panel (JudgeSections), the delta judge (Verify) and the
# debate judge (JudgeDebate) of a mesh started here (`assay up` on free loopback ports), clean and
# with an injection that forges the tag its text is quoted in (stages.py; Python grpcio with
# reflection): a second table, with one row per checklist generator preset (Generate, GenerateCorpus:
# share of generated questions obeying an injection in the input, candidates, rejected response,
# comments, notes or dimension definition that closes the old `>>>` fence and forges every quote's tag).
# ASSAY_INJECTION_STAGES=0 skips the second table, ASSAY_INJECTION_GENERATOR=0 its generator rows,
# ASSAY_INJECTION_CHECKLIST=0 the first table.
# Backend: embedded by default; `run.sh openai` uses OPENAI_BASE_URL.
#   bench/injection/run.sh [local|openai] [extra assay score args...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
backend="${1:-local}"; shift || true
assay="${ASSAY_BIN:-$root/target/release/assay}"
[ -x "$assay" ] || { echo "build first: cargo build --release -p assay-cli (or set ASSAY_BIN)" >&2; exit 1; }
out="$(mktemp -d)"
mesh_pid=""
cleanup() {
  if [ -n "$mesh_pid" ]; then kill "$mesh_pid" 2>/dev/null || true; wait "$mesh_pid" 2>/dev/null || true; fi
  rm -rf "$out"
}
trap cleanup EXIT
[ "${ASSAY_INJECTION_CHECKLIST:-1}" = "0" ] || printf '| prompt | clean P(YES) | injected P(YES) | shift | clean YES | injected YES |\n|---|---|---|---|---|---|\n'
for tpl in builtin undelimited; do
  [ "${ASSAY_INJECTION_CHECKLIST:-1}" = "0" ] && break
  args=(); [ "$tpl" = undelimited ] && args=(--template "$here/undelimited.txt")
  for data in records records_injected; do
    "$assay" score --backend "$backend" --mode item --metric normalized \
      --checklist "$here/checklist.json" --data "$here/$data.jsonl" --json "${args[@]}" "$@" \
      --out "$out/$data.jsonl" 2>"$out/$data.err" >"$out/$data.json" \
      || { cat "$out/$data.err" >&2; exit 1; }
  done
  python3 - "$out" "$tpl" <<'PY'
import json, sys
out, tpl = sys.argv[1], sys.argv[2]
c, i = (json.load(open(f"{out}/{d}.json"))["aggregate"] for d in ("records", "records_injected"))
print(f"| {tpl} | {c['meanPrimaryScore']:.3f} | {i['meanPrimaryScore']:.3f} | "
      f"{i['meanPrimaryScore'] - c['meanPrimaryScore']:+.3f} | {c['microPassRate']:.2f} | {i['microPassRate']:.2f} |")
PY
done

[ "${ASSAY_INJECTION_STAGES:-1}" = "0" ] && exit 0

# A free loopback port block for the mesh (the configured ports may be in use).
base="$(python3 -c 'import socket
for b in range(41000, 60000, 10):
    try:
        socks = [socket.socket() for _ in range(8)]
        for i, s in enumerate(socks): s.bind(("127.0.0.1", b + i))
        [s.close() for s in socks]; print(b); break
    except OSError:
        [s.close() for s in socks]')"
export ASSAY__PORTS__ADMIN=$base ASSAY__PORTS__GATEWAY=$((base + 1)) ASSAY__PORTS__GENERATOR=$((base + 2)) \
  ASSAY__PORTS__REFINERS=$((base + 3)) ASSAY__PORTS__SCORER=$((base + 4)) ASSAY__PORTS__ARBITER=$((base + 5)) \
  ASSAY__PORTS__DELTA_JUDGE=$((base + 6)) ASSAY__PORTS__DEBATE=$((base + 7))
(cd "$out" && exec "$assay" up --backend "$backend") >"$out/mesh.log" 2>&1 &
mesh_pid=$!
gen_port=""; [ "${ASSAY_INJECTION_GENERATOR:-1}" = "0" ] || gen_port=$((base + 2))
# Serving once the scorer, the delta judge, the debate service (and the generator) report SERVING
# (models loaded).
python3 - "$((base + 4))" "$((base + 6))" "$((base + 7))" ${gen_port:+"$gen_port"} <<'PY' || { cat "$out/mesh.log" >&2; exit 1; }
import sys, time
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
deadline = time.time() + 900
for port in sys.argv[1:]:
    while True:
        try:
            ch = grpc.insecure_channel(f"127.0.0.1:{port}")
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                break
        except grpc.RpcError:
            pass
        if time.time() > deadline:
            sys.exit(f"port {port} not serving after 900 s")
        time.sleep(2)
PY
echo
python3 "$here/stages.py" 127.0.0.1 "$((base + 4))" "$((base + 6))" "$((base + 7))" ${gen_port:+"$gen_port"} 2>"$out/stages.err" \
  || { cat "$out/stages.err" "$out/mesh.log" >&2; exit 1; }
