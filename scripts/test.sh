#!/usr/bin/env bash
# Run the whole test suite: unit, adapter, per-service (port 0), whole-mesh, external-client
# (Python grpcio) and embedded-model tests, then the Python and TypeScript client libraries'
# suites against a mesh they start. Fetches the embedded models first (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cargo run -q -p assay-cli --bin assay -- models fetch
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
  cargo test --workspace --doc
else
  cargo test --workspace --no-fail-fast
fi
scripts/test-clients.sh
