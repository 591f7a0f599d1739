# Two commands do all set-up on a fresh machine:
#   make demo   create .venv, install attnlab, run the guided tour
#   make test   same set-up, then lint (ruff), types (mypy) and the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.attnlab-installed

.PHONY: demo test setup browser lint clean

setup: $(STAMP)

# pip reads torch==2.13.0 from constraints.txt; its CPU wheel is found locally.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/attnlab tour

# The HTML report is tested in a real headless Chromium (Debian's package) and
# its heatmaps draw Chinese with a CJK font. Installed here when missing; where
# they cannot be installed the browser test says so (and fails under CI=true).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser test"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "could not install chromium (need root and apt-get): the browser test will be skipped"; }
	@fc-list 2>/dev/null | grep -qi "wenquanyi\|noto sans cjk" || \
	  (apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-wqy-zenhei >/dev/null 2>&1) || \
	  echo "no CJK font: Chinese labels in heatmaps will show as boxes"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

test: $(STAMP) browser lint
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis
