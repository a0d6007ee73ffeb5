# The GPU worker image of deploy/kubernetes/overlays/gpu: ps-worker built with
# `--features cuda` on NVIDIA's CUDA images. Not built by scripts/cluster.sh or
# CI: it needs NVIDIA's base images from a registry and a GPU to be tried, and
# neither is on the machines this project is tested on. docs/kubernetes.md says
# how to build and load it.
#
#   DOCKER_BUILDKIT=1 docker build -f docker/worker-cuda.Dockerfile -t candle-ps/worker-cuda:latest .
#
# BuildKit takes the context's ignore rules from worker-cuda.Dockerfile.dockerignore
# (the sources), not from .dockerignore (which admits only the staged static binaries).
#
# CUDA_COMPUTE_CAP is the GPU's compute capability without the dot (80 for A100,
# 90 for H100 and H200): candle's MoE kernels are compiled to machine code for
# it, the rest to PTX. The pins match scripts/gpu.sh (docs/gpu.md): CUDA 13.0,
# which the driver of the GPU machines this project is tried on (580) runs, and
# compute capability 90.

ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
ARG CUDA_COMPUTE_CAP=90
ENV CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP} CUDARC_CUDA_VERSION=13000
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates curl build-essential pkg-config \
    && rm -rf /var/lib/apt/lists/*
# The latest stable toolchain (the workspace needs Rust 1.85 or newer).
RUN curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
ENV PATH=/root/.cargo/bin:${PATH}
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p ps-worker --features cuda \
    && cp target/release/ps-worker /ps-worker

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
COPY --from=build /ps-worker /ps-worker
USER 65534:65534
ENV RUST_LOG=info
ENTRYPOINT ["/ps-worker"]
