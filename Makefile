# iotrace developer entry points; `make test` and `make demo` set the machine up first.
.PHONY: setup setup-tf test lint demo clean

PY := .venv/bin/python
PYTEST_ARGS ?=
# BPF tests need root: run pytest directly as root, else under sudo (keeping the environment).
AS_ROOT := $(if $(filter 0,$(shell id -u)),,sudo -E)

# Install apt packages, kernel headers, tracefs, the venv and /usr/local/bin/iotrace (idempotent).
setup:
	@bash scripts/setup.sh

# A separate venv with tensorflow-cpu for the end-to-end training test (idempotent).
setup-tf:
	@bash scripts/setup_tf.sh

# Run the test suite as root.
test: setup setup-tf
	$(AS_ROOT) $(PY) -m pytest -q $(PYTEST_ARGS)

# Lint with ruff (configured in pyproject.toml).
lint:
	.venv/bin/ruff check tracer tests scripts

# Run the demo.
demo: setup
	$(AS_ROOT) $(PY) scripts/demo.py

# Remove the venv and every cache.
clean:
	rm -rf .venv .venv-tf .pytest_cache .hypothesis .ruff_cache *.egg-info build
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
