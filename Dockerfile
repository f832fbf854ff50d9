# syntax=docker/dockerfile:1
#
# seamguard: a static binary in distroless/static (CA certificates, tzdata,
# the nonroot user 65532, no shell). Build: docker build -t seamguard .
# The image runs `seamguard serve`; point it at a NATS cluster with
# SEAMGUARD_NATS_URL (see docker-compose.yaml and deploy/README.md).

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /out/seamguard ./cmd/seamguard && \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /out/healthcheck ./deploy/healthcheck

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/seamguard /seamguard
COPY --from=build /out/healthcheck /healthcheck
# the embedded server's default data directory (only without SEAMGUARD_NATS_URL)
WORKDIR /home/nonroot
USER 65532:65532
# health endpoints (SEAMGUARD_HEALTH_LISTEN)
EXPOSE 8080
ENTRYPOINT ["/seamguard"]
CMD ["serve"]
