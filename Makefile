# kube-mvp: the two commands a newcomer needs are `make demo` and `make test`.
GO ?= go
KUBE_VERSIONS ?= v1.35.8 v1.36.4 v1.37.1
TEST_TIMEOUT ?= 75m
TEST_FLAGS = -race -count=1 -timeout $(TEST_TIMEOUT) -bench . -benchtime 1x
MODULE := github.com/kube-mvp/kube-mvp
# SLOW_TEST_PKGS: make test's longest packages, longest first, each run beside the others
# (tools/test.sh); TEST_JOBS: how many test processes at once.
SLOW_TEST_PKGS ?= test/e2e deploy test/node/images test/dataplane
TEST_JOBS ?= 2
# RUN: make test-envoy runs only the end-to-end tests this regexp matches (go test -run).
RUN ?= .
# The version stamp (xds-server --version): by default the chart's appVersion, so binaries,
# images and chart agree.
VERSION ?= $(shell sed -n "s/^appVersion:[[:space:]]*[\"']\{0,1\}\([^\"' ]*\).*/\1/p" deploy/kube-mvp/Chart.yaml)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/kube-mvp/kube-mvp/internal/version.Version=$(VERSION) -X github.com/kube-mvp/kube-mvp/internal/version.Commit=$(COMMIT)
# make images: the images are REGISTRY/xds-server:VERSION and REGISTRY/extproc:VERSION.
REGISTRY ?= ghcr.io/kube-mvp
ARCHS ?= amd64 arm64
PUSH ?=

# RE2_HEADER: the test data plane measures regexes with libre2 through cgo (C++).
RE2_HEADER ?= /usr/include/re2/re2.h

# The packages with golden files: those whose tests define an -update flag (their golden
# tests are named TestGolden...).
GOLDEN_PKGS ?= $(sort $(dir $(shell grep -rl --include='*_test.go' 'flag\.Bool."update"' internal cmd test tools)))

# NODE_PACKAGES: what a real node (test/node) needs from Debian besides Go.
NODE_PACKAGES ?= containerd runc containernetworking-plugins iptables conntrack iproute2 util-linux busybox-static libre2-dev g++

# ENVOY_IMAGE: make test-node's Envoy image archive, from NODE_FLAGS' --envoy-image=FILE.tar
# (make node reads NODE_FLAGS itself).
ENVOY_IMAGE = $(patsubst --envoy-image=%,%,$(filter --envoy-image=%,$(NODE_FLAGS)))

# STATICCHECK: make lint's linter, pinned; go run builds it from its module (cached after the
# first run), so a machine with Go needs nothing else. -tags node is the only build tag in
# the tree and no file is built without it only, so one run sees every file.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: all help demo test test-envoy envoy-given unit lint vet build images bench golden golden-dirs envoy-protos kube-binaries node-binaries deps node test-node node-deps proto clean

## all: the default: build
all: build

## help: this list (the `## target:` comments in the Makefile)
help:
	@echo 'kube-mvp: `make demo` shows it working, `make test` tests it. Targets:'
	@awk '/^## [a-z-]+:/ { t = $$2; sub(/:$$/, "", t); sub(/^## [a-z-]+: */, ""); printf "  %-14s %s\n", t, $$0; next } \
		/^##( |$$)/ { sub(/^## ?/, ""); printf "  %-14s %s\n", "", $$0 }' $(firstword $(MAKEFILE_LIST))

## demo: kube-mvp in front of a two-version control plane (cp-b has batch/v1 off),
## kubectl through it and through a plain balancer, then up until Ctrl-C
## (DEMO_FLAGS=--exit to stop)
demo: deps
	$(GO) run ./test/cmd/demo $(DEMO_FLAGS)

## test: every test, unit and end to end, against real apiservers of three versions
test: deps vet kube-binaries
	# and every benchmark once, after each package's tests in the same (race) build, so none
	# of them rots without a second build of every test binary (the numbers come from
	# `make bench`). tools/test.sh compiles every test first, then runs two test processes at
	# a time, longest first (SLOW_TEST_PKGS: test/e2e first), each job's output whole.
	@GO="$(GO)" SLOW_TEST_PKGS="$(SLOW_TEST_PKGS)" TEST_JOBS="$(TEST_JOBS)" tools/test.sh $(MODULE) $(TEST_FLAGS)

## test-envoy: the end-to-end suite against your Envoy binary (a release from 1.37 to
## 1.40), run as the chart runs it: make test-envoy ENVOY=/path/to/envoy; ends with a
## line of tests run, passed, skipped (each reason counted) and failed
## (RUN=regexp: only those tests)
test-envoy: envoy-given deps kube-binaries
	@echo "test-envoy: $$("$(ENVOY)" --version 2>&1 | head -n 1)"
	$(GO) build -o bin/testsummary ./test/cmd/testsummary
	bash -o pipefail -c 'KUBE_MVP_ENVOY="$(abspath $(ENVOY))" $(GO) test -count=1 -timeout $(TEST_TIMEOUT) -run "$(RUN)" -json ./test/e2e/ | bin/testsummary -title "kube-mvp on $(ENVOY)"'

envoy-given:
	@test -n "$(ENVOY)" && test -x "$(ENVOY)" || { echo "make test-envoy: set ENVOY to an Envoy binary, e.g. make test-envoy ENVOY=/usr/local/bin/envoy" >&2; exit 2; }

## unit: the tests that need no control plane (fast)
unit:
	$(GO) test -race -short ./...

