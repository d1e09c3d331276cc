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

# Two pytest workers on the 2-core machine, one torch thread each (tests/conftest.py), handed tests one by one; a
# file with a module fixture (a trained benchmark, a PostgreSQL server) is one xdist_group, so it is built once.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

clean:
	rm -rf $(VENV) build *.egg-info
