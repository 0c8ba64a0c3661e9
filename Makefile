# The README's two commands: `make demo` and `make test`. Each creates or reuses .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean check-java

check-java:
	@command -v java >/dev/null 2>&1 || { echo "error: 'java' was not found on PATH; Spark on Ray needs a JDK 17 (for example: apt-get install openjdk-17-jdk-headless)"; exit 1; }

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

demo: check-java $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m examples.enrich_clicks

test: check-java $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest

bench: check-java $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m benchmarks.enrich

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