## lint: gofmt over the tree, no comment block of 15+ lines nor line over 200 characters in
## internal/, cmd/, test/ (tools/lint/comments.sh), then staticcheck (STATICCHECK_VERSION,
## built from Go modules on first use) over every package, the node tests included; the
## checks a directory turns off are in its staticcheck.conf, with why
lint:
	@unformatted=$$("$$($(GO) env GOROOT)/bin/gofmt" -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*')); \
	if [ -n "$$unformatted" ]; then echo "make lint: not gofmt'ed (run gofmt -w on them):"; echo "$$unformatted"; exit 1; fi
	@sh tools/lint/comments.sh
	$(STATICCHECK) -tags node ./...

## vet: go vet ./... (make test runs it; make test-node vets the node tests)
vet:
	$(GO) vet ./...

## build: compile the product binaries into bin/ (stamped: bin/xds-server --version)
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

## images: the container images, without Docker: bin/images/<name>-<arch>.tar for `docker
## load` or `kind load image-archive`, and bin/images/oci/<name>/ (multi-arch);
## PUSH=1 pushes them to REGISTRY (docs/images.md)
images:
	$(GO) run ./tools/images -registry "$(REGISTRY)" -version "$(VERSION)" -commit "$(COMMIT)" \
		-arch "$(ARCHS)" -out bin/images $(if $(filter 1 true yes,$(PUSH)),-push)

## bench: the benchmarks behind the README's performance numbers (test/e2e's
## BenchmarkCRDBurst applies 2,000 CRDs to real apiservers: about 10 minutes)
bench:
	KUBE_MVP_CRD_BURST=200,1000,2000 KUBE_MVP_IDLE_WINDOW=60s \
		$(GO) test -run '^$$' -bench . -benchmem -count 3 -timeout 60m ./...

## golden: regenerate every golden file (internal/plan/testdata/<case>.plan.yaml: fixture
## -> plan; internal/snapshot/testdata/<case>/<type>.yaml: plan -> Envoy
## resources) from the current code, removing stale ones; review with git diff
## and commit (CI checks they are current)
golden:
	$(GO) test -count=1 -run '^TestGolden' $(addprefix ./,$(GOLDEN_PKGS)) -args -update

## golden-dirs: print the directories make golden writes (.ci/run checks them)
golden-dirs:
	@echo $(addsuffix testdata,$(GOLDEN_PKGS))

## envoy-protos: regenerate internal/oldestenvoy/oldest-envoy-protos.txt, every message, field and
## enum value of the oldest supported Envoy's protos, which snapshot.Build checks
## the configuration against (internal/oldestenvoy) (tools/envoyprotos, its own module). Run it when
## raising the minimum Envoy: `make envoy-protos ENVOY=v1.38.0` (the
## go-control-plane/envoy release of that Envoy), then set
## internal/xds.MinEnvoyVersion to match (a test checks), and commit both
envoy-protos:
	GO="$(GO)" tools/envoyprotos/gen.sh $(ENVOY)

## kube-binaries: build (or reuse from ~/.cache/kube-mvp) the kube-apiservers and etcd the tests
## run
kube-binaries:
	$(GO) run ./test/cmd/testcp build $(KUBE_VERSIONS)

## deps: what building the test data plane needs besides Go, libre2's headers and g++:
## installed with apt-get when missing (as root, or with sudo), as .ci/run does
deps:
	@test -f "$(RE2_HEADER)" && command -v g++ >/dev/null || { \
		echo "kube-mvp: the test data plane needs libre2 and g++ (cgo, test/dataplane/internal/re2): apt-get install libre2-dev g++"; \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		command -v apt-get >/dev/null && $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends libre2-dev g++ \
			|| { echo "kube-mvp: could not install them; install libre2-dev and g++ (or your system's RE2 headers and a C++ compiler)" >&2; exit 1; }; }

## node-binaries: build (or reuse from ~/.cache/kube-mvp) the test node's kubelet, kube-proxy,
## kube-controller-manager and kube-scheduler (make test-node builds them when missing)
node-binaries:
	$(GO) run ./test/cmd/testcp build-node

## node: a real one-node cluster (containerd, kubelet, kube-proxy, CoreDNS) with
## kube-mvp installed by Helm, up until Ctrl-C; root. NODE_FLAGS=--mode=sidecar
## for sidecar mode, --exit to stop after its checks
node: node-deps kube-binaries
	$(GO) run ./test/cmd/node $(NODE_FLAGS)

## test-node: the tests that install the chart on a real node (root; see README for the
## cost); NODE_FLAGS=--envoy-image=FILE.tar runs that Envoy image (docker save or OCI
## archive) instead of the stand-in's
test-node: node-deps kube-binaries
	$(GO) vet -tags node ./test/node/...
	$(if $(ENVOY_IMAGE),KUBE_MVP_ENVOY_IMAGE="$(abspath $(ENVOY_IMAGE))") $(GO) test -tags node -race -count=1 -timeout 45m ./test/node/...

## node-deps: install what a real one-node cluster needs (root; Debian's packages)
node-deps:
	@missing=; for p in $(NODE_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "kube-mvp: the test node needs$$missing"; \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing \
			|| { echo "kube-mvp: could not install$$missing" >&2; exit 1; }; \
	fi

## proto: regenerate Go code from proto/ (needs protoc, protoc-gen-go,
## protoc-gen-go-grpc)
proto:
	protoc -I proto --go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative proto/kubemvp/table/v1/table.proto

## clean: remove bin/
clean:
	rm -rf bin/
