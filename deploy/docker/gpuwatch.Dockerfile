# syntax=docker/dockerfile:1
# tokenscope gpuwatch: the one cgo service (go-nvml dlopens libnvidia-ml.so.1 at run time),
# so it runs on glibc (debian-slim, the same Debian as the build image). The NVIDIA
# Container Toolkit mounts the driver's libnvidia-ml into the container when the service
# reserves a GPU with the utility capability (compose profile gpu). Without a GPU, run it
# with GPUWATCH_SOURCE=synthetic. Build from the repository root:
#   docker build -f deploy/docker/gpuwatch.Dockerfile -t tokenscope/gpuwatch .

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY pkg/go.mod pkg/go.sum pkg/
COPY schemas/go.mod schemas/
COPY services/gpuwatch/go.mod services/gpuwatch/go.sum services/gpuwatch/
RUN --mount=type=cache,target=/go/pkg/mod \
    cd services/gpuwatch && GOWORK=off go mod download
COPY pkg/ pkg/
COPY schemas/ schemas/
COPY services/gpuwatch/ services/gpuwatch/
COPY deploy/go.mod deploy/
COPY deploy/cmd/httpprobe/ deploy/cmd/httpprobe/
# go-nvml's headers make gcc print deprecation warnings by the hundred.
ENV CGO_CFLAGS=-Wno-deprecated-declarations
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    cd services/gpuwatch && CGO_ENABLED=1 GOWORK=off go build -trimpath -ldflags="-s -w" -o /out/gpuwatch . && \
    cd /src/deploy && CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags="-s -w" -o /out/httpprobe ./cmd/httpprobe

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/gpuwatch /out/httpprobe /usr/local/bin/
# Ask the NVIDIA runtime for every GPU and for NVML (the utility capability).
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
# root: NVML needs the /dev/nvidia* nodes, which are not readable by every user on every host.
ENTRYPOINT ["/usr/local/bin/gpuwatch"]
