# Set-up, demo and tests. `make demo` and `make test` are the README's quick start.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/python examples/demo.py

test: venv
	$(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
