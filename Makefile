# aiptrain: `make install`, then `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The extras `make install` puts into $(VENV).
EXTRAS := test,postgresql
RUNTIMES ?= 2.11 minimal
# Every 2.x runtime version (`make images-all`), and the ones `make test-runtimes` needs.
ALL_RUNTIMES := 2.11 2.10 2.9 2.8 2.7 2.6 2.5 2.4 2.3 2.2 2.1 minimal
TEST_RUNTIMES ?= 2.1 2.3 2.5 1.15 1.14

.PHONY: install images images-all lint docs browser postgresql test test-slow test-multinode test-runtimes unit chaos bench bench-install clean

# The benchmarks' own virtual environment (`make bench`): the bench extra's TorchX pulls older
# packages (kubernetes, urllib3) than the test extra wants, so it never goes into $(VENV).
BENCH_VENV ?= .venv-bench

# $(call virtualenv,DIR,EXTRAS): DIR holds a virtual environment with this checkout installed
# (editable) with EXTRAS; its bin/aiptrain is touched, so that make rebuilds it when
# pyproject.toml changes.
define virtualenv
$(PYTHON) -m venv $(1)
$(1)/bin/pip install --quiet --upgrade pip
$(1)/bin/pip install --quiet -e '.[$(2)]'
@touch $(1)/bin/aiptrain
endef

install: $(BIN)/aiptrain

$(BIN)/aiptrain: pyproject.toml
	$(call virtualenv,$(VENV),$(EXTRAS))

# The images the tests run: the base images (debootstrap, no registry; bookworm for minimal,
# bullseye for the 2.x runtimes), the runtimes, and the built-in algorithms' (seconds each, from
# runtime 2.11). AIPTRAIN_IMAGE_REPOSITORY and AIPTRAIN_BASE_REPOSITORY move them to other tags.
images: install
	scripts/ensure-docker.sh
	scripts/build-base-image.sh bookworm
	scripts/build-base-image.sh bullseye
	$(BIN)/aiptrain runtimes build $(RUNTIMES)
	$(BIN)/aiptrain algorithms build

# Every runtime image of the catalog's 2.x versions (about 2 minutes and 2 GB each; offline
# once pip's cache holds the wheels). docs/reference/runtimes.md records which built here.
images-all: images
	$(BIN)/aiptrain runtimes build $(ALL_RUNTIMES)

lint: install
	$(BIN)/ruff check aiptrain tests benchmarks
	$(BIN)/python scripts/check-types.py
	$(BIN)/lint-imports
	$(BIN)/python scripts/import-cycles.py

# The documentation site (mkdocs.yml), strict: a broken link, anchor or page fails the build.
docs: install
	$(BIN)/mkdocs build

# Debian's chromium and chromium-driver for the console's browser tests (installed when root).
browser:
	scripts/install-chromium.sh

# Debian's postgresql for the store tests on PostgreSQL (installed when root; the tests start
# and stop a server of their own).
postgresql:
	scripts/install-postgresql.sh

test: images lint docs browser postgresql
	$(BIN)/pytest -q --durations=25 -m "not slow and not multinode and not runtimes" --ignore=tests/network

# Every 2.x runtime's requirements resolved from the package index (about 3 minutes, network access):
# they change only with the runtime catalog. CI runs this after the rest when time allows (.ci/run).
test-network: install
	$(BIN)/pytest -q tests/network

# The scale tests (100 concurrent jobs): minutes on a 2-core machine.
test-slow: images
	$(BIN)/pytest -q -m slow

# Trainers of older runtimes (an Estimator on STANDARD_1 on 2.3, Keras on 2.1, scikit-learn on 1.15): their images
# first (minutes each the first time). CI runs this after the rest when time allows (.ci/run).
test-runtimes: images
	$(BIN)/aiptrain runtimes build $(TEST_RUNTIMES)
	$(BIN)/pytest -q -m runtimes

# Two Swarm nodes on this machine (root): a second dockerd in its own network namespace joins
# the host engine's swarm; `down` runs even when the tests fail and removes only what `up` made.
test-multinode: images
	scripts/multinode-swarm.sh up && $(BIN)/pytest -q -m multinode; \
	  status=$$?; scripts/multinode-swarm.sh down; exit $$status

# The layers without an engine (tests/unit: pure rules; tests/cli: commands): no container starts,
# since tests/conftest.py points DOCKER_HOST at no engine there. The TensorFlow ones (a local
# train in a virtual environment with TensorFlow) are left to `make test`, tests/network (what
# reaches the package index) to `make test-network`.
unit: install
	$(BIN)/pytest -q -m "not tensorflow" tests/unit tests/cli

# The fault suite, CHAOS_RUNS runs per scenario (`make test` runs each once); prints runs/held/orphans.
CHAOS_RUNS ?= 10
chaos: images
	CHAOS_RUNS=$(CHAOS_RUNS) $(BIN)/pytest -q -m chaos tests/chaos

# The benchmarks run from $(BENCH_VENV), with the bench extra: TorchX, the baseline of figure 9,
# and Locust, the load of figure 12 (they are skipped without it). $(VENV) stays as `make install` made it.
bench-install: $(BENCH_VENV)/bin/aiptrain

$(BENCH_VENV)/bin/aiptrain: pyproject.toml
	$(call virtualenv,$(BENCH_VENV),bench)

bench: images bench-install
	$(BENCH_VENV)/bin/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) build *.egg-info .pytest_cache
