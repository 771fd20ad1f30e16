# Every target creates .venv and installs what it needs by itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench notebooks clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,redis,notebooks,ray]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/provider-router demo

lint: $(STAMP)
	$(BIN)/ruff check provider_router tests bench
	$(BIN)/ruff format --check provider_router tests bench

typecheck: $(STAMP)
	$(BIN)/mypy provider_router

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m bench

notebooks: $(STAMP)
	$(BIN)/python examples/render_notebooks.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
