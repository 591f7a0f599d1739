# Two commands do all set-up on a fresh machine:
#   make demo   create .venv, install attnlab, run the guided tour
#   make test   same set-up, then lint (ruff), types (mypy) and the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.attnlab-installed

.PHONY: demo test docs-test setup fonts browser lint smoke clean

setup: $(STAMP) fonts

# pip reads torch==2.13.0 from constraints.txt; its CPU wheel is found locally.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@# The book's own code, for the parity tests. Its package requires TensorFlow and JupyterLab for
	@# the notebooks; the modules the tests import (ch03, ch04, kv_cache) need only torch.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -c constraints.txt llms-from-scratch
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/attnlab tour
	$(VENV)/bin/attnlab heads --model induction
	@echo "A trained model ships with attnlab (above: its heads, named). See it work on your own text:"
	@echo "  $(VENV)/bin/attnlab explain --model induction \"the cat sat. the cat sat.\" --html heads.html"
	@echo "Train your own in about two minutes: $(VENV)/bin/attnlab train induction (docs/heads.md)"

# The Chinese tour and reports need a CJK font (WenQuanYi Zen Hei), Symbola for
# emoji in heatmaps (outlines matplotlib can draw) and Noto Color Emoji for the
# browser. Installed with Debian's apt when missing; attnlab finds them by file,
# so matplotlib's older font cache does not matter.
FONT_PACKAGES := fonts-wqy-zenhei fonts-symbola fonts-noto-color-emoji
fonts:
	@test -e /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc && fc-list 2>/dev/null | grep -qi "symbola" \
	  && fc-list 2>/dev/null | grep -qi "color emoji" || { \
	  echo "installing fonts for Chinese and emoji: $(FONT_PACKAGES)"; \
	  (apt-get update -qq >/dev/null 2>&1; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(FONT_PACKAGES) >/dev/null 2>&1) \
	  || echo "could not install $(FONT_PACKAGES) (need root and apt-get): Chinese labels fall back to their Unicode names"; }

# The HTML report is tested in a real headless Chromium (Debian's package).
# Installed here when missing; where it cannot be, the browser test says so
# (and fails under CI=true).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser test"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "could not install chromium (need root and apt-get): the browser test will be skipped"; }

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# The suite starts many Python processes (ranks, workers, torchrun): byte-compile the sources once, since
# where PYTHONDONTWRITEBYTECODE is set no process would write its own cache and each would compile again.
test: setup browser lint
	$(PY) -m compileall -q src tests benchmarks
	$(PY) -m pytest -q -m "not slow and not docs"
	@echo "second stage: the checks slow by nature (pytest -m slow; budget 600 s: its slowest tests are listed)"
	$(PY) -m pytest -q -m slow --durations=15
	$(MAKE) --no-print-directory smoke

# Every shell command and Python example of README.md and docs/, as written, in page order, each page in a fresh
# folder; long ones in the quick form their comment states (tests/test_journeys.py). Minutes: CI runs it after make test.
docs-test: setup
	$(PY) -m pytest -q -m docs tests/test_journeys.py

# Every benchmark script on tiny sizes: each runs its checks and timing end to end (seconds each), so a script
# that no longer runs fails `make test`. Outside pytest, whose budget is the suite's. ATTNLAB_MEASURE=0: no smoke
# pays a machine measurement of its own accord, but first_generate.py, whose subject it is (its own folder,
# measuring on); and ATTNLAB_CACHE, a folder made for the run and removed after it: what an explicit call still
# measures (quantize("int8")'s kernels, in precision.py) is never kept in the user's cache.
SCRIPTS := $(filter-out benchmarks/_%,$(wildcard benchmarks/*.py))
smoke: $(STAMP)
	@cache=$$(mktemp -d); trap 'rm -rf "$$cache"' EXIT; \
	for s in $(SCRIPTS); do echo "smoke: $$s"; ATTNLAB_MEASURE=0 ATTNLAB_CACHE="$$cache" $(PY) $$s --smoke > /dev/null \
	  || { echo "smoke failed: $$s"; exit 1; }; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis
