# kunci — see README.md.
GO       ?= go
# The version (internal/version): its Release constant, or git describe when
# the tree has a release tag (v0.9.0 -> 0.9.0; 0.9.0-3-gabc1234 after it),
# and the commit.
TAG      ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null | sed 's/^v//')
COMMIT   ?= $(shell git describe --always --dirty --abbrev=12 --exclude '*' 2>/dev/null)
VERPKG   := github.com/kunci/kunci/internal/version
LDFLAGS  := -X $(VERPKG).tag=$(TAG) -X $(VERPKG).commit=$(COMMIT)
LISTEN   ?= 127.0.0.1:7070
ADMIN    ?= 127.0.0.1:7071
FUZZTIME ?= 30s

.PHONY: build run test cgo vet bench bench-load bench-compare bench-handoff bench-memory bench-tls fuzz clean

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kuncid ./cmd/kuncid
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kunci ./cmd/kunci

run: build
	./bin/kuncid --listen $(LISTEN) --admin $(ADMIN) --admin-pprof

vet:
	$(GO) vet ./...

# The tests mostly wait on real sockets and timers, not on the CPU: four
# packages at a time, each running four parallel tests at a time, keep two
# cores busy where go test's default (as many as there are cores) left them
# idle half the time.
TESTFLAGS ?= -race -count=1 -p 4 -parallel 4

# make test runs the Go tests and the Python and TypeScript clients' tests
# side by side: each mostly waits on real nodes and sockets.
test: cgo vet promtool
	$(MAKE) --no-print-directory -j3 -Otarget test-go test-python test-typescript PROMTOOL_LOOKED=1

.PHONY: test-go test-python test-typescript kuncid-bin promtool
test-go: $(if $(PROMTOOL_LOOKED),,promtool)
	$(GO) test $(TESTFLAGS) ./...

# promtool checks deploy/'s alerting rules, their unit tests and the
# dashboard's queries (deploy/monitoring_test.go). When it is missing, this
# installs it with apt-get on Debian/Ubuntu, as root only: its package is
# prometheus, which holds Prometheus's server too (Debian starts its
# service; systemctl disable --now prometheus if unwanted). Elsewhere it
# says so, and TestMonitoringPromtool skips, saying why. make test looks
# before its parallel part, so that this apt-get does not race
# test-python's for apt's locks.
promtool:
	@command -v promtool >/dev/null && exit 0; \
	if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
		echo "make: installing promtool: apt-get install -y --no-install-recommends prometheus" >&2; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
			|| echo "make: prometheus did not install: the promtool checks of deploy/ will be skipped" >&2; \
	else \
		echo "make: no promtool (Debian/Ubuntu: apt-get install prometheus, as root): the promtool checks of deploy/ will be skipped" >&2; \
	fi

# The clients' tests start this tree's kuncid.
kuncid-bin:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kuncid ./cmd/kuncid

# The Python client (clients/python) against real nodes built here; installs
# what its tests need on Debian/Ubuntu when missing (clients/python/tests/deps.sh).
PYTHON ?= python3
test-python: kuncid-bin
	PYTHON=$(PYTHON) clients/python/tests/deps.sh
	cd clients/python && KUNCID=$(CURDIR)/bin/kuncid $(PYTHON) -m unittest discover -s tests -t .

# The TypeScript client (clients/typescript): npm ci installs what its
# package-lock.json names (tsc, @types/node), tsc builds it, and node --test
# runs its tests against this tree's kuncid.
test-typescript: kuncid-bin
	cd clients/typescript && npm ci --no-audit --no-fund && npm run build && KUNCID=$(CURDIR)/bin/kuncid npm test

# The race detector needs cgo and a C compiler: say so first, rather than
# let go test say "-race requires cgo" on a machine without gcc.
cgo:
	@if [ "$$($(GO) env CGO_ENABLED)" != 1 ] || ! command -v "$$($(GO) env CC)" >/dev/null; then \
		echo "make test: the race detector (-race) needs cgo and a C compiler ($$($(GO) env CC)): install one (Debian/Ubuntu: apt-get install gcc) and leave CGO_ENABLED=1, or run go test -count=1 ./... without it" >&2; \
		exit 1; \
	fi

bench:
	$(GO) test -run=NONE -bench=. -benchmem ./wire/ ./engine/... ./server/

# The load generator against a running node (make run): LOAD_FLAGS are its
# flags (go run ./bench --help), e.g. LOAD_FLAGS='--workload contended --conns 50 --depth 1'.
LOAD_FLAGS ?= --duration 10s
bench-load:
	$(GO) build -o bin/bench ./bench
	./bin/bench --target kunci://$(LISTEN) $(LOAD_FLAGS)

# kunci beside Redis, same load: see bench/README.md. Needs redis-server on
# PATH; when it is missing, installs it with apt-get on Debian/Ubuntu (sudo
# unless root) and stops elsewhere. Its node has its own data dir and ports
# (127.0.0.1:7090, Redis 6390), so it runs beside make run.
bench-compare:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kuncid ./cmd/kuncid
	KUNCID=bin/kuncid GO=$(GO) bench/compare.sh

# What a held key and a queued waiter cost the node in memory, beside Redis
# (bench/README.md; needs redis-server, as bench-compare).
bench-memory:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kuncid ./cmd/kuncid
	$(GO) run ./bench/memory --kuncid bin/kuncid --keys 1000000 --waiters 100000 --redis redis-server

# The pause clients see when the active of a two-node cluster is stopped.
bench-handoff:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kuncid ./cmd/kuncid
	$(GO) run ./bench/handoff --kuncid bin/kuncid
	$(GO) run ./bench/handoff --kuncid bin/kuncid --semi-sync

# What TLS costs: one node serving TCP and mutual TLS, loads interleaved
# (needs openssl for the certificates). ROUNDS=5 for more rounds.
ROUNDS ?= 3
bench-tls:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kuncid ./cmd/kuncid
	$(GO) build -o bin/bench ./bench
	bench/tls.sh $(ROUNDS)

fuzz:
	$(GO) test -run=NONE -fuzz=FuzzParseRequest -fuzztime=$(FUZZTIME) ./wire/
	$(GO) test -run=NONE -fuzz=FuzzParseAnswer -fuzztime=$(FUZZTIME) ./wire/
	$(GO) test -run=NONE -fuzz=FuzzParse -fuzztime=$(FUZZTIME) ./replica/
	$(GO) test -run=NONE -fuzz=FuzzHandshake -fuzztime=$(FUZZTIME) ./replica/
	$(GO) test -run=NONE -fuzz=FuzzOpen -fuzztime=$(FUZZTIME) ./replica/

clean:
	rm -rf bin
