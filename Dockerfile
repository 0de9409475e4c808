# syntax=docker/dockerfile:1
#
# flce-server and flce-client in a CUDA runtime image.
#
#   docker build -t flce:latest .
#   docker run --rm --gpus all -p 50051:50051 -p 9464:9464 flce:latest
#
# Two stages:
#   build    the CUDA devel image (Ubuntu 24.04: the same gRPC 1.51 / protobuf 3.21 /
#            Abseil 20220623 generation as Debian 12) with deploy/docker/build-packages.txt
#            builds flce with deploy/docker/build-stage.sh (the project's own CMake,
#            scripts/build.sh), tests and benchmarks off.
#   runtime  the matching CUDA runtime image (CUDA runtime + cuBLAS), then
#            deploy/docker/runtime-stage.sh: the Ubuntu packages that own the shared
#            libraries the binaries need (listed in the build stage by
#            deploy/docker/runtime-packages.sh) and the user "flce"; flce-server,
#            flce-client and the CUDA engine plugin libflce_cuda.so beside flce-server,
#            where the server looks for it. Runs as the unprivileged user "flce".
#
# deploy/docker/Dockerfile.cpu shares the package list and both stage scripts; its build
# with buildah on Debian 12 (scripts/image.sh) is what runs them here. docs/OPERATIONS.md
# says what that proves for this image and what it cannot.
#
# Build arguments: CUDA_VERSION (13.0.1), UBUNTU (ubuntu24.04), CUDA_ARCHITECTURES (the
# build's default: sm_80, sm_89 and sm_90 machine code and compute_80 PTX; "90-real" alone
# builds for Hopper only, faster), FLCE_JOBS (parallel compile jobs).
# See docs/OPERATIONS.md.

ARG CUDA_VERSION=13.0.1
ARG UBUNTU=ubuntu24.04

# ---------------------------------------------------------------------------- build --
FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build

ARG CUDA_ARCHITECTURES="80-real;89-real;90-real;80-virtual"
ARG FLCE_JOBS=
ENV DEBIAN_FRONTEND=noninteractive

# The build packages (deploy/docker/build-packages.txt: names Ubuntu 24.04 shares with
# Debian 12; the CPU image's build stage installs the same list). Copied alone first, so
# that a change of the sources leaves this layer cached.
COPY deploy/docker/build-packages.txt /tmp/build-packages.txt
RUN apt-get update \
 && sed -e 's/#.*//' /tmp/build-packages.txt | xargs apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . /src

# deploy/docker/build-stage.sh (shared with the CPU image, which runs it with the plugin
# off): flce-server and flce-client, stripped, and the plugin libflce_cuda.so side by side
# in /opt/flce/bin (the step fails when the plugin is missing: a GPU image without its GPU
# engine is a mistake); the runtime package list in /opt/flce/runtime-packages.txt.
RUN deploy/docker/build-stage.sh \
      -DCMAKE_BUILD_TYPE=Release \
      -DFLCE_BUILD_TESTS=OFF -DFLCE_BUILD_BENCH=OFF -DFLCE_BUILD_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}"

# -------------------------------------------------------------------------- runtime --
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime

ENV DEBIAN_FRONTEND=noninteractive
# Utility: nvidia-smi and NVML inside the container; compute: CUDA itself.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
# The CPU engine: OpenBLAS's idle workers sleep at once instead of spinning on the cores
# the engine's row pass needs next (2.2x slower row pass otherwise, docs/perf/cpu.md).
# OpenBLAS reads it when it loads, before main(), so the environment has to carry it.
ENV OPENBLAS_THREAD_TIMEOUT=4

# deploy/docker/runtime-stage.sh (shared with the CPU image): only the packages that own
# the libraries flce-server, flce-client and the plugin load (gRPC, protobuf, Abseil,
# prometheus-cpp, civetweb, OpenBLAS, ...), nothing to build with; the unprivileged user
# "flce"; /heads, the default --head-root (mount safetensors files there).
COPY --from=build /opt/flce/runtime-packages.txt /src/deploy/docker/runtime-stage.sh /opt/flce/
RUN /opt/flce/runtime-stage.sh /opt/flce/runtime-packages.txt

COPY --from=build /opt/flce/bin/ /opt/flce/bin/

USER flce:flce
WORKDIR /var/lib/flce

# gRPC (the Flce service and grpc.health.v1) and Prometheus /metrics.
EXPOSE 50051 50052 9464

# The gRPC health service: flce-client exits non-zero unless the server says SERVING.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/opt/flce/bin/flce-client", "--target", "127.0.0.1:50051", "--timeout-s", "4", "health"]

# Defaults: gRPC on 50051, metrics on 9464, the GPU engine when a GPU is visible (the CPU
# engine otherwise), server-side head files under /heads. Arguments given to
# `docker run IMAGE ...` or a compose `command:` replace these.
ENTRYPOINT ["/opt/flce/bin/flce-server"]
CMD ["--port", "50051", "--metrics-port", "9464", "--device", "auto", "--head-root", "/heads"]
