# Everything runs inside .venv, created and filled on first use. Setup is keyed on the lock file:
# a second `make` with nothing changed only checks one stamp file.
PYTHON_BOOT ?= python3.11
VENV        ?= .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
# Stage commands in dvc.yaml say `python`: the venv's, for make targets and the DVC runs they start.
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export DO_NOT_TRACK = 1
export GX_ANALYTICS_ENABLED = False

.PHONY: setup run test test-all lint format bench-train bench-eval analyses report serve stop clean

setup: $(STAMP) .dvc/config

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	@touch $(STAMP)

# .dvc/ is committed; this only matters for a tree exported without it.
.dvc/config:
	$(VENV)/bin/dvc init --quiet $$(git rev-parse --git-dir >/dev/null 2>&1 || echo --no-scm)
	$(VENV)/bin/dvc config core.analytics false

run: setup
	$(VENV)/bin/dvc repro

test: setup
	$(PY) -m pytest -q

test-all: setup
	$(PY) -m pytest -q -m ''

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix . && $(VENV)/bin/ruff format .

clean:
	rm -rf .pytest_cache .ruff_cache
