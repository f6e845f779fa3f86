# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench clean venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/sluice broker --data-dir ./sluice-data

test: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples tools
	$(VENV)/bin/mypy
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples tools
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) sluice-data .pytest_cache build *.egg-info src/*.egg-info
