# `make run` and `make test` bootstrap .venv from requirements.lock on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TPU_STAMP := $(VENV)/.installed-tpu
EXPERIMENT ?= experiments/tiny_moe.py
PYTEST_ARGS ?=

.PHONY: run test test-fast lint bench lock lock-accelerators install-cuda install-tpu clean

# pip installs uv (hashes checked, requirements-bootstrap.lock), and uv installs the lock: the same
# pinned packages and hashes as pip would, downloaded and unpacked in parallel (pip took about 3 of
# a fresh clone's 5 minutes; docs/recipes.md has the timings). Then the bytecode of what a run
# imports is compiled, once (scripts/compile_bytecode.py): compiling all 25,000 modules of the lock
# took 36 s; compiling none, every process compiles every module it imports where
# PYTHONDONTWRITEBYTECODE is set. The test suite imports far more: `make test` compiles them all.
UV := $(BIN)/uv pip install --quiet --python $(BIN)/python --require-hashes --no-deps
BYTECODE_STAMP := $(VENV)/.compiled-all

$(STAMP): requirements.lock requirements-bootstrap.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; set PYTHON=/path/to/python3.11" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r requirements-bootstrap.lock
	$(UV) -r requirements.lock
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps --no-build-isolation -e .
	$(BIN)/python scripts/compile_bytecode.py
	touch $(STAMP)

$(BYTECODE_STAMP): $(STAMP)
	$(BIN)/python scripts/compile_bytecode.py --all
	touch $(BYTECODE_STAMP)

run: $(STAMP)
	$(BIN)/python $(EXPERIMENT)

# The suite compiles for TPU slices on this CPU host (tests/steps/training/test_compile.py): libtpu too.
test: $(STAMP) $(TPU_STAMP) $(BYTECODE_STAMP) lint
	$(BIN)/pytest $(PYTEST_ARGS)

test-fast: $(STAMP) $(BYTECODE_STAMP)
	$(BIN)/pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py

# Accelerators: the CPU environment plus JAX's runtime for the hardware, at the same jax version
# (an overlay: requirements-cuda.lock / requirements-tpu.lock pin only what they add).
install-cuda: $(STAMP)
	$(UV) --compile-bytecode -r requirements-cuda.lock

install-tpu: $(TPU_STAMP)

$(TPU_STAMP): $(STAMP) requirements-tpu.lock
	$(UV) --compile-bytecode -r requirements-tpu.lock
	touch $(TPU_STAMP)

# Re-resolve requirements.in into requirements.lock (needs network access to PyPI).
lock: $(STAMP)
	$(BIN)/uv pip compile requirements.in -o requirements.lock --generate-hashes --python-version 3.11 --no-header
	$(BIN)/uv pip compile requirements-bootstrap.in -o requirements-bootstrap.lock --generate-hashes --python-version 3.11 --no-header

# Re-resolve the accelerator overlays against requirements.lock (run after `make lock`).
lock-accelerators: $(STAMP)
	$(BIN)/uv pip compile requirements-cuda.in -o requirements-cuda.lock --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-header
	$(BIN)/uv pip compile requirements-tpu.in -o requirements-tpu.lock --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_31 --no-header

clean:
	rm -rf $(VENV) drydock-runs .pytest_cache .ruff_cache .hypothesis
