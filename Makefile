# tokenscope: build and test every module of the go.work workspace.
#   make test     vet and test everything (race detector on), against the real NATS
#                 (in-process) and a private ClickHouse server the tests start, and the
#                 SQL on ClickHouse 26.7 too (chDB, installed by make chdb)
#   make chdb     install chDB for Node.js into pkg/testbed/testdata/chdb (git-ignored)
#   make bench    the benchmarks behind the speed and memory goals
#   make bench-peers  the emitter against nginx and Caddy (apt-get install -y nginx-light caddy)
#                 and net/http's own floor, side by side
#   make build    the service binaries and the tokenscope command into bin/

SHELL   := /bin/bash
MODULES := $(shell sed -n 's|^\s*\./\(.*\)$$|\1|p' go.work)
GOFLAGS_TEST ?= -race -count=1 -timeout 30m
export CGO_CFLAGS ?= -Wno-deprecated-declarations

.PHONY: test vet unit bench bench-peers bench-loops bench-linger build fmt-check chdb

test: fmt-check vet chdb unit

chdb:
	@scripts/install-chdb.sh

fmt-check:
	@out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	@set -e; for m in $(MODULES); do \
		if [ -n "$$(cd $$m && go list ./... 2>/dev/null)" ]; then echo "== vet $$m"; (cd $$m && go vet ./...); fi; \
	done

# Each module is tested alone (GOWORK=off) too: its go.mod must carry what it needs. A module
# that fails does not stop the others; the failed ones are named at the end.
unit:
	@failed=; for m in $(MODULES); do \
		if [ -n "$$(cd $$m && go list ./... 2>/dev/null)" ]; then echo "== test $$m"; (cd $$m && GOWORK=off go test $(GOFLAGS_TEST) ./...) || failed="$$failed $$m"; fi; \
	done; if [ -n "$$failed" ]; then echo "== FAILED:$$failed"; exit 1; fi

bench:
	@set -e; for m in $(MODULES); do \
		if [ -n "$$(cd $$m && go list ./... 2>/dev/null)" ]; then (cd $$m && go test -run '^$$' -bench . -benchmem ./...); fi; \
	done

# The emitter, Debian's nginx and Caddy, and a proxy of net/http alone (nethttp) in front of
# the same fake LLM, driven in alternating rounds (services/emitter/peers_linux_test.go):
# added latency and CPU per request at BENCH_RATES (default 250,500,1000), then the resident
# set per held stream. PEERS picks the proxies; a missing nginx or caddy skips the run.
PEERS ?= emitter nginx-w1 nginx-w2 caddy nethttp
bench-peers:
	cd services/emitter && BENCH_PEERS="$(PEERS)" go test -v -run '^$$' -timeout 60m -bench '^BenchmarkPeers$$' -benchtime=4000x .
	cd services/emitter && BENCH_PEERS="$(PEERS)" go test -v -run '^$$' -timeout 10m -bench '^BenchmarkPeerStreams$$' -benchtime=1x .

# One relay loop against two at 1,000 req/s (BENCH_RATES, BENCH_ROUNDS override).
bench-loops:
	cd services/emitter && BENCH_PEERS="emitter-loops2 emitter-loops1" BENCH_RATES=$${BENCH_RATES:-1000} BENCH_ROUNDS=$${BENCH_ROUNDS:-6} \
		go test -v -run '^$$' -timeout 60m -bench '^BenchmarkPeers$$' -benchtime=5000x .

# nats-server's CPU per event against the publisher's linger (the emitter's default first).
bench-linger:
	cd services/emitter && BENCH_PEERS="emitter-linger20ms emitter-linger5ms emitter-linger0 emitter-linger1ms" BENCH_RATES=$${BENCH_RATES:-100,250,500} \
		go test -v -run '^$$' -timeout 60m -bench '^BenchmarkPeers$$' -benchtime=1500x .

build:
	@mkdir -p bin; set -e; for s in services/*/; do \
		if [ -f $$s/main.go ]; then n=$$(basename $$s); echo "== build $$n"; (cd $$s && go build -o ../../bin/$$n .); fi; \
	done; echo "== build tokenscope"; (cd cli && go build -o ../bin/tokenscope ./cmd/tokenscope)
