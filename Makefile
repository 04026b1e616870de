# Two commands for newcomers (see README):  make run   |   make test
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON := $(BIN)/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=
# Test processes (pytest-xdist): a test file's tests stay in one process, so its module fixtures run once.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: setup data run test test-slow test-manual test-full test-all lint bench clean
.PHONY: models

# Java first: Spark cannot start without 17+, so a missing or old one fails before pip downloads anything.
.PHONY: check-java
check-java:
	@sh scripts/check_java.sh

# $(call timed,WHAT,COMMAND): a line when a setup step starts and one with its duration when it ends, so a
# first setup (minutes of downloads) says what it is waiting for.
timed = t0=$$(date +%s); echo "setup: $(1) ..."; $(2) && echo "setup: $(1) done in $$(($$(date +%s) - t0)) s"

$(STAMP): pyproject.toml | check-java
	@$(call timed,Python packages (PyPI -> $(VENV)/), \
	  { test -x $(PYTHON) || $(PY) -m venv $(VENV); } && \
	  $(PYTHON) -m pip install -q --upgrade pip && \
	  $(PYTHON) -m pip install -q -e ".[dev]")
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

# Python packages, the Delta jars (once from Maven Central, then offline) and the tiny offline models.
# The start time is taken when make reads this file, before the steps above run.
setup: SETUP_T0 := $(shell date +%s)
setup: $(STAMP)
	@$(call timed,Delta jars (Maven Central -> .jars/),$(PYTHON) -m jobs.infra.jars)
	@$(call timed,tiny offline models (-> models/),$(PYTHON) -m jobs.infra.tiny_models --out models)
	@echo "setup: done in $$(($$(date +%s) - $(SETUP_T0))) s"

# The public datasets (conf/datasets.yaml) from their pinned upstreams, or FROM=DIR a local mirror; each verified.
data: setup
	$(PYTHON) -m jobs.infra.data fetch --all $(if $(FROM),--from $(FROM))

# The `small` model profile's trained models, each built only when missing (its training record marks a finished
# run): the NLI model (models/nli-small: the pip MiniLM-L6 fine-tuned on every NLI source of the catalogue, SICK
# train+trial, ANLI dev r1-r3, MNLI dev-matched, SNLI dev, JOCI, SciTail and counterfactual SNLI, 2 epochs,
# python -m jobs.training.train_nli) and the PVI models g and g' (models/pvi-small/<kind>: small T5s from random
# weights on EntailmentBank task_1 train, early-stopped on dev, python -m jobs.training.train_pvi; times in the
# README). `make run` uses the profile once all are built.
# Registered pretrained models (conf/model_registry.yaml, python -m jobs.infra.models) are fetched before any
# training, each only when its folder lacks a finished fetch: gemma3-270m (a pretrained causal LM, ~2.5 min), the
# profile's information-gain model (conf/models/small.yaml says why it replaced a scratch-trained T5).
models: setup
	$(PYTHON) -m jobs.infra.data fetch sick p3_heldout entailment_bank mnli_dev_matched snli_dev joci scitail cf_snli \
	  $(if $(FROM),--from $(FROM))
	@test -f models/gemma3-270m/model_record.json || $(PYTHON) -m jobs.infra.models fetch gemma3-270m
	@test -f models/nli-small/train_nli.json || $(PYTHON) -m jobs.training.train_nli $(ARGS)
	@test -f models/pvi-small/g/train_pvi.json || \
	  $(PYTHON) -m jobs.training.train_pvi --set models.profile=small --set train_pvi.kind=g $(ARGS)
	@# g' sees one input ("None ->") for every pair: its checkpoint is chosen on dev loss, not on the ROUGE-L of
	@# the one sentence it generates (docs/PVI.md).
	@test -f models/pvi-small/g_null/train_pvi.json || \
	  $(PYTHON) -m jobs.training.train_pvi --set models.profile=small --set train_pvi.kind=g_null \
	  --set train_pvi.select_on=loss $(ARGS)

# The main job on the bundled sample lake, embedded Spark, offline model profile.
run: setup
	$(PYTHON) -m jobs.receval.pipeline $(ARGS)

# Default test set (budget 8 minutes on 2 cores, docs/TESTING.md); slow and cluster tests run in CI too.
test: setup
	$(PYTHON) -m pytest $(XDIST) -m "not slow and not cluster and not gpu and not full and not manual" $(PYTEST_ARGS)

# Slow and cluster tests; the cluster file runs in one process while the others take the other. Exit code 5
# (nothing collected) is not a failure here.
test-slow: setup
	$(PYTHON) -m pytest $(XDIST) -m "(slow or cluster) and not gpu and not full and not manual" $(PYTEST_ARGS) || [ $$? -eq 5 ]

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
