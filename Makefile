# Everything a newcomer needs: `make run` (install + stack + services), `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
PROTOS := $(wildcard protos/mailqueue/v1/*.proto)
BUF_VERSION := v1.75.0
BUF := $(HOME)/.cache/mailqueue-stack/buf-$(BUF_VERSION)/buf
KUSTOMIZE_VERSION := v5.7.1
KUSTOMIZE := $(HOME)/.cache/mailqueue-stack/kustomize-$(KUSTOMIZE_VERSION)/kustomize
export KUSTOMIZE

.PHONY: install proto up down status run stop sweep spark-connector test test-unit test-integration test-k8s test-contract contract lint kustomize clean

install: .venv/.installed mailqueue/v1/.generated

# The stubs are generated before the editable install, so that the installed entry points
# (.venv/bin/mailq) find the generated `mailqueue` package from any directory.
.venv/.installed: pyproject.toml constraints.txt
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -c constraints.txt grpcio-tools
	$(PY) -m services.codegen
	.venv/bin/pip install -q -c constraints.txt -e '.[dev,spark]'
	touch $@

# Python stubs are generated, not committed: protos/ is the only source of truth.
mailqueue/v1/.generated: $(PROTOS) .venv/.installed
	$(PY) -m services.codegen
	touch $@

proto: mailqueue/v1/.generated

up: install
	stack/stack.sh up

down:
	stack/services.sh stop
	stack/stack.sh down

status:
	stack/stack.sh status; stack/services.sh status

# Install, start the stack and the four services, print where each listens.
run: up
	stack/services.sh start

stop:
	stack/services.sh stop

# The test command (README, CI): installs, starts the stack and the services if they are down,
# lints the protos (buf lint + buf breaking), and runs every tier (Python, Go, Node, grpcurl, k8s).
test: up lint kustomize contract spark-connector
	$(PY) -m pytest

# Fast tier: pure logic, no servers.
test-unit: install
	$(PY) -m pytest -m "not integration and not k8s"

# Offline validation of the Kubernetes overlays.
test-k8s: install kustomize
	$(PY) -m pytest -m k8s

test-integration: up contract spark-connector
	$(PY) -m pytest -m integration

# The Spark Cassandra Connector jars for the retention sweep (Maven Central, once per machine).
spark-connector:
	@spark/connector.sh >/dev/null

# The retention sweep against the local stack: make sweep ARGS="--dry-run".
sweep: up spark-connector
	$(PY) -m spark.sweep $(ARGS)

$(BUF):
	@echo "[make] building buf $(BUF_VERSION) with go install (once per machine)"
	GOBIN=$(dir $(BUF)) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

GO_TOOLS := $(HOME)/.cache/mailqueue-stack/go-tools
GO_STUBS := tests/contract/go/mailqueue/v1/.generated
WELL_KNOWN = $(shell $(PY) -c 'import grpc_tools, os; print(os.path.dirname(grpc_tools.__file__) + "/_proto")')

$(GO_TOOLS)/protoc-gen-go $(GO_TOOLS)/protoc-gen-go-grpc $(GO_TOOLS)/grpcurl:
	@echo "[make] building protoc-gen-go, protoc-gen-go-grpc and grpcurl with go install (once per machine)"
	GOBIN=$(GO_TOOLS) go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(GO_TOOLS) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	GOBIN=$(GO_TOOLS) go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4

grpcurl: $(GO_TOOLS)/grpcurl

# Go stubs (protoc from grpcio-tools with the Go plugins), Node dependencies (npm ci).
$(GO_STUBS): $(PROTOS) .venv/.installed $(GO_TOOLS)/protoc-gen-go $(GO_TOOLS)/protoc-gen-go-grpc
	$(PY) -m grpc_tools.protoc -Iprotos -I$(WELL_KNOWN) \
	  --plugin=protoc-gen-go=$(GO_TOOLS)/protoc-gen-go --plugin=protoc-gen-go-grpc=$(GO_TOOLS)/protoc-gen-go-grpc \
	  --go_out=tests/contract/go --go_opt=module=github.com/mailqueue/mailqueue/gen/go \
	  --go-grpc_out=tests/contract/go --go-grpc_opt=module=github.com/mailqueue/mailqueue/gen/go \
	  $(PROTOS)
	touch $@

tests/contract/node/node_modules/.installed: tests/contract/node/package-lock.json
	cd tests/contract/node && npm ci --no-audit --no-fund
	touch $@

contract: $(GO_STUBS) tests/contract/node/node_modules/.installed $(GO_TOOLS)/grpcurl

test-contract: up contract
	$(PY) -m pytest tests/contract

$(KUSTOMIZE):
	@echo "[make] building kustomize $(KUSTOMIZE_VERSION) with go install (once per machine)"
	GOBIN=$(dir $(KUSTOMIZE)) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

kustomize: $(KUSTOMIZE)

# buf lint, and buf breaking against the previous commit (a change that breaks clients fails).
lint: $(BUF)
	cd protos && $(BUF) lint
	if git rev-parse -q --verify HEAD~1 >/dev/null && git cat-file -e HEAD~1:protos/buf.yaml 2>/dev/null; then \
	  $(BUF) breaking protos --against '.git#ref=HEAD~1,subdir=protos'; \
	else echo "[make] buf breaking: no previous commit with protos/ to compare with"; fi

clean:
	rm -rf .venv mailqueue
