# Everything a newcomer needs: `make run` (install + stack + services), `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
PROTOS := $(wildcard protos/mailqueue/v1/*.proto)
BUF_VERSION := v1.75.0
BUF := $(HOME)/.cache/mailqueue-stack/buf-$(BUF_VERSION)/buf
KUSTOMIZE_VERSION := v5.7.1
KUSTOMIZE := $(HOME)/.cache/mailqueue-stack/kustomize-$(KUSTOMIZE_VERSION)/kustomize
export KUSTOMIZE

.PHONY: install proto up down status run stop test test-unit test-integration test-k8s lint kustomize clean

install: .venv/.installed mailqueue/v1/.generated

.venv/.installed: pyproject.toml constraints.txt
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -c constraints.txt -e '.[dev]'
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

# The test command (README, CI): installs, starts the stack if it is down, runs every tier.
test: up lint kustomize
	$(PY) -m pytest

# Fast tier: pure logic, no servers.
test-unit: install
	$(PY) -m pytest -m "not integration and not k8s"

# Offline validation of the Kubernetes overlays.
test-k8s: install kustomize
	$(PY) -m pytest -m k8s

test-integration: up
	$(PY) -m pytest -m integration

$(BUF):
	@echo "[make] building buf $(BUF_VERSION) with go install (once per machine)"
	GOBIN=$(dir $(BUF)) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(KUSTOMIZE):
	@echo "[make] building kustomize $(KUSTOMIZE_VERSION) with go install (once per machine)"
	GOBIN=$(dir $(KUSTOMIZE)) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

kustomize: $(KUSTOMIZE)

lint: $(BUF)
	cd protos && $(BUF) lint

clean:
	rm -rf .venv mailqueue
