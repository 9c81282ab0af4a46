# syntax=docker/dockerfile:1
# tokenscope alerter: a static, CGO-free binary on distroless/static (nonroot), with httpprobe
# for the health check (the image has no shell, wget or curl). Build from the repository root:
#   docker build -f deploy/docker/alerter.Dockerfile -t tokenscope/alerter .

FROM golang:1.26-bookworm AS build
WORKDIR /src
# The module files first, so that a source change does not download the modules again.
COPY pkg/go.mod pkg/go.sum pkg/
COPY schemas/go.mod schemas/
COPY services/alerter/go.mod services/alerter/go.sum services/alerter/
RUN --mount=type=cache,target=/go/pkg/mod \
    cd services/alerter && GOWORK=off go mod download
COPY pkg/ pkg/
COPY schemas/ schemas/
COPY services/alerter/ services/alerter/
COPY deploy/go.mod deploy/
COPY deploy/cmd/httpprobe/ deploy/cmd/httpprobe/
# GOWORK=off: the module alone, through its replace lines for pkg and schemas.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    cd services/alerter && CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags="-s -w" -o /out/alerter . && \
    cd /src/deploy && CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags="-s -w" -o /out/httpprobe ./cmd/httpprobe

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/alerter /out/httpprobe /usr/local/bin/
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/alerter"]
