# cdcout — the developer's entry points. `make test` is what CI runs.
SHELL := /bin/bash
GO ?= go
export PATH := /usr/local/go/bin:$(PATH)
PKGS := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X github.com/cdcout/cdcout/internal/buildinfo.version=$(VERSION) -X github.com/cdcout/cdcout/internal/buildinfo.commit=$(COMMIT)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: build test lint bench demo db setup clean compose

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/cdcout .

# Every test, with the race detector, against throwaway MariaDB servers the
# tests start themselves (set CDCOUT_TEST_DSN to use your own MySQL). setup
# first installs what is missing (MariaDB, docker-compose, Chromium).
test: setup
	$(GO) test -race -count=1 -timeout 25m $(PKGS)

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

# Full-size benchmarks (not run in CI). CDCOUT_BENCH_ROWS resizes them.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m $(PKGS)

# A throwaway MariaDB with the binlog on, for trying cdcout by hand; prints
# its DSN and runs until Ctrl-C.
db:
	$(GO) run ./internal/mysqltest/testdb

demo: setup
	$(GO) run ./internal/demo

# The Docker demo, its image stamped with this checkout's version and commit.
compose:
	CDCOUT_VERSION=$(VERSION) CDCOUT_COMMIT=$(COMMIT) docker compose up --build

# Installs what the tests need on a fresh Debian machine.
setup:
	bash .ci/setup

clean:
	rm -rf bin artifacts
