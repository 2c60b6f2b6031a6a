# deployctl: `make demo` runs the main job on the local test host, `make test` runs every check.
# Both do their own set-up on a fresh Debian 12 machine (venv, Python packages, apt packages).

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
APT_PKGS := $(shell cat tests/apt-packages.txt)

.DEFAULT_GOAL := help
.PHONY: help demo test quick lint faults bench testhost-up testhost-down clean oracle real-sglang accuracy

help:
	@echo "make demo           raise the context on the local test host, then watch a rollback"
	@echo "make test           ruff, mypy and pytest (pure and integration tiers)"
	@echo "make quick          the pure tests only (seconds)"
	@echo "make faults         the fault matrix on the real test host; ends with one JSON line"
	@echo "make bench          deployctl against Ansible and the manual path; ends with one JSON line"
	@echo "make oracle         build the SGLang 0.5.23 oracle venv (once per machine, about 1.4 GB)"
	@echo "make real-sglang    build the real SGLang 0.5.23 venv on CPU torch, its PD add-on and tiny model (once, 1.7 GB)"
	@echo "make accuracy       write docs/accuracy.md: the planner against public starts and SGLang's own code"
	@echo "make testhost-up    boot a local test host and print how to reach it"
	@echo "make testhost-down  stop it"

$(BIN)/.stamp: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# SGLang's own sizing code on the CPU (tests/oracle): built once per machine outside the work tree.
ORACLE_VENV ?= $(or $(DEPLOYCTL_ORACLE_VENV),$(HOME)/.cache/deployctl/oracle-sglang-0.5.23)

$(ORACLE_VENV)/.oracle-stamp: tests/oracle/requirements.txt tests/oracle/build-venv.sh
	DEPLOYCTL_ORACLE_VENV=$(ORACLE_VENV) sh tests/oracle/build-venv.sh

oracle: $(ORACLE_VENV)/.oracle-stamp

# The real SGLang 0.5.23 (PyPI) on CPU torch and a tiny random-weight model (tests/realsglang): built once
# per machine outside the work tree, run by the test host's systemd (tests/realhost.py).
REAL_SGLANG_VENV ?= $(or $(DEPLOYCTL_REAL_SGLANG_VENV),$(HOME)/.cache/deployctl/real-sglang-0.5.23)
REAL_SGLANG_MODEL ?= $(or $(DEPLOYCTL_REAL_SGLANG_MODEL),$(HOME)/.cache/deployctl/real-sglang-tiny-model)
REAL_SGLANG_PD ?= $(or $(DEPLOYCTL_REAL_SGLANG_PD),$(HOME)/.cache/deployctl/real-sglang-pd-0.5.23)
export DEPLOYCTL_REAL_SGLANG_VENV := $(REAL_SGLANG_VENV)
export DEPLOYCTL_REAL_SGLANG_MODEL := $(REAL_SGLANG_MODEL)
export DEPLOYCTL_REAL_SGLANG_PD := $(REAL_SGLANG_PD)

$(REAL_SGLANG_VENV)/.real-stamp: tests/realsglang/requirements.txt tests/realsglang/build-venv.sh
	sh tests/realsglang/build-venv.sh

# PD's add-on (Mooncake over TCP, libibverbs, sglang-router) in a folder of its own with its own stamp;
# installed by the venv's pip, but no rebuild when the venv is rebuilt (wheels only, no paths kept).
$(REAL_SGLANG_PD)/.pd-stamp: tests/realsglang/pd-requirements.txt tests/realsglang/build-pd.sh | $(REAL_SGLANG_VENV)/.real-stamp
	sh tests/realsglang/build-pd.sh

# make_model.py keeps a folder whose stamp matches its recipe: cheap to run every time.
real-sglang: $(REAL_SGLANG_VENV)/.real-stamp $(REAL_SGLANG_PD)/.pd-stamp
	$(REAL_SGLANG_VENV)/bin/python tests/realsglang/make_model.py $(REAL_SGLANG_MODEL)

.apt-stamp: tests/apt-packages.txt
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
		if [ -n "$$missing" ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		fi; \
	else echo "not root or no apt-get: integration tests may be skipped"; fi
	touch $@

lint: $(BIN)/.stamp
	$(BIN)/ruff format --check agent tests
	$(BIN)/ruff check agent tests
	$(BIN)/mypy agent
	$(BIN)/python -m tests.house

# The published accuracy report, from committed data only (tests/data): no oracle venv, no GPU.
accuracy: $(BIN)/.stamp
	$(BIN)/python -m tests.accuracy

quick: $(BIN)/.stamp
	$(BIN)/pytest -q -m "not integration"

# Two workers, a test file each (an integration module keeps its test host on one), then the real-SGLang
# tests and those that measure the machine's page cache alone (one real server starting at a time on a
# 2-core machine; no other worker's test host reading the shared weight files); --durations: CI's log names
# the slowest tests, so its time limit is watched, not guessed.
test: $(BIN)/.stamp .apt-stamp oracle real-sglang lint
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not real_sglang and not alone" --durations=25; tiers=$$?; \
	$(BIN)/pytest -q -m "real_sglang or alone" --durations=10; real=$$?; \
	test $$tiers -eq 0 && test $$real -eq 0

faults: $(BIN)/.stamp .apt-stamp oracle real-sglang
	$(BIN)/python -m tests.faults

bench: $(BIN)/.stamp .apt-stamp oracle real-sglang
	$(BIN)/python -m tests.bench

demo: $(BIN)/.stamp .apt-stamp oracle real-sglang
	$(BIN)/python -m tests.demo

testhost-up: $(BIN)/.stamp .apt-stamp oracle real-sglang
	$(BIN)/python -m tests.testhost up

testhost-down: $(BIN)/.stamp
	$(BIN)/python -m tests.testhost down

clean:
	rm -rf $(VENV) .apt-stamp .pytest_cache .mypy_cache .ruff_cache build *.egg-info
