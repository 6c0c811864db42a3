# aiptrain: `make install`, then `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUNTIMES ?= 2.11 minimal

.PHONY: install images test test-slow unit bench clean

install: $(BIN)/aiptrain

$(BIN)/aiptrain: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

# The images the tests run: the base image (debootstrap, no registry) and the runtimes.
images: install
	scripts/ensure-docker.sh
	scripts/build-base-image.sh
	$(BIN)/aiptrain runtimes build $(RUNTIMES)

test: images
	$(BIN)/pytest -q -m "not slow"

# The scale tests (100 concurrent jobs): minutes on a 2-core machine.
test-slow: images
	$(BIN)/pytest -q -m slow

unit: install
	$(BIN)/pytest -q -m "not docker"

bench: images
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
