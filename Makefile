# aiptrain: `make install`, then `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUNTIMES ?= 2.11 minimal

.PHONY: install images lint docs test test-slow test-multinode unit chaos bench clean

install: $(BIN)/aiptrain

$(BIN)/aiptrain: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

# The images the tests run: the base images (debootstrap, no registry; bookworm for minimal,
# bullseye for the 2.x runtimes) and the runtimes. AIPTRAIN_IMAGE_REPOSITORY and
# AIPTRAIN_BASE_REPOSITORY move them to other tags.
images: install
	scripts/ensure-docker.sh
	scripts/build-base-image.sh bookworm
	scripts/build-base-image.sh bullseye
	$(BIN)/aiptrain runtimes build $(RUNTIMES)

lint: install
	$(BIN)/ruff check aiptrain tests benchmarks

# The documentation site (mkdocs.yml), strict: a broken link, anchor or page fails the build.
docs: install
	$(BIN)/mkdocs build

test: images lint docs
	$(BIN)/pytest -q -m "not slow and not multinode"

# The scale tests (100 concurrent jobs): minutes on a 2-core machine.
test-slow: images
	$(BIN)/pytest -q -m slow

# Two Swarm nodes on this machine (root): a second dockerd in its own network namespace joins
# the host engine's swarm; `down` runs even when the tests fail and removes only what `up` made.
test-multinode: images
	scripts/multinode-swarm.sh up && $(BIN)/pytest -q -m multinode; \
	  status=$$?; scripts/multinode-swarm.sh down; exit $$status

unit: install
	$(BIN)/pytest -q -m "not docker and not tensorflow"

# The fault suite, CHAOS_RUNS runs per scenario (`make test` runs each once); prints runs/held/orphans.
CHAOS_RUNS ?= 10
chaos: images
	CHAOS_RUNS=$(CHAOS_RUNS) $(BIN)/pytest -q -m chaos tests/test_chaos.py

# The bench extra brings TorchX, the baseline of figures 9 and 10 (they are skipped without it).
bench: images
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
