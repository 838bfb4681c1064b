#!/usr/bin/env bash
# The client libraries' suites, each against a mesh it starts (`assay up --backend openai` on free
# ports against a scripted backend): clients/python (pytest, in a fresh venv, with mypy --strict on
# the package) and clients/typescript (node --test). Uses the `assay` binary at $ASSAY_BIN, else the
# debug build (scripts/test.sh builds it first).
set -euo pipefail
cd "$(dirname "$0")/.."
export ASSAY_BIN="${ASSAY_BIN:-$PWD/target/debug/assay}"
[ -x "$ASSAY_BIN" ] || cargo build -q -p assay-cli --bin assay

echo "== clients/python"
venv="$(mktemp -d)/venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check './clients/python[test,pandas]' mypy types-protobuf
(cd clients/python && timeout 900 "$venv/bin/python" -m pytest -q && "$venv/bin/mypy" --strict -p assay_client)
rm -rf "$(dirname "$venv")"

echo "== clients/typescript"
(cd clients/typescript && npm ci --no-audit --no-fund --silent && npm run --silent build && timeout 900 npm test --silent)
