#!/usr/bin/env bash
# Builds the repository's Dockerfile with podman, with nothing pulled from any registry, then checks
# the image. Needs root and scripts/setup-containers.sh (podman + runc, debootstrap).
#
#   scripts/image.sh                  base images if missing, `podman build`, checks (tag assay:0.1.0)
#   scripts/image.sh --bases          only the two local base images
#   scripts/image.sh --check-image    only the checks, on an image already built
#   scripts/image.sh --prebuilt DIR   the Dockerfile's runtime stage only, verbatim, with the
#                                     `assay` binary from DIR (e.g. target/debug) instead of its
#                                     builder stage, then the checks (CI: the test build already
#                                     made it; a second, release build would add half an hour)
#
# The Dockerfile's two base images are made locally under the names its FROM lines use (podman
# resolves a short name to localhost/<name> first, and the build runs with --pull=never):
#   localhost/debian:bookworm-slim   `debootstrap --variant=minbase bookworm` (apt only, ~120 MB):
#                                    the runtime stage installs its own packages on it;
#   localhost/rust:1.95-bookworm     the same rootfs plus a C/C++ toolchain from Debian (gcc, g++,
#                                    make, libc6-dev, pkg-config: what the official rust image's
#                                    buildpack-deps base provides) and the host's rustup toolchain
#                                    of the same Rust version (rustc, cargo, std; no docs), at the
#                                    official image's paths (/usr/local/cargo, /usr/local/rustup).
# On a machine that can reach Docker Hub the same Dockerfile builds on the official images.
#
# Environment:
#   ASSAY_IMAGE             tag to build (default assay:0.1.0)
#   ASSAY_CARGO_CACHE=DIR   mount DIR as the builder's cargo registry (downloads kept between
#                           builds; the build itself is still clean); unset: a clean registry
#   ASSAY_DEBIAN_MIRROR     debootstrap mirror (default: the host's apt mirror, else deb.debian.org)
#   ASSAY_REBUILD_BASES=1   remake the base images
#   ASSAY_EXTRA_CA_DIR      extra CA certificates (*.crt) the builder trusts (default
#                           /usr/local/share/ca-certificates: the host's own, e.g. an egress proxy's)
# Prints the build time, the image size and each check; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${ASSAY_IMAGE:-assay:0.1.0}
RUST_VERSION=1.95.0
BUILD_BASE=localhost/rust:1.95-bookworm
RUNTIME_BASE=localhost/debian:bookworm-slim
SUITE=bookworm
# What the official rust:*-bookworm image has that the build uses (its base is buildpack-deps).
BUILDER_DEBS=gcc,g++,libc6-dev,make,pkg-config,ca-certificates,git,curl,xz-utils
PATH_ENV=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

mode=all
case "${1:-}" in
  "") ;;
  --bases) mode=bases ;;
  --check-image) mode=check ;;
  --prebuilt)
    mode=prebuilt
    PREBUILT=${2:-}
    [ -n "$PREBUILT" ] && [ -d "$PREBUILT" ] || { echo "usage: scripts/image.sh --prebuilt DIR (a directory with the built assay binary)" >&2; exit 2; }
    ;;
  *) echo "usage: scripts/image.sh [--bases | --check-image | --prebuilt DIR]" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
  echo "image.sh: run as root (debootstrap, rootful podman)" >&2
  exit 1
fi
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "image.sh: no $tool; run scripts/setup-containers.sh" >&2; exit 1; }
done

