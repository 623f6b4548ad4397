PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-quick lint bench soak dist system-deps clean

# The sandbox node needs bubblewrap from Debian; the script is a no-op when it is there.
system-deps:
	@bash scripts/system-deps.sh

# System packages first: the install compiles storage/_batch.c (gcc, libsqlite3-dev).
$(STAMP): pyproject.toml storage/_batch.c storage/_walbuf.c storage/_walbuf.h | system-deps
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# `make run PORT=9000 HOST=0.0.0.0` overrides config.toml's [server] host and port.
run: $(STAMP) system-deps
	$(BIN)/gateway serve --config config.toml $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

# Bytecode written once before the tests: where PYTHONDONTWRITEBYTECODE is set (this
# machine image sets it), every gateway and CLI process a test starts compiled our sources
# again, 0.3 s of a 1.0 s start.
test: $(STAMP) system-deps
	$(BIN)/python -m compileall -q gateway pipeline storage tests
	$(BIN)/pytest -q -n 3 --dist loadfile --durations=15  # many tests wait on real processes: 3 workers on 2 cores

# The inner loop: everything but the suites that build the binary, drive a browser, run
# several instances or sandboxed programs (CI runs `make test`, all of them).
QUICK_SKIPS := tests/operations/test_single_binary.py tests/console/test_browser.py \
	tests/console/test_agents_browser.py tests/console/test_sso_browser.py \
	tests/console/test_console_wave3_browser.py tests/console/test_run_transcript_browser.py \
	tests/scaleout tests/workers tests/sandbox tests/sandbox_e2e
test-quick: $(STAMP)
	$(BIN)/pytest -q -n 3 --dist loadfile $(addprefix --ignore=,$(QUICK_SKIPS))

# mypy and PyInstaller find `model_gateway` through a link to this checkout (the editable
# install maps the package with an import hook that neither runs).
PKG_PATH := $(VENV)/pkg-path
$(PKG_PATH)/model_gateway: $(STAMP)
	mkdir -p $(PKG_PATH) && ln -sfn "$(CURDIR)" $(PKG_PATH)/model_gateway

lint: $(STAMP) $(PKG_PATH)/model_gateway
	$(BIN)/ruff check .
	$(BIN)/mypy  # strict on the whole package: gateway/, pipeline/, storage/ (pyproject.toml)

# One executable holding the server, the CLI and the sandbox node (`make dist DIST=folder`).
# The vendor libraries of the provider kinds (botocore, google-auth) and the price catalog
# (genai-prices, which reads its own version from its package metadata) come in through
# the kinds' imports; tests/operations/test_single_binary.py serves each of them.
# --collect-data takes every file of a package that is not Python (the console's static
# folder, the migrations, whatever is added later), found, not listed here. It looks the
# packages up before --paths applies: PYTHONPATH puts the link ahead of the editable
# install's finder, whose folders (./storage, not .../model_gateway/storage) would place
# the files at the archive's root.
DIST ?= dist
DIST_PACKAGES := model_gateway.gateway model_gateway.storage model_gateway.pipeline
dist: $(STAMP) $(PKG_PATH)/model_gateway
	$(BIN)/pip install --quiet 'pyinstaller>=6.10'
	PYTHONPATH=$(PKG_PATH) $(BIN)/pyinstaller --onefile --name gateway --paths $(PKG_PATH) --log-level WARN \
		$(foreach p,$(DIST_PACKAGES),--collect-submodules $(p) --collect-data $(p)) \
		--collect-submodules uvicorn --hidden-import uvloop --hidden-import httptools \
		--copy-metadata genai-prices \
		--distpath $(DIST) --workpath $(DIST)/.build --specpath $(DIST)/.build $(CURDIR)/gateway/__main__.py

# `make bench PEERS=1` adds LiteLLM and Portkey to bench/realistic.py (installed under bench/.peers)
PEERS ?=
bench: $(STAMP)
	$(BIN)/python bench/run.py --quick --out bench/results/latest.md
	cd bench && ../$(BIN)/python paired.py --name-a "metrics on" --name-b "metrics off" \
		--extra-b '[metrics]\nenabled = false' --rounds 3 | tee -a results/latest.md
	cd bench && ../$(BIN)/python scaleout.py --rounds 3 | tee -a results/latest.md
	$(BIN)/python bench/realistic.py --quick $(if $(PEERS),--peers) | tee -a bench/results/latest.md

# Issue 14's soak: 10 minutes of metered chat and chat stream, RSS and req/s per minute,
# bytes per request at the end (`make soak MINUTES=2` for a short trial; `make soak
# POSTGRES=postgresql://postgres@127.0.0.1:5432/postgres` on new PostgreSQL databases).
MINUTES ?= 10
POSTGRES ?=
soak: $(STAMP)
	$(BIN)/python bench/soak.py --minutes $(MINUTES) $(if $(POSTGRES),--postgres $(POSTGRES) --out bench/results/soak-postgres.md)

clean:
	rm -rf $(VENV) data .pytest_cache dist build
