# The two commands of the README, and the dev stack of the seed's
# milestone check. Run as root on Linux.
GO  ?= go
BIN := bin/agenthold

.PHONY: demo test deps build dev dev-down e2e e2e-console install images

# What the demo and the tests use from Debian, installed only if missing:
# the kernel tests' tools, and the real clients of the e2e check's matrix
# (Python with pip and requests, dig, Node.js with npm, unless the machine
# has its own).
deps:
	@missing=""; \
	for c in curl git nft ip nsenter bc dig python3 conntrack; do command -v $$c >/dev/null || missing=1; done; \
	python3 -m pip --version >/dev/null 2>&1 && python3 -c 'import requests' 2>/dev/null || missing=1; \
	if [ -n "$$missing" ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			curl git nftables iproute2 util-linux ca-certificates bc dnsutils conntrack python3 python3-pip python3-requests >/dev/null; \
	fi; \
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; \
	fi; \
	if ! command -v chromium >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	fi

build:
	$(GO) build -o $(BIN) ./examples/agenthold

# The main job: the agenthold demo on a world of namespaces it builds.
demo: deps build
	./$(BIN) demo

# Every test: the unit and kernel tests; the noisy-neighbour and
# spoofed-flood load tests, without the race detector, whose figures it
# reports; the Kubernetes manifests against the API types, each block
# adopted alone, and the comparison with smokescreen (modules of their
# own); then the end-to-end checks against a dev stack: the sandboxes'
# real clients, and the web console in a real browser.
test: deps
	$(GO) test -race -count=1 -timeout 30m ./...
	$(GO) test -count=1 -timeout 10m -run '^(TestNoisyNeighbour|TestSpoofedDNSFlood|TestThousandAgents)$$' -v ./examples/agenthold
	cd examples/deploycheck && $(GO) test -count=1 ./...
	cd examples/adopt && $(GO) test -count=1 ./...
	cd examples/peerbench && $(GO) test -count=1 ./...
	cd examples/images && $(GO) test -count=1 -timeout 10m ./...
	$(MAKE) e2e
	$(MAKE) e2e-console

# The seed's milestone check: start a dev stack of its own (a developer's
# own `make dev` stack runs on untouched), check it, stop it.
e2e: build
	@state=/run/agenthold-dev/e2e-$$$$.json; \
	$(MAKE) --no-print-directory dev DEV_STATE=$$state DEV_LOG=/tmp/agenthold-e2e.log || exit 1; \
	AGENTHOLD_DEV_STATE=$$state scripts/e2e/egress.sh; status=$$?; \
	$(MAKE) --no-print-directory dev-down DEV_STATE=$$state; exit $$status

# The web console in headless Chromium (chromedp, a module of its own):
# a dev stack of its own, whose console listens on the gateway namespace's
# loopback, and the check run in that namespace. Screenshots go to
# $(CONSOLE_SHOTS).
CONSOLE_SHOTS ?= /tmp/agenthold-console-shots
e2e-console: build
	cd examples/consolecheck && $(GO) test -c -o $(CURDIR)/bin/consolecheck.test .
	@state=/run/agenthold-dev/console-$$$$.json; \
	$(MAKE) --no-print-directory dev DEV_STATE=$$state DEV_LOG=/tmp/agenthold-console.log || exit 1; \
	ns=$$(sed -n 's/.*"gateway_netns": *"\([^"]*\)".*/\1/p' $$state); \
	AGENTHOLD_DEV_STATE=$$state CONSOLE_SHOTS=$(CONSOLE_SHOTS) nsenter --net=/run/netns/$$ns ./bin/consolecheck.test -test.v -test.count=1; status=$$?; \
	$(MAKE) --no-print-directory dev-down DEV_STATE=$$state; exit $$status

# The dev stack: the demo's world and server, left running. Each state
# file is a stack: `make dev DEV_STATE=/run/agenthold-dev/mine.json` runs
# another beside the default one; `make dev` again restarts the same one.
DEV_STATE ?= /run/agenthold-dev/state.json
DEV_LOG   ?= /tmp/agenthold-dev.log
dev: build
	@./$(BIN) demo --down --state $(DEV_STATE) >/dev/null
	@nohup ./$(BIN) demo --keep --state $(DEV_STATE) >$(DEV_LOG) 2>&1 &
	@for i in $$(seq 1 300); do [ -f $(DEV_STATE) ] && break; sleep 0.1; done; \
	if [ -f $(DEV_STATE) ]; then echo "dev stack up (log: $(DEV_LOG)); for the CLI:"; \
		sed -n 's/.*"socket": *"\([^"]*\)".*/  export AGENTHOLD_SOCKET=\1/p' $(DEV_STATE); \
	else echo "dev stack did not come up:"; cat $(DEV_LOG); exit 1; fi

dev-down: build
	./$(BIN) demo --down --state $(DEV_STATE)

# Install the gateway as a systemd service (as root): a static binary in
# /usr/local/bin, the unit, and the example configuration unless there is
# one already. DESTDIR stages it under another root (a package's). Then:
# systemctl enable --now agenthold.
DESTDIR ?=
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
install:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w -X main.version=$(VERSION)' -o $(BIN)-static ./examples/agenthold
	install -D -m 0755 $(BIN)-static $(DESTDIR)/usr/local/bin/agenthold
	install -D -m 0644 examples/agenthold/deploy/agenthold.service $(DESTDIR)/etc/systemd/system/agenthold.service
	@if [ -e $(DESTDIR)/etc/agenthold/agenthold.yaml ]; then \
		echo "kept $(DESTDIR)/etc/agenthold/agenthold.yaml"; \
	else \
		install -D -m 0600 examples/agenthold/agenthold.example.yaml $(DESTDIR)/etc/agenthold/agenthold.yaml; \
	fi
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

# The images the Kubernetes manifests name (ghcr.io/agenthold/{agenthold,
# egress-sidecar,sandbox}:latest), as OCI image layouts in $(IMAGES_DIR):
# static programs, no base image, reproducible (timestamps are the last
# commit's time).
IMAGES_DIR       ?= /tmp/agenthold-images
IMAGES_PLATFORMS ?= linux/amd64,linux/arm64
images:
	cd examples/images && SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0) \
		$(GO) run . -out $(abspath $(IMAGES_DIR)) -version $(VERSION) -platform $(IMAGES_PLATFORMS) -go $(GO)
