# syntax=docker/dockerfile:1
# tokenscope aggregator: a static, CGO-free binary on distroless/static (nonroot), with httpprobe
# for the health check (the image has no shell, wget or curl). Build from the repository root:
#   docker build -f deploy/docker/aggregator.Dockerfile -t tokenscope/aggregator .

FROM golang:1.26-bookworm AS build
WORKDIR /src
# The module files first, so that a source change does not download the modules again.
COPY pkg/go.mod pkg/go.sum pkg/
COPY schemas/go.mod schemas/
COPY services/aggregator/go.mod services/aggregator/go.sum services/aggregator/
RUN --mount=type=cache,target=/go/pkg/mod \
    cd services/aggregator && GOWORK=off go mod download
COPY pkg/ pkg/
COPY schemas/ schemas/
COPY services/aggregator/ services/aggregator/
COPY deploy/go.mod deploy/
COPY deploy/cmd/httpprobe/ deploy/cmd/httpprobe/
# GOWORK=off: the module alone, through its replace lines for pkg and schemas.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    cd services/aggregator && CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags="-s -w" -o /out/aggregator . && \
    cd /src/deploy && CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags="-s -w" -o /out/httpprobe ./cmd/httpprobe

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/aggregator /out/httpprobe /usr/local/bin/
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/aggregator"]
