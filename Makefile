# One-command set-up and runs. Every target is idempotent.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements-tflite.txt requirements-library.txt | sha256sum | cut -c1-16)

.PHONY: setup demo test lint bench fuzz services services-stop proto system-deps clean

$(STAMP): pyproject.toml requirements-tflite.txt requirements-library.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[hub,dev,ray]'
	$(PY) -m pip install -q --no-deps -r requirements-tflite.txt
	$(PY) -m pip install -q --no-deps -r requirements-library.txt
	rm -f $(VENV)/.installed-*
	touch $@

# The console's third-party browser assets (uPlot), pinned by the lock; never from a CDN.
WEB       := cloud/console/web
WEB_STAMP := $(WEB)/node_modules/.installed-$(shell cat $(WEB)/package.json $(WEB)/package-lock.json | sha256sum | cut -c1-16)

$(WEB_STAMP): $(WEB)/package.json $(WEB)/package-lock.json
	npm ci --prefix $(WEB) --omit=dev --no-audit --no-fund
	touch $@

setup: $(STAMP) $(WEB_STAMP)

demo: setup
	$(VENV)/bin/edgeskill demo

# The tests' own Mosquitto and PostgreSQL on free loopback ports; endpoints in $(SERVICES_ENV).
SERVICES_ENV := .build/services/env
WITH_SERVICES := set -a && . ./$(SERVICES_ENV) && set +a &&

services:
	bash scripts/services.sh

services-stop:
	bash scripts/services.sh stop

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m protos.generate --check

# The browser tests (tests/console/) drive Debian's Chromium headless.
# What the tests need from Debian, installed with apt when missing: chromium (console
# browser tests) and espeak-ng (speech for the voice skills' tests).
DEBIAN_DEPS := chromium espeak-ng
system-deps:
	@missing=$$(for p in $(DEBIAN_DEPS); do command -v $$p >/dev/null || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing with apt: $$missing"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

test: setup services lint system-deps
	$(WITH_SERVICES) $(VENV)/bin/pytest -q -n 2 --dist worksteal --durations=40

bench: setup services
	$(WITH_SERVICES) for b in tests/bench/bench_*.py; do $(PY) $$b || exit 1; done

# Coverage-guided fuzzing of the hostile-input parsers (tests/fuzz/); FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
fuzz: setup
	$(PY) -c "import atheris" 2>/dev/null || $(PY) -m pip install -q 'atheris==3.0.0'
	for f in tests/fuzz/fuzz_*.py; do \
		echo "== $$f"; $(PY) $$f -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 || exit 1; \
	done

proto: setup
	$(PY) -m protos.generate

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
