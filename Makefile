# Two entry points on a fresh machine: `make demo` and `make test`.
# Both create .venv and install the project (editable, with every extra) if missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m zoo.recipes.demo

# Two pytest workers on the 2-core machine, one torch thread each (tests/conftest.py); a test file stays on one
# worker, so its module fixtures (a trained benchmark, a PostgreSQL server) are built once.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) build *.egg-info
