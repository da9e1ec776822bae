# The two commands of the README. Each creates .venv and installs minidist
# into it (with the test tools) the first time, so a machine with only
# Python 3.10+ needs nothing else.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-quick lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/minidist demo

test: $(STAMP)
	$(PY) -m pytest -q

# The edit-run loop: the suite without its long end-to-end runs (tests/conftest.py).
test-quick: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check minidist viz tests benchmarks lessons scripts examples

bench: $(STAMP)
	$(PY) benchmarks/bench_training_step.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
