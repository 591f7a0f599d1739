# Two commands do all set-up on a fresh machine:
#   make demo   create .venv, install attnlab, run the guided tour
#   make test   same set-up, run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.attnlab-installed

.PHONY: demo test setup clean

setup: $(STAMP)

# pip reads torch==2.13.0 from constraints.txt; its CPU wheel is found locally.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/attnlab tour

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis
