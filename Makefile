PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench system-deps clean

# The sandbox node needs bubblewrap from Debian; the script is a no-op when it is there.
system-deps:
	@bash scripts/system-deps.sh

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP) system-deps
	$(BIN)/gateway serve --config config.toml

test: $(STAMP) system-deps
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python bench/run.py --quick --out bench/results/latest.md

clean:
	rm -rf $(VENV) data .pytest_cache
