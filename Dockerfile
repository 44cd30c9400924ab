# syntax=docker/dockerfile:1
# Multi-stage build: a static cdcout binary on a distroless base, run as a
# non-root user.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/cdcout/cdcout/internal/buildinfo.version=${VERSION} -X github.com/cdcout/cdcout/internal/buildinfo.commit=${COMMIT}" \
      -o /out/cdcout .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/cdcout /cdcout
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/cdcout"]
