# Two entry points for a fresh machine: `make run` and `make test`.
# Both create .venv and install the project (pinned where it matters) when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Notebooks are kept as jupytext py:percent files and executed as .ipynb under pytest --nbmake.
NOTEBOOKS := $(patsubst notebooks/%.py,build/notebooks/%.ipynb,$(wildcard notebooks/*.py))

.PHONY: install run serve calibrate test notebooks openapi lock bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/tune gemm-chain --M 256

serve: $(STAMP)
	$(BIN)/tune serve

# Measure this machine once (under a minute); the host preset uses the profile from then on.
calibrate: $(STAMP)
	$(BIN)/tune hardware host --calibrate

build/notebooks/%.ipynb: notebooks/%.py $(STAMP)
	mkdir -p build/notebooks
	$(BIN)/jupytext --quiet --to ipynb --output $@ $<

# Tests marked `quiet` measure this machine (the calibration): they run alone first, since a
# second worker's load is not the machine they are to measure. The notebook (a minute) goes first
# to the workers: handed out last, it left the other worker idle for most of that minute.
test: $(STAMP) $(NOTEBOOKS)
	$(BIN)/python -m pytest -m quiet tests
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not quiet" $(NOTEBOOKS) tests --nbmake

notebooks: $(STAMP) $(NOTEBOOKS)
	$(BIN)/python -m pytest $(NOTEBOOKS) --nbmake

# After changing the service's routes or models: the committed schema the tests compare with.
openapi: $(STAMP)
	$(BIN)/tune serve --openapi > api/openapi.json

# The pinned runtime dependencies that scripts/install.sh (and so the Dockerfile) installs.
lock:
	rm -rf build/lockenv
	$(PY) -m venv build/lockenv
	build/lockenv/bin/pip install --quiet --disable-pip-version-check .
	(echo "# Runtime dependencies of the service image, pinned (Python 3.11). Regenerate with: make lock"; \
	 build/lockenv/bin/pip freeze --exclude cachetile) > requirements.lock

bench: $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(BIN)/python bench/solve_times.py
	$(BIN)/python bench/kernels.py
	$(BIN)/python bench/service_load.py

clean:
	rm -rf $(VENV) build *.egg-info
