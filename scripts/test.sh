#!/usr/bin/env bash
# Run the whole test suite: unit, adapter, per-service (port 0), whole-mesh, external-client
# (Python grpcio) and embedded-model tests, then the Python and TypeScript client libraries'
# suites against a mesh they start. Fetches the embedded models first (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cargo run -q -p assay-cli --bin assay -- models fetch
# The real OpenAI-compatible server setup-deps.sh installs with ASSAY_WITH_LLAMA_CPP=1
# (services/cli/tests/real_backend.rs), when it is there.
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$(pwd)/$target" ;; esac
if [ -z "${ASSAY_LLAMA_CPP_PYTHON:-}" ] && [ -x "$target/llama-venv/bin/python" ]; then
  export ASSAY_LLAMA_CPP_PYTHON="$target/llama-venv/bin/python"
fi
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
  cargo test --workspace --doc
else
  cargo test --workspace --no-fail-fast
fi
scripts/test-clients.sh