mirror() {
  if [ -n "${ASSAY_DEBIAN_MIRROR:-}" ]; then echo "$ASSAY_DEBIAN_MIRROR"; return; fi
  local m
  m=$(grep -hs -m1 -E '^URIs: .*/debian/?$' /etc/apt/sources.list.d/*.sources | awk '{print $2}' || true)
  [ -n "$m" ] || m=$(grep -hs -m1 -E '^deb .*/debian/? bookworm' /etc/apt/sources.list | awk '{print $2}' || true)
  echo "${m:-http://deb.debian.org/debian}"
}

scratch=""
cleanup() { if [ -n "$scratch" ]; then rm -rf "$scratch"; fi; }
trap cleanup EXIT

have_image() { podman image exists "$1"; }

# make_bases [runtime]: both base images, or only the runtime stage's.
make_bases() {
  local only=${1:-}
  if [ "${ASSAY_REBUILD_BASES:-}" != 1 ] && have_image "$RUNTIME_BASE" && { [ "$only" = runtime ] || have_image "$BUILD_BASE"; }; then
    echo "bases: $RUNTIME_BASE${only:+ (runtime only)}${only:- and $BUILD_BASE} exist (ASSAY_REBUILD_BASES=1 remakes them)"
    return
  fi
  scratch=$(mktemp -d "${TMPDIR:-/var/tmp}/assay-bases-XXXXXX")
  local m t0
  m=$(mirror)
  t0=$SECONDS
  echo "bases: debootstrap --variant=minbase $SUITE from $m"
  debootstrap --variant=minbase "$SUITE" "$scratch/runtime" "$m" >"$scratch/runtime.log" 2>&1 \
    || { tail -20 "$scratch/runtime.log" >&2; exit 1; }
  # The slim images carry no apt lists, docs or caches.
  rm -rf "$scratch/runtime/var/lib/apt/lists/"* "$scratch/runtime/var/cache/apt/"*.bin \
    "$scratch/runtime/usr/share/doc/"* "$scratch/runtime/usr/share/man/"* "$scratch/runtime/usr/share/info/"*
  tar --numeric-owner -C "$scratch/runtime" -c . \
    | podman import -q --change "ENV PATH=$PATH_ENV" --change 'CMD ["bash"]' - "$RUNTIME_BASE" >/dev/null
  echo "bases: $RUNTIME_BASE in $((SECONDS - t0)) s"
  if [ "$only" = runtime ]; then
    rm -rf "$scratch"
    scratch=""
    return
  fi
  local toolchain="${RUSTUP_HOME:-$HOME/.rustup}/toolchains/$RUST_VERSION-x86_64-unknown-linux-gnu"
  if [ ! -x "$toolchain/bin/cargo" ]; then
    echo "image.sh: no Rust $RUST_VERSION toolchain at $toolchain (rustup toolchain install $RUST_VERSION)" >&2
    exit 1
  fi

  t0=$SECONDS
  debootstrap --variant=minbase --include="$BUILDER_DEBS" "$SUITE" "$scratch/build" "$m" \
    >"$scratch/build.log" 2>&1 || { tail -20 "$scratch/build.log" >&2; exit 1; }
  rm -rf "$scratch/build/var/lib/apt/lists/"* "$scratch/build/usr/share/doc/"* "$scratch/build/usr/share/man/"*
  # The host's extra certificate authorities (a TLS-intercepting egress proxy: cargo's downloads
  # from crates.io go through it). Only the builder trusts them; the runtime image does not.
  local ca_dir=${ASSAY_EXTRA_CA_DIR:-/usr/local/share/ca-certificates}
  if compgen -G "$ca_dir/*.crt" >/dev/null; then
    cp "$ca_dir"/*.crt "$scratch/build/usr/local/share/ca-certificates/"
    chroot "$scratch/build" update-ca-certificates >/dev/null
    echo "bases: the builder trusts the host's extra CAs: $(cd "$ca_dir" && echo ./*.crt)"
  fi
  local dest="$scratch/build/usr/local/rustup/toolchains/$RUST_VERSION-x86_64-unknown-linux-gnu"
  mkdir -p "$dest" "$scratch/build/usr/local/cargo/bin"
  # rustc, cargo and the standard library; rust-docs (most of share/) is not needed to build.
  cp -a "$toolchain/bin" "$toolchain/lib" "$toolchain/libexec" "$toolchain/etc" "$dest/" 2>/dev/null \
    || cp -a "$toolchain/bin" "$toolchain/lib" "$dest/"
  for b in "$dest"/bin/*; do ln -s "../../rustup/toolchains/$RUST_VERSION-x86_64-unknown-linux-gnu/bin/$(basename "$b")" \
    "$scratch/build/usr/local/cargo/bin/$(basename "$b")"; done
  tar --numeric-owner -C "$scratch/build" -c . \
    | podman import -q --change "ENV PATH=/usr/local/cargo/bin:$PATH_ENV" \
        --change "ENV RUSTUP_HOME=/usr/local/rustup" --change "ENV CARGO_HOME=/usr/local/cargo" \
        --change "ENV RUST_VERSION=$RUST_VERSION" --change 'CMD ["bash"]' - "$BUILD_BASE" >/dev/null
  echo "bases: $BUILD_BASE (Debian $SUITE + $BUILDER_DEBS + Rust $RUST_VERSION) in $((SECONDS - t0)) s"
  rm -rf "$scratch"
  scratch=""
  podman run --rm --network=host "$BUILD_BASE" cargo --version
}

build_image() {
  local args=(build --network=host --pull=never --layers -t "$IMAGE" -f Dockerfile)
  if [ -n "${ASSAY_CARGO_CACHE:-}" ]; then
    mkdir -p "$ASSAY_CARGO_CACHE"
    # Registry downloads only: the target directory stays inside the build (clean every time).
    args+=(--volume "$(realpath "$ASSAY_CARGO_CACHE"):/usr/local/cargo/registry")
  fi
  echo "build: podman ${args[*]} ."
  local t0=$SECONDS
  podman "${args[@]}" .
  echo "build: $IMAGE in $((SECONDS - t0)) s"
}

# The Dockerfile's runtime stage with its one `COPY --from=build` of the binary replaced by a
# COPY of the same binary from a context that holds it: everything else (packages, user,
# environment, entry point) is the Dockerfile's. The Dockerfile is parsed once, by
# deploy/tools/image_build.py (the same parser and checks as scripts/image-build.sh).
build_prebuilt() {
  local ctx t0
  scratch=$(mktemp -d "${TMPDIR:-/var/tmp}/assay-prebuilt-XXXXXX")
  ctx="$scratch/context"
  python3 deploy/tools/image_build.py --runtime-context "$PREBUILT" "$ctx"
  t0=$SECONDS
  podman build --network=host --pull=never --layers -t "$IMAGE" -f "$ctx/Containerfile" "$ctx"
  echo "build: $IMAGE (prebuilt binary from $PREBUILT) in $((SECONDS - t0)) s"
  rm -rf "$scratch"
  scratch=""
}

check_image() {
  local failed=0 size
  size=$(podman image inspect "$IMAGE" --format '{{.Size}}')
  echo "image: $IMAGE $((size / 1000000)) MB, user $(podman image inspect "$IMAGE" --format '{{.Config.User}}')"
  # Read-only root filesystem, writable /tmp only, as Kubernetes runs it (deploy/k8s/base).
  local run=(podman run --rm --network=host --read-only --read-only-tmpfs=false --tmpfs /tmp --cap-drop=ALL
             --security-opt=no-new-privileges "$IMAGE")
  if out=$("${run[@]}" assay --version); then echo "check: assay --version: $out"; else echo "check: assay --version FAILED" >&2; failed=1; fi
  if out=$("${run[@]}" id -u) && [ "$out" = 10001 ]; then echo "check: runs as uid $out"; else echo "check: uid is '$out', expected 10001" >&2; failed=1; fi
  # One binary: `assay` runs every stage (`assay serve <stage>`, as each Deployment runs it).
  if out=$("${run[@]}" ls /usr/local/bin) && [ "$out" = assay ]; then
    echo "check: one binary, /usr/local/bin/assay ($("${run[@]}" stat -c %s /usr/local/bin/assay | awk '{printf "%d MB", $1 / 1000000}'))"
  else
    echo "check: /usr/local/bin holds '$(tr '\n' ' ' <<<"$out")', expected assay alone" >&2; failed=1
  fi
  if out=$("${run[@]}" assay serve --help) && grep -q -- '- scorer:' <<<"$out"; then
    echo "check: assay serve --help: $(grep -c -- '^ *- [a-z-]*:' <<<"$out") stages"
  else
    echo "check: assay serve --help FAILED" >&2; failed=1
  fi
  # The binary's shared libraries resolve in the runtime image.
  if out=$("${run[@]}" ldd /usr/local/bin/assay) && ! grep -q 'not found' <<<"$out"; then
    echo "check: ldd clean ($(grep -c '=>' <<<"$out") resolved links)"
  else
    grep 'not found' <<<"$out" >&2 || true
    echo "check: ldd FAILED" >&2; failed=1
  fi
  for tool in cc gcc rustc cargo cmake clang; do
    if "${run[@]}" sh -c "command -v $tool" >/dev/null 2>&1; then echo "check: $tool is in the runtime image" >&2; failed=1; fi
  done
  if [ "$("${run[@]}" sh -c 'ls /usr/include 2>/dev/null | wc -l')" -gt 0 ]; then
    echo "check: headers in the runtime image (/usr/include)" >&2; failed=1
  fi
  if [ "$("${run[@]}" sh -c 'touch /usr/local/bin/x 2>/dev/null && echo writable || echo read-only')" != read-only ]; then
    echo "check: the root filesystem is writable under --read-only" >&2; failed=1
  else
    echo "check: read-only root filesystem holds"
  fi
  [ "$failed" = 0 ] || { echo "image.sh: checks FAILED" >&2; exit 1; }
  echo "image.sh: $IMAGE checked"
}

case "$mode" in
  bases) make_bases ;;
  check) check_image ;;
  all) make_bases; build_image; check_image ;;
  prebuilt) make_bases runtime; build_prebuilt; check_image ;;
esac
