# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(VENV)/bin/pip
STAMP   = $(VENV)/.installed

.PHONY: run test arca install clean bench soak

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml setup.py arca/archive/_l1table.c
	$(PIP) install --quiet -e '.[node,dev]'
	touch $(STAMP)

install: $(STAMP)

# The main job: a node on the offline default model with the embedded archive.
run: $(STAMP)
	$(VENV)/bin/reame run gemma3-270m --serve

arca: $(STAMP)
	$(VENV)/bin/reame arca --config conf/arca.conf

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) build *.egg-info

# Twenty minutes of mixed load on ARCA and a node (ARCA killed and restarted once).
soak: $(STAMP)
	$(PY) bench/soak.py
