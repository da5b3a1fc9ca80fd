# Two commands on a fresh clone: `make demo` (train the CPU demo) and `make test` (the test suite).
# Both create .venv themselves: CPU PyTorch 2.13.0 (pinned: an unpinned torch pulls a multi-GB CUDA build).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: install
	$(VENV)/bin/depthlab train

test: install
	$(PY) -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache
