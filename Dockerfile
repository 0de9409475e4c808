# syntax=docker/dockerfile:1
#
# flce-server and flce-client in a CUDA runtime image.
#
#   docker build -t flce:latest .
#   docker run --rm --gpus all -p 50051:50051 -p 9464:9464 flce:latest
#
# Two stages:
#   build    the CUDA devel image (Ubuntu 24.04: the same gRPC 1.51 / protobuf 3.21 /
#            Abseil 20220623 generation as Debian 12) builds flce with the project's own
#            CMake (scripts/build.sh), tests and benchmarks off.
#   runtime  the matching CUDA runtime image (CUDA runtime + cuBLAS), the Ubuntu packages
#            that own the shared libraries the binaries need (listed in the build stage by
#            deploy/docker/runtime-packages.sh), flce-server, flce-client and the CUDA
#            engine plugin libflce_cuda.so beside flce-server, where the server looks
#            for it. Runs as the unprivileged user "flce".
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

# The build packages of scripts/setup.sh, by their Ubuntu 24.04 names (the same as
# Debian's); GoogleTest, Google Benchmark and the Python packages are not needed
# because tests and benchmarks are not built here.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config git ca-certificates \
      libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libabsl-dev \
      prometheus-cpp-dev nlohmann-json3-dev libopenblas-dev libxxhash-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . /src

RUN FLCE_BUILD_DIR=/build FLCE_JOBS="${FLCE_JOBS:-$(nproc)}" ./scripts/build.sh \
      -DCMAKE_BUILD_TYPE=Release \
      -DFLCE_BUILD_TESTS=OFF -DFLCE_BUILD_BENCH=OFF -DFLCE_BUILD_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}"

# /opt/flce/bin: the binaries and the plugin side by side. The image fails to build
# when the plugin is missing: a GPU image without its GPU engine is a mistake.
RUN install -d /opt/flce/bin \
 && install -m 0755 /build/server/flce-server /build/client/cli/flce-client /opt/flce/bin/ \
 && plugin="$(find /build -name libflce_cuda.so -type f | head -n 1)" \
 && test -n "$plugin" \
 && install -m 0644 "$plugin" /opt/flce/bin/libflce_cuda.so \
 && strip --strip-unneeded /opt/flce/bin/flce-server /opt/flce/bin/flce-client \
 && deploy/docker/runtime-packages.sh /opt/flce/bin/* > /opt/flce/runtime-packages.txt \
 && cat /opt/flce/runtime-packages.txt

# -------------------------------------------------------------------------- runtime --
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime

ENV DEBIAN_FRONTEND=noninteractive
# Utility: nvidia-smi and NVML inside the container; compute: CUDA itself.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
# The CPU engine: OpenBLAS's idle workers sleep at once instead of spinning on the cores
# the engine's row pass needs next (2.2x slower row pass otherwise, docs/perf/cpu.md).
# OpenBLAS reads it when it loads, before main(), so the environment has to carry it.
ENV OPENBLAS_THREAD_TIMEOUT=4

# Only the packages that own the libraries flce-server, flce-client and the plugin load
# (gRPC, protobuf, Abseil, prometheus-cpp, civetweb, OpenBLAS, ...): nothing to build with.
COPY --from=build /opt/flce/runtime-packages.txt /opt/flce/runtime-packages.txt
RUN apt-get update \
 && xargs -a /opt/flce/runtime-packages.txt apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/*

COPY --from=build /opt/flce/bin/ /opt/flce/bin/

# Unprivileged user; /heads is the default --head-root (mount safetensors files there).
RUN groupadd --system flce \
 && useradd --system --gid flce --home-dir /var/lib/flce --create-home --shell /usr/sbin/nologin flce \
 && install -d -o flce -g flce /heads \
 && ln -s /opt/flce/bin/flce-server /usr/local/bin/flce-server \
 && ln -s /opt/flce/bin/flce-client /usr/local/bin/flce-client

USER flce:flce
WORKDIR /var/lib/flce

# gRPC (the Flce service and grpc.health.v1) and Prometheus /metrics.
EXPOSE 50051 9464

# The gRPC health service: flce-client exits non-zero unless the server says SERVING.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/opt/flce/bin/flce-client", "--target", "127.0.0.1:50051", "--timeout-s", "4", "health"]

# Defaults: gRPC on 50051, metrics on 9464, the GPU engine when a GPU is visible (the CPU
# engine otherwise), server-side head files under /heads. Arguments given to
# `docker run IMAGE ...` or a compose `command:` replace these.
ENTRYPOINT ["/opt/flce/bin/flce-server"]
CMD ["--port", "50051", "--metrics-port", "9464", "--device", "auto", "--head-root", "/heads"]
