# Every target creates .venv and installs what it needs by itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: the package alone (what the demo needs, seconds to install), then
# everything else on top of it (tests, lint, types, Ray, Redis, notebooks), so
# `make demo` stays light and a later `make test` adds only what is missing.
CORE := $(VENV)/.core-installed
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench notebooks clean

$(CORE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# Before its rename this project installed as `provider-router` (the package
	@# index's name for another project): one editable install of it, not two.
	@$(BIN)/pip uninstall --quiet --yes provider-router >/dev/null 2>&1 || true
	$(BIN)/pip install --quiet -e .
	touch $(CORE)

$(STAMP): $(CORE)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,redis,notebooks,ray]'
	touch $(STAMP)

demo: $(CORE)
	$(BIN)/provider-router demo

lint: $(STAMP)
	$(BIN)/ruff check provider_router tests bench
	$(BIN)/ruff format --check provider_router tests bench

typecheck: $(STAMP)
	$(BIN)/mypy provider_router

# Two workers, each test file whole on one (its simulator, servers and files its own):
# most tests wait on sockets and clocks, so two halve the wall time on two cores. The
# Ray suite runs after, alone: one local cluster for the whole session.
unit: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile --ignore=tests/ray
	$(BIN)/pytest -q tests/ray

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m bench

notebooks: $(STAMP)
	$(BIN)/python examples/render_notebooks.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
