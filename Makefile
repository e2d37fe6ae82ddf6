# The two commands a new user runs (see README): `make demo` and `make test`.
# Both bootstrap .venv with the pinned dependencies from pyproject.toml.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench venv schema

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m edgetorch demo

test: $(STAMP)
	$(PY) -m pytest -q -ra --durations=30

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples

bench: $(STAMP)
	$(PY) bench/bench_runtime.py

# Regenerate the Python code of the flatbuffer schemas (committed; run after editing a .fbs file).
schema: $(STAMP)
	cd src/edgetorch/formats && for f in schema/*.fbs; do ../../../$(VENV)/bin/flatc --python --gen-onefile -o _generated $$f; done
