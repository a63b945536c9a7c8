# syntax=docker/dockerfile:1
# kunci's container image: kuncid (the entrypoint) and kunci, built static
# (CGO_ENABLED=0) and run on distroless as a non-root user.
#
#   docker build -t kunci:0.10.0 --build-arg TAG=0.10.0 --build-arg COMMIT=$(git rev-parse --short HEAD) .
#   docker run --rm -p 7070:7070 kunci:0.10.0
#
# The node listens on 7070 (clients and peers) and serves its admin endpoint
# (/healthz, /readyz, /metrics, /locks) on 127.0.0.1:7071, inside the
# container only; a cluster node needs KUNCI_ADVERTISE, the address its
# peers and clients reach it at (a wildcard is refused). Every kuncid flag is an environment variable
# (KUNCI_MAX_KEYS=...). State lives in /var/lib/kunci: mount a volume there
# to keep tokens increasing across restarts. deploy/k8s/ runs three of
# these as a cluster. cmd/kuncid/container_test.go checks this file.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# .dockerignore keeps out what the build does not need (.git, bin/, docs).
# The build fetches the modules itself, into a cache kept between builds:
# only those the two commands need, not the test-only ones.
COPY . .
# The version: internal/version's Release unless TAG is given (as make build
# gives git describe once a release tag exists); COMMIT, the commit built.
ARG TAG=""
ARG COMMIT=""
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/kunci/kunci/internal/version.tag=${TAG} -X github.com/kunci/kunci/internal/version.commit=${COMMIT}" -o /out/ ./cmd/kuncid ./cmd/kunci
# The data directory, empty, for the runtime image (which has no shell to
# make it).
RUN mkdir -p /out/data

# distroless/static: no shell, no package manager, CA certificates and
# /etc/passwd with the nonroot user (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kuncid /out/kunci /usr/local/bin/
COPY --from=build --chown=65532:65532 /out/data /var/lib/kunci
USER 65532:65532
# The admin endpoint is container-local: /locks lists every token. Publish
# it (KUNCI_ADMIN=0.0.0.0:7071, -p 127.0.0.1:7071:7071) only where no one
# else can reach it.
ENV KUNCI_LISTEN=0.0.0.0:7070 \
    KUNCI_ADMIN=127.0.0.1:7071 \
    KUNCI_DATA_DIR=/var/lib/kunci \
    KUNCI_LOG_FORMAT=json
VOLUME /var/lib/kunci
EXPOSE 7070
# No curl in the image: kunci health is the probe (exit 0 on a 2xx answer).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/kunci", "health", "--timeout", "2s", "http://127.0.0.1:7071/healthz"]
ENTRYPOINT ["/usr/local/bin/kuncid"]
