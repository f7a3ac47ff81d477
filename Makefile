# Set-up, demo and tests. `make demo` and `make test` are the README's quick start.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test test-fast lint typecheck gpu-check peer-wheels

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/python examples/demo.py

# What CI runs (.ci/run): lint, format, types, then every test (GPU tests skip without CUDA),
# one pytest worker per core, each test file on one worker (its module fixtures built once).
test: lint typecheck
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# For local work: the same checks without the multi-process and slow tests.
test-fast: lint typecheck
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not slow and not ddp"

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

# One command on a GPU machine: the headline comparison first (ResNet-152 and a GPT-2-medium
# shape, 450 s each), then the CUDA tests, the same under TORCH_CUDA_SANITIZER=1, the benchmarks;
# evidence under bench/results/<device>/ (exits 2 without CUDA).
gpu-check: venv
	$(BIN)/python -m bench.gpu_check

# torchtune and what its import needs beyond a lent GPU machine's image, as Python 3.12 Linux
# wheels in .whl/ (bench/peer-wheels.txt; bench/README.md says how a device command installs them).
PEER_PLATFORMS = $(foreach p,manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1,--platform $(p)_x86_64)
peer-wheels: venv
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(PEER_PLATFORMS) -d .whl -r bench/peer-wheels.txt
