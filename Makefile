# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(VENV)/bin/pip
STAMP   = $(VENV)/.installed
LLAMA   = $(VENV)/.llama-cpp

.PHONY: run test test-fast test-docker arca install clean bench soak

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# llama-cpp-python's pinned release with the kernel patches in deploy/llama_cpp/patches, built
# once into ~/.cache/pip/reame-wheels (deploy/llama_cpp/build.py), then the project: the pin is met.
$(LLAMA): $(PY) pyproject.toml deploy/llama_cpp/build.py $(wildcard deploy/llama_cpp/patches/*.patch)
	$(PY) deploy/llama_cpp/build.py install
	touch $(LLAMA)

$(STAMP): $(PY) $(LLAMA) pyproject.toml setup.py arca/archive/_l1table.c arca/archive/_resp.h
	$(PIP) install --quiet -e '.[node,dev]'
	touch $(STAMP)

install: $(STAMP)

# The main job: a node on the offline default model with the embedded archive.
run: $(STAMP)
	$(VENV)/bin/reame run gemma3-270m --serve

arca: $(STAMP)
	$(VENV)/bin/reame arca --config conf/arca.conf

# Type checking first (config in pyproject.toml [tool.mypy]), then the suite; the 15 slowest
# tests are listed at the end (the suite is held under 20 minutes on 2 cores). Two workers,
# a test file to each in turn: a serial run keeps the cores 126% busy (its tests wait on
# processes, sockets and clocks); on a 2-vCPU AVX2 EPYC 1,512 s serial, 1,150 s so. llama.cpp's
# OpenMP threads wait passively in tests (tests/conftest.py): on a Zen 5 EPYC 484 s -> 357 s.
test: $(STAMP)
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=15

# The fast tier: no model, no slow builds, no end-to-end processes (tests/e2e); under 90 s on 2 cores.
# A test that reaches the model through a fixture is marked `model` by tests/conftest.py.
# Two workers (pytest-xdist): a third of the serial run's wall time is tests waiting on sockets,
# subprocesses and clocks (on 2 cores: 124 s serial, 77 s with -n 2, 81 s with -n 3).
test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not model and not slow" --ignore=tests/e2e -n 2

# Opt-in: the compose fleet in Docker, built from this tree, asked through the balancer and torn
# down (tests/e2e/test_docker_fleet.py; needs an engine and a compose command, docs/FLEET.md).
# The host-network variant by default; REAME_COMPOSE_FILES=docker-compose.yml for a bridge.
test-docker: $(STAMP)
	REAME_TEST_DOCKER=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/e2e/test_docker_fleet.py

clean:
	rm -rf $(VENV) build *.egg-info

# Twenty minutes of mixed load on ARCA and a node (ARCA killed and restarted once).
soak: $(STAMP)
	$(PY) bench/soak.py
