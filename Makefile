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

# Every test, with the race detector, once per flavour against throwaway
# servers the tests start themselves: MariaDB, then Oracle MySQL
# (FLAVORS=mysql runs one; CDCOUT_TEST_DSN points both runs at your own
# server). setup first installs what is missing (MariaDB, Oracle MySQL in a
# private prefix, docker-compose, Chromium). Both runs always run; the
# target fails if either did.
#
# The capacity tests (e2e: delivery to receivers of little capacity, held
# to 1.5× what the receiver's capacity measured alone allows) run after the
# rest, with nothing else beside them: Python's http.server shares the
# CPUs, and beside another package's tests it gets less of them while
# cdcout delivers than while its capacity is measured.
FLAVORS ?= mariadb mysql
CAPACITY_TESTS := ^(TestSmallReceiverThreadingHTTPServer|TestSingleThreadedSlowReceiver|TestRetryAfterReceiver)$$
test: setup
	@status=0; for f in $(FLAVORS); do \
	  echo "--- go test on $$f"; \
	  CDCOUT_TEST_FLAVOR=$$f $(GO) test -race -count=1 -timeout 25m -skip '$(CAPACITY_TESTS)' $(PKGS) || status=1; \
	  echo "--- capacity tests on $$f, alone"; \
	  CDCOUT_TEST_FLAVOR=$$f $(GO) test -race -count=1 -timeout 10m -run '$(CAPACITY_TESTS)' ./e2e || status=1; \
	done; exit $$status

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

# Full-size benchmarks (not run in CI). CDCOUT_BENCH_ROWS resizes them.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m $(PKGS)

# A throwaway server with the binary log on, for trying cdcout by hand; prints
# its DSN and runs until Ctrl-C. MariaDB, or Oracle MySQL with FLAVOR=mysql.
FLAVOR ?= mariadb
db:
	CDCOUT_TEST_FLAVOR=$(FLAVOR) $(GO) run ./internal/mysqltest/testdb

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
