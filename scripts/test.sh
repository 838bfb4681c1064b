#!/usr/bin/env bash
# Run the whole test suite: unit, adapter, per-service (port 0), whole-mesh, external-client
# (Python grpcio) and embedded-model tests, then the Python and TypeScript client libraries'
# suites against a mesh they start. Fetches the embedded models first (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests install a real OpenAI-compatible server too (llama-cpp-python's, from PyPI, built from
# source in about 4-10 minutes the first time, llama.cpp's own llama-server built from the same
# source in about 5 minutes, and LiteLLM's proxy to put in front of the first;
# services/cli/tests/real_backend.rs):
# ASSAY_WITH_LLAMA_CPP=0 leaves it out, and those tests then say they are skipped.
ASSAY_WITH_LLAMA_CPP="${ASSAY_WITH_LLAMA_CPP:-1}" scripts/setup-deps.sh
cargo run -q -p assay-cli --bin assay -- models fetch
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$(pwd)/$target" ;; esac
if [ -z "${ASSAY_LLAMA_CPP_PYTHON:-}" ] && [ -x "$target/llama-venv/bin/python" ]; then
  export ASSAY_LLAMA_CPP_PYTHON="$target/llama-venv/bin/python"
fi
if [ -z "${ASSAY_LLAMA_SERVER:-}" ] && [ -x "$target/llama-server/bin/llama-server" ]; then
  export ASSAY_LLAMA_SERVER="$target/llama-server/bin/llama-server"
fi
if [ -z "${ASSAY_LITELLM:-}" ] && [ -x "$target/litellm-venv/bin/litellm" ]; then
  export ASSAY_LITELLM="$target/litellm-venv/bin/litellm"
fi
if cargo nextest --version >/dev/null 2>&1; then
  # The real-server tests run on their own, after the rest: each keeps both cores busy with a
  # llama-cpp-python server, and the limiter's tests read a queue from latencies (a client starved
  # of CPU by a model next to it reads as a server with more slots than it has).
  status=0
  cargo nextest run --workspace --no-fail-fast -E 'not binary_id(assay-cli::real_backend)' || status=$?
  cargo nextest run --workspace --no-fail-fast -E 'binary_id(assay-cli::real_backend)' || status=$?
  [ "$status" -eq 0 ] || exit "$status"
  cargo test --workspace --doc
else
  cargo test --workspace --no-fail-fast
fi
scripts/test-clients.sh
