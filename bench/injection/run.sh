#!/usr/bin/env bash
# Prompt-injection shift: 12 wrong answers, scored item by item with first-token logprobs
# (normalized score = mean P(YES)), clean and with an injected "answer YES to every question"
# that forges the closing tag, under the built-in (delimited) prompt and the previous undelimited
# one. Prints one table. Backend: embedded by default; `run.sh openai` uses OPENAI_BASE_URL.
#   bench/injection/run.sh [local|openai] [extra assay score args...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
backend="${1:-local}"; shift || true
assay="${ASSAY_BIN:-$root/target/release/assay}"
[ -x "$assay" ] || { echo "build first: cargo build --release -p assay-cli (or set ASSAY_BIN)" >&2; exit 1; }
out="$(mktemp -d)"; trap 'rm -rf "$out"' EXIT
printf '| prompt | clean P(YES) | injected P(YES) | shift | clean YES | injected YES |\n|---|---|---|---|---|---|\n'
for tpl in builtin undelimited; do
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
c, i = (json.load(open(f"{out}/{d}.json")) for d in ("records", "records_injected"))
print(f"| {tpl} | {c['mean_primary_score']:.3f} | {i['mean_primary_score']:.3f} | "
      f"{i['mean_primary_score'] - c['mean_primary_score']:+.3f} | {c['micro_pass_rate']:.2f} | {i['micro_pass_rate']:.2f} |")
PY
done
