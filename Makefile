# Entry points for a fresh clone. Everything runs from the project's own virtualenv.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,export,bench
PYTEST_ARGS ?=

.PHONY: install demo test lint bench broker-start broker-stop registry-start registry-stop schemas dashboard

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --disable-pip-version-check -q -e ".[$(EXTRAS)]"

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
