# The README's two commands: `make demo` and `make test`. Each creates or reuses .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
RUN    := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY)
# The fast tier: every test that starts neither Ray, nor Spark, nor processes of its own.
FAST   := -m "not ray and not spark and not processes"
FAST_LIMIT_S ?= 60

.PHONY: demo test test-fast check bench clean check-java check-chromium docs

check-java:
	@command -v java >/dev/null 2>&1 || { echo "error: 'java' was not found on PATH; Spark on Ray needs a JDK 17 (for example: apt-get install openjdk-17-jdk-headless)"; exit 1; }

# The docs' browser test drives Debian's Chromium through its ChromeDriver (selenium); installed here
# where missing, as root, or named with the command that installs it.
check-chromium:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium and chromium-driver for the docs' browser test"; \
	    apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; } || exit 1; \
	  else \
	    echo "error: the docs' browser test needs chromium and chromedriver on PATH (Debian: sudo apt-get install chromium chromium-driver)"; exit 1; \
	  fi; }

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

demo: check-java $(STAMP)
	$(RUN) -m examples.enrich_clicks

# The whole suite: what CI runs. The pure tests on every core; then, at the same time, the tests
# that share one Ray and one Spark session (one at a time) and, in a pytest of their own, those that
# start their own processes and share neither (they mostly wait: see `beside` in tests/conftest.py).
# Every part runs, and any failing fails; the second pytest's output follows the first's. With ARGS
# naming some tests, a part that holds none of them (pytest's exit 5) is no failure. The docs site's
# strict build and its browser test are tests of the third part (tests/docs_site/test_site.py).
test: check-java check-chromium $(STAMP)
	@pure=0; shared=0; beside=0; log=$$(mktemp); trap 'kill $$pid 2>/dev/null; rm -f $$log' EXIT INT TERM; \
	env $(RUN) -m pytest $(FAST) -n auto -q $(ARGS) || pure=$$?; \
	env $(RUN) -m pytest -m beside -p no:cacheprovider $(ARGS) >$$log 2>&1 & pid=$$!; \
	env $(RUN) -m pytest -m "(ray or spark or processes) and not beside" $(ARGS) || shared=$$?; \
	wait $$pid || beside=$$?; \
	echo "--- the tests that ran beside: their own Ray, Spark or processes ---"; cat $$log; \
	if [ "$$pure$$shared$$beside" = 555 ]; then echo "no test matched $(ARGS)"; exit 5; fi; \
	for rc in $$pure $$shared $$beside; do \
		if [ $$rc != 0 ] && { [ $$rc != 5 ] || [ -z "$(ARGS)" ]; }; then exit $$rc; fi; \
	done

# Ring 1 and the other pure tests, on every core, with short property tests; fails past FAST_LIMIT_S.
test-fast: $(STAMP)
	ACTORFLOW_HYPOTHESIS=fast $(RUN) -m pytest $(FAST) -n auto --durations=10 -q \
		--fast-limit-s $(FAST_LIMIT_S) $(ARGS)

# Types and lint, outside pytest.
check: $(STAMP)
	$(RUN) -m tests.typecheck
	$(VENV)/bin/ruff check actorflow operators actors cluster spark_bridge tests benchmarks examples docs

# The docs site, in strict mode: a warning, a broken link or a missing reference fails it.
docs: $(STAMP)
	DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: check-java $(STAMP)
	$(RUN) -m benchmarks.enrich

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
