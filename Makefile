# Entry points for a fresh clone. Everything runs from the project's own virtualenv.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Everything the tests, the toolchain and the benchmarks need, pinned with hashes.
LOCK ?= requirements/dev.txt
PYTEST_ARGS ?=

.PHONY: install lock audit demo test lint typecheck bench broker-start broker-stop registry-start registry-stop schemas dashboard

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q --upgrade pip

# The locked dependencies first (every file checked against its hash), then kascade
# itself without resolving anything further.
install: $(BIN)/python
	$(BIN)/pip install --disable-pip-version-check -q --require-hashes -r $(LOCK)
	$(BIN)/pip install --disable-pip-version-check -q --no-deps -e .

# Re-resolve the locks from pyproject.toml (keeping locked versions that still fit;
# `make lock LOCK_FLAGS=--upgrade` takes the newest): dev (all extras) first, then the runtime
# (the image) and the toolchain constrained to dev's versions, so all three agree.
UV_COMPILE = $(BIN)/uv pip compile -q --generate-hashes --universal --python-version 3.11 \
	--custom-compile-command "make lock" pyproject.toml
lock:
	$(UV_COMPILE) $(LOCK_FLAGS) --extra dev --extra export --extra bench -o requirements/dev.txt
	$(UV_COMPILE) --extra export -c requirements/dev.txt -o requirements/toolchain.txt
	$(UV_COMPILE) -c requirements/dev.txt -o requirements/runtime.txt

# Known vulnerabilities in the locked versions (dev's pins include the other locks').
audit:
	bash .ci/audit

# The main job end to end on its defaults: local broker, sample documents, results table.
demo: install
	$(BIN)/kascade demo

# Unit tests and integration tests against a real broker. Uses KASCADE_TEST_KAFKA when
# set; otherwise the tests start docker/kafka-local.sh (or testcontainers) themselves.
test: install
	$(BIN)/python -m pytest -v $(PYTEST_ARGS)

# The benchmark suite behind docs/BENCHMARKS.md (needs ../shared/data/sib200; ~1 hour).
bench: install
	bash bench/all.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The whole package through kascade/'s links ([tool.mypy] in pyproject.toml): 0 errors.
typecheck: install
	$(BIN)/mypy

schemas: install
	$(BIN)/python -m kascade.schemas.export

# The Grafana dashboard compose provisions, regenerated from its code.
dashboard: install
	$(BIN)/python docker/grafana/dashboard.py

broker-start:
	docker/kafka-local.sh start

broker-stop:
	docker/kafka-local.sh stop

registry-start:
	docker/registry-local.sh start

registry-stop:
	docker/registry-local.sh stop
