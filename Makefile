# Two commands for newcomers (see README):  make run   |   make test
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON := $(BIN)/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: setup run test test-slow test-manual test-full test-all lint bench clean

$(STAMP): pyproject.toml
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e ".[dev]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# Python packages, the Delta jars (once from Maven Central, then offline) and the tiny offline models.
setup: $(STAMP)
	$(PYTHON) -m jobs.jars
	$(PYTHON) -m jobs.tiny_models --out models

# The main job on the bundled sample lake, embedded Spark, offline model profile.
run: setup
	$(PYTHON) -m jobs.pipeline $(ARGS)

# Default test set (about 15 minutes on 2 cores); slow and cluster tests run in CI too.
test: setup
	$(PYTHON) -m pytest -m "not slow and not cluster and not gpu and not full and not manual" $(PYTEST_ARGS)

# Exit code 5 (nothing collected) is not a failure here.
test-slow: setup
	$(PYTHON) -m pytest -m "(slow or cluster) and not gpu and not full and not manual" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# Long extra checks kept out of CI's time budget (local[1] submit, ingest partition cases); run by hand.
test-manual: setup
	$(PYTHON) -m pytest -m "manual and not gpu" $(PYTEST_ARGS)

# The CoT evaluation over every BBH, MGSM and P3 example, both modes, tiny T5 (~14 min on 2 cores).
test-full: setup
	$(PYTHON) -m pytest -m full -s $(PYTEST_ARGS)

test-all: test test-slow

lint: setup
	$(BIN)/ruff check jobs udfs schemas tests bench scripts

bench: setup
	$(PYTHON) bench/run.py $(ARGS)

clean:
	rm -rf lake mlruns.db mlartifacts spark-warehouse metastore_db derby.log
