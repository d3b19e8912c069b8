# Everything a newcomer needs: `make run` (install + stack + services), `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
PROTOS := $(wildcard protos/mailqueue/v1/*.proto)
#: Downloads and builds, once per machine (stack/stack.sh reads the same variable).
CACHE := $(or $(MAILQUEUE_CACHE_DIR),$(HOME)/.cache/mailqueue-stack)
BUF_VERSION := v1.75.0
BUF := $(CACHE)/buf-$(BUF_VERSION)/buf
KUSTOMIZE_VERSION := v5.7.1
KUSTOMIZE := $(CACHE)/kustomize-$(KUSTOMIZE_VERSION)/kustomize
export KUSTOMIZE
GO_TOOLS := $(CACHE)/go-tools
GHZ_VERSION := v0.93.0
GHZ := $(CACHE)/ghz-$(GHZ_VERSION)/ghz
NODE_MODULES := tests/contract/node/node_modules/.installed
DOCS_NODE_MODULES := docs/node_modules/.installed
STUBS := mailqueue/.generated

.PHONY: docs env install proto up down status run stop sweep ghz bench-enqueue spark-connector test test-lanes test-unit test-integration test-k8s test-contract test-cluster test-kubernetes up-cluster down-cluster kube-up kube-down kube-install image contract lint kustomize clean

install: .venv/.installed

# The Python environment with the code generator first (grpcio-tools), then the stubs, then the
# editable install: the installed entry points (.venv/bin/mailq) find the generated `mailqueue`
# package from any directory.
.venv/.python: constraints.txt
	@stack/prerequisites.sh
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -c constraints.txt grpcio-tools
	touch $@

.venv/.installed: pyproject.toml constraints.txt .venv/.python $(STUBS)
	.venv/bin/pip install -q -c constraints.txt -e '.[dev,spark,docs]'
	touch $@

# Every language's stubs from protos/ with one template (buf.gen.yaml): Python for the services,
# Go and Node for the contract clients. Generated, never committed: protos/ is the only source.
$(STUBS): $(PROTOS) buf.gen.yaml services/contract/codegen.py .venv/.python $(BUF) $(GO_TOOLS)/protoc-gen-go $(GO_TOOLS)/protoc-gen-go-grpc $(NODE_MODULES)
	rm -rf mailqueue tests/contract/go/mailqueue tests/contract/node/gen
	PATH="$(GO_TOOLS):$(CURDIR)/tests/contract/node/node_modules/.bin:$$PATH" $(BUF) generate
	touch $@

proto: $(STUBS)

up: install
	stack/stack.sh up

down:
	stack/services.sh stop
	stack/kube/kube.sh down
	stack/stack.sh down
	stack/stack.sh down --cluster

# Every node: the single-node stack, the clusters (when started: make up-cluster), the services.
status:
	-stack/stack.sh status
	-stack/stack.sh status --cluster
	-stack/kube/kube.sh status
	stack/services.sh status

# The clusters: 3 Cassandra nodes, 3 clustered RabbitMQ nodes, Spark standalone (master + 2
# workers). `stack/stack.sh cluster-env` prints what services need to use them.
up-cluster: install spark-connector
	stack/stack.sh up --cluster

down-cluster:
	stack/stack.sh down --cluster

# Install, start the stack and the services (the four and webhook_svc), print where each listens.
run: up
	stack/services.sh start

stop:
	stack/services.sh stop

# The tools on PATH and the local CA for this shell: eval "$(make env)" in the project folder puts
# .venv/bin (mailq) and the go tools (grpcurl) first on PATH and sets MAILQ_TLS_CA (what mailq and
# the docs' grpcurl lines trust). Prints exports only, installs nothing. From elsewhere (a shell
# profile): eval "$(make -s -C /path/to/mailqueue env)" (-s: no "Entering directory" lines).
env:
	@printf 'export PATH="%s:%s:$$PATH"\n' "$(CURDIR)/.venv/bin" "$(GO_TOOLS)"
	@printf 'export MAILQ_TLS_CA="%s"\n' "$${MAILQUEUE_STACK_DIR:-$(CURDIR)/.stack}/pki/ca.crt"

# The test command (README, CI): installs, starts the stack and the services if they are down,
# lints the protos (buf lint + buf breaking), builds the docs site (mkdocs --strict), builds the
# images and the single-node Kubernetes (started by its tier, stopped after it),
# and runs every tier (Python, Go, Node, grpcurl, the offline k8s checks, the Kubernetes tier, then
# the cluster tier, which starts the clusters itself when it gets there).
# --session-timeout: after an hour no further test starts (one already running ends by its own
# limit), so a run that something slowed down still ends with its summary, inside CI's 90 minutes.
test: up lint docs kustomize contract spark-connector image kube-install
	$(PY) -m pytest --junitxml=.stack/logs/test-results.xml --session-timeout=3600

# The same tests in lanes (tests/lanes.py): unit, contract and integration beside the cluster
# tier, the Spark sweep and the image/Kubernetes start-up; then alone the outage tests and the
# Kubernetes tier. Not yet the test command: on 2 cores the lanes are CPU-bound and three
# timing-sensitive tests failed under the contention (docs/pages/development/testing.md).
test-lanes: up lint docs kustomize contract spark-connector
	$(PY) -m tests.lanes

# Fast tier: pure logic, no servers.
test-unit: install
	$(PY) -m pytest -m "not integration and not k8s and not cluster and not kubernetes"

# A real single-node Kubernetes (v1.34, built from the Go module proxy once per machine: about 7
# minutes on 2 cores; containerd and etcd from Debian), CoreDNS, metrics-server, kube-router for
# NetworkPolicy, the images of `make image` imported, the local stack forwarded to pods on the
# node's bridge address 10.244.0.1. Warm: seconds. `make kube-down` stops exactly what it started.
kube-up: up image
	stack/kube/kube.sh up
	stack/kube/kube.sh import-images

kube-down:
	stack/kube/kube.sh down

# The cluster's binaries and packages (built and installed once per machine), nothing started.
kube-install:
	stack/kube/kube.sh install

# The local overlay applied with `kubectl apply -k` on that cluster, driven from pods: probes,
# clients by Service name, autoscaling, a rolling update under load, readiness, disruption
# budgets, the sweep CronJob, NetworkPolicies (tests/kubernetes/).
test-kubernetes: kube-up contract
	$(PY) -m pytest -m kubernetes

# Both Dockerfile targets built with podman (installs podman and the base-image stand-ins, once
# per machine; about 3 minutes the first time, seconds after): mailqueue, mailqueue-sweep.
image:
	stack/image.sh build

# Node faults under load on the clusters, and the sweep on Spark standalone (its time: the README's tests table).
test-cluster: up-cluster
	$(PY) -m pytest -m cluster

# Offline validation of the Kubernetes overlays (tests/kubernetes/manifests/).
test-k8s: install kustomize
	$(PY) -m pytest -m k8s

test-integration: up contract spark-connector
	$(PY) -m pytest -m integration

# The Spark Cassandra Connector jars for the retention sweep (Maven Central, once per machine).
spark-connector:
	@spark/connector.sh >/dev/null

# The retention sweep against the local stack: make sweep ARGS="--dry-run". With the sweep's own
# credentials and the stack's CA (stack/stack.sh env sweep): the local backends take TLS only.
sweep: up spark-connector
	@set -a; eval "$$(stack/stack.sh env sweep)"; set +a; $(PY) -m spark.sweep $(ARGS)

$(BUF):
	@echo "[make] building buf $(BUF_VERSION) with go install (once per machine)"
	GOBIN=$(dir $(BUF)) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(GO_TOOLS)/protoc-gen-go $(GO_TOOLS)/protoc-gen-go-grpc $(GO_TOOLS)/grpcurl:
	@echo "[make] building protoc-gen-go, protoc-gen-go-grpc and grpcurl with go install (once per machine)"
	GOBIN=$(GO_TOOLS) go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(GO_TOOLS) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	GOBIN=$(GO_TOOLS) go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4

grpcurl: $(GO_TOOLS)/grpcurl

# Benchmarks (docs/pages/benchmarks.md). ghz, a gRPC load client in Go, drives the enqueue
# bench's ghz phase (bench/ghz.py finds it here, or MAILQUEUE_GHZ names another).
$(GHZ):
	@echo "[make] building ghz $(GHZ_VERSION) with go install (once per machine)"
	GOBIN=$(dir $(GHZ)) go install github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)

ghz: $(GHZ)

# The enqueue paths against the direct writes, in alternating order over rounds, with ghz as a
# second client: make bench-enqueue ARGS="--rounds 3 --seconds 20".
bench-enqueue: up ghz
	$(PY) -m bench.enqueue_rounds $(ARGS)

# The docs site (docs/mkdocs.yml) into docs/site, strict: a warning (a broken link or anchor, a
# page missing from the navigation) fails the build (never with --quiet: it hides the warnings
# from the strict count). The API, mailq and metrics reference pages are
# generated during the build (docs/hooks/reference.py); Mermaid comes from npm (docs/package.json).
docs: install $(DOCS_NODE_MODULES)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -f docs/mkdocs.yml

$(DOCS_NODE_MODULES): docs/package-lock.json
	cd docs && npm ci --no-audit --no-fund
	touch $@

# Node dependencies (npm ci), protoc-gen-es among them.
$(NODE_MODULES): tests/contract/node/package-lock.json
	cd tests/contract/node && npm ci --no-audit --no-fund
	touch $@

contract: $(STUBS) $(NODE_MODULES) $(GO_TOOLS)/grpcurl

test-contract: up contract
	$(PY) -m pytest tests/contract

$(KUSTOMIZE):
	@echo "[make] building kustomize $(KUSTOMIZE_VERSION) with go install (once per machine)"
	GOBIN=$(dir $(KUSTOMIZE)) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

kustomize: $(KUSTOMIZE)

# ruff (pyflakes, pycodestyle, sorted imports: pyproject.toml), the layers of services/ (no
# import circle, no import up a layer), import-linter's contracts (pyproject.toml: the layers,
# a domain without grpc, pika, cassandra, minio, tenacity or asyncio, use-cases and servicers
# without adapters), buf lint, and buf breaking
# against the previous commit (a change that breaks clients fails).
lint: $(BUF) install
	.venv/bin/ruff check .
	$(PY) -m tests.layers
	.venv/bin/lint-imports
	cd protos && $(BUF) lint
	if git rev-parse -q --verify HEAD~1 >/dev/null && git cat-file -e HEAD~1:protos/buf.yaml 2>/dev/null; then \
	  $(BUF) breaking protos --against '.git#ref=HEAD~1,subdir=protos'; \
	else echo "[make] buf breaking: no previous commit with protos/ to compare with"; fi

clean:
	rm -rf .venv mailqueue tests/contract/go/mailqueue tests/contract/node/gen docs/site
