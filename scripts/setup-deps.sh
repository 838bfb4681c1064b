#!/usr/bin/env bash
# Installs what building and testing Assay needs on a fresh Debian/Ubuntu machine, when missing:
# cmake + clang + libclang-dev (llama.cpp for the embedded model), chromium + chromium-driver and
# Python selenium (the admin page's browser tests), Python gRPC packages (external client tests,
# grpcurl), postgresql (the shared run store's tests), buf (contract lint), and what the client
# libraries' suites need (python3-venv, openssl, Node.js with npm). Safe to run repeatedly.
set -euo pipefail

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || need_apt+=(libclang-dev)
if [ "${ASSAY_SKIP_BROWSER:-0}" != "1" ]; then
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
fi
# PostgreSQL server binaries: the shared run store's tests start a throwaway server on loopback.
if [ "${ASSAY_SKIP_POSTGRES:-0}" != "1" ]; then
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need_apt+=(postgresql)
fi
# The client libraries' suites: a Python venv (pip inside it), openssl (the TLS test's
# certificate) and Node.js >= 20 with npm (the TypeScript client).
if [ "${ASSAY_SKIP_CLIENTS:-0}" != "1" ]; then
  command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
  python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
  command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing build dependencies: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ "${ASSAY_SKIP_PY:-0}" != "1" ]; then
  python3 -c 'import grpc, grpc_reflection, grpc_health' 2>/dev/null \
    || python3 -m pip install -q grpcio grpcio-reflection grpcio-health-checking
  python3 -c 'import xmlschema' 2>/dev/null || python3 -m pip install -q xmlschema # JUnit schema tests (cli/tests/junit.rs)
  if [ "${ASSAY_SKIP_BROWSER:-0}" != "1" ]; then
    python3 -c 'import selenium' 2>/dev/null || python3 -m pip install -q selenium
  fi
fi

# On request (ASSAY_WITH_LLAMA_CPP=1, as scripts/test.sh asks by default), a real OpenAI-compatible
# server for the backend tests (services/cli/tests/real_backend.rs): llama-cpp-python's server from
# PyPI, built from source (about 4-10 minutes on 2 cores), in its own venv under target/
# (`scripts/test.sh` points the tests at it).
if [ "${ASSAY_WITH_LLAMA_CPP:-0}" = "1" ]; then
  LLAMA_VENV="${CARGO_TARGET_DIR:-target}/llama-venv"
  if ! "$LLAMA_VENV/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
    echo "installing llama-cpp-python's server into $LLAMA_VENV"
    python3 -m venv "$LLAMA_VENV"
    # Built for the CPU family, not this CPU (GGML_NATIVE=OFF): a native build uses every
    # instruction the build machine reports, and AMX (reported by recent Xeons, not enabled in
    # every VM) faults on the first token.
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
      "$LLAMA_VENV/bin/pip" install -q --no-cache-dir 'llama-cpp-python[server]==0.3.36'
  fi
  # llama.cpp's own server, `llama-server`, built from the llama.cpp that llama-cpp-python's sdist
  # vendors (the same PyPI pin: nothing but PyPI is reached), for the CPU family as above, without
  # its web UI (about 5 minutes on 2 cores).
  LLAMA_SERVER_DIR="${CARGO_TARGET_DIR:-target}/llama-server"
  if ! [ -x "$LLAMA_SERVER_DIR/bin/llama-server" ]; then
    echo "building llama.cpp's llama-server into $LLAMA_SERVER_DIR"
    mkdir -p "$LLAMA_SERVER_DIR/src"
    "$LLAMA_VENV/bin/pip" download -q --no-deps --no-binary :all: 'llama-cpp-python==0.3.36' -d "$LLAMA_SERVER_DIR/src"
    tar xzf "$LLAMA_SERVER_DIR"/src/llama_cpp_python-0.3.36.tar.gz -C "$LLAMA_SERVER_DIR/src"
    cmake -S "$LLAMA_SERVER_DIR/src/llama_cpp_python-0.3.36/vendor/llama.cpp" -B "$LLAMA_SERVER_DIR/build" \
      -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
      -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >/dev/null
    cmake --build "$LLAMA_SERVER_DIR/build" --target llama-server -j "$(nproc)" >/dev/null
    mkdir -p "$LLAMA_SERVER_DIR/bin"
    cp "$LLAMA_SERVER_DIR/build/bin/llama-server" "$LLAMA_SERVER_DIR/bin/"
    rm -rf "$LLAMA_SERVER_DIR/build" "$LLAMA_SERVER_DIR/src"
  fi
  # LiteLLM's proxy in front of that server (the `*_behind_litellm` tests), in a venv of its own:
  # its pinned web stack differs from the server's.
  LITELLM_VENV="${CARGO_TARGET_DIR:-target}/litellm-venv"
  if ! [ -x "$LITELLM_VENV/bin/litellm" ]; then
    echo "installing LiteLLM's proxy into $LITELLM_VENV"
    python3 -m venv "$LITELLM_VENV"
    "$LITELLM_VENV/bin/pip" install -q 'litellm[proxy]==1.108.7'
  fi
fi
