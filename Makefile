# The README's two commands: `make demo` and `make test`. Each creates or reuses .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
RUN    := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY)
# The fast tier: every test that starts neither Ray, nor Spark, nor processes of its own.
FAST   := -m "not ray and not spark and not processes"
FAST_LIMIT_S ?= 60

.PHONY: demo test test-fast check bench clean check-java

check-java:
	@command -v java >/dev/null 2>&1 || { echo "error: 'java' was not found on PATH; Spark on Ray needs a JDK 17 (for example: apt-get install openjdk-17-jdk-headless)"; exit 1; }

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

demo: check-java $(STAMP)
	$(RUN) -m examples.enrich_clicks

# The whole suite: what CI runs. The pure tests on every core, then, one at a time, those that share
# one Ray and one Spark session or start processes of their own; both run, and either failing fails.
test: check-java $(STAMP)
	@status=0; \
	$(RUN) -m pytest $(FAST) -n auto -q $(ARGS) || status=$$?; \
	$(RUN) -m pytest -m "ray or spark or processes" $(ARGS) || status=$$?; \
	exit $$status

# Ring 1 and the other pure tests, on every core, with short property tests; fails past FAST_LIMIT_S.
test-fast: $(STAMP)
	ACTORFLOW_HYPOTHESIS=fast $(RUN) -m pytest $(FAST) -n auto --durations=10 -q \
		--fast-limit-s $(FAST_LIMIT_S) $(ARGS)

# Types and lint, outside pytest.
check: $(STAMP)
	$(RUN) -m tests.typecheck
	$(VENV)/bin/ruff check actorflow operators actors cluster spark_bridge tests benchmarks examples

bench: check-java $(STAMP)
	$(RUN) -m benchmarks.enrich

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
