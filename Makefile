# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The suite mostly waits (fsyncs, broker and JVM start-ups, receipts), so it runs on four
# pytest-xdist workers even on two cores; each Spark group (tests/spark/conftest.py) stays on
# one worker, so at most two Spark JVMs run at once. `make test PYTEST_WORKERS=0`: one process.
PYTEST_WORKERS ?= 4

.PHONY: run test lint bench clean venv accel pure test-accel

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
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples tools
	$(VENV)/bin/mypy

# The optional accelerated build (setup.py): the hottest modules compiled with mypyc, in place
# beside their sources, which Python then imports first; `make pure` removes them again.
# `make test-accel` runs the suite over the compiled modules and leaves the tree pure.
accel: $(STAMP)
	SLUICEMQ_MYPYC=1 $(PY) setup.py -q build_ext --inplace --build-temp build/accel

pure:
	find src -name '*.cpython-*.so' -delete

test-accel: accel
	SLUICE_EXPECT_ACCELERATED=1 $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); \
		status=$$?; $(MAKE) --no-print-directory pure; exit $$status

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) sluice-data .pytest_cache build *.egg-info src/*.egg-info
	find src -name '*.cpython-*.so' -delete
