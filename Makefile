# iotrace developer entry points; `make test` and `make demo` set the machine up first.
.PHONY: setup setup-tf setup-torch test test-unit test-kernels bench-nullblk lint demo bench man contract clean

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

# A separate venv with PyTorch (CPU, pinned) for the end-to-end DataLoader test (idempotent).
setup-torch:
	@bash scripts/setup_torch.sh

# Run the test suite as root: tests/unit (no root needed) and tests/privileged (real BPF on loop devices).
test: setup setup-tf setup-torch
	$(AS_ROOT) $(PY) -m pytest -q $(PYTEST_ARGS) tests/unit tests/privileged

# The tests that need neither root nor BPF.
test-unit: setup
	$(PY) -m pytest -q $(PYTEST_ARGS) tests/unit

# The BPF tests on other kernels (scripts/kernels/kernels.list), each booted under qemu (TCG): builds each
# guest image once (cached in /var/cache/iotrace-kernels by a hash of its recipe), copies this tree in, prints
# test x kernel -> passed/failed/skipped/too slow under TCG, and fio's requests against iotrace's and tracefs'
# counts.  KERNELS_ARGS: e.g. --kernel linux-image-6.1.0-50-cloud-amd64 --tests tests/unit/test_btf.py
# Needs no venv (run.py is stdlib only; the guests have their own), so it does not run `setup`.
KERNELS_ARGS ?=
test-kernels:
	$(AS_ROOT) python3 scripts/kernels/run.py $(KERNELS_ARGS)

# fio's IOPS on a null_blk disk (the device costs nothing) untraced, under three empty programs and under
# iotrace's request path, in the first kernel's guest (Debian's kernels ship null_blk; the host has none).
bench-nullblk:
	$(AS_ROOT) python3 scripts/kernels/run.py --tests "" --no-fio --nullblk $(KERNELS_ARGS)

# Lint with ruff, check the package's layers with import-linter (both configured in pyproject.toml), and
# that the headers written from bpf/contract.toml are current.
lint:
	.venv/bin/ruff check tracer tests scripts
	.venv/bin/lint-imports
	$(PY) -m tracer.contract --check

# Run the demo.
demo: setup
	$(AS_ROOT) $(PY) scripts/demo.py

# Overhead vs no tracer, bpftrace and blktrace (fio on a RAM-backed loop device, interleaved
# runs), the request path's price feature by feature and as work grows (BENCH_BASE=REV: also
# the gate, failing when the request path grew past its noise band against REV), the cost of a 100k-bucket dump, a short soak run (each flood's tracer RSS at its start and end, failing past +5 MB), what the per-process rows cost (the
# default page-cache events and --tasks' syscall hooks: per event in bpf_stats, per buffered read,
# per getppid, against untraced), report's time and peak RSS on a 200 MB file, and a scrape of
# `iotrace serve` under fio load; results also in bench-*.json.
bench:
	@bash scripts/setup.sh --bench
	$(AS_ROOT) $(PY) scripts/bench_overhead.py --json bench-overhead.json
	$(AS_ROOT) $(PY) scripts/bench_cost.py --json bench-cost.json $(if $(BENCH_BASE),--base $(BENCH_BASE))
	$(AS_ROOT) $(PY) scripts/bench_frontend.py --json bench-frontend.json
	$(AS_ROOT) $(PY) scripts/soak.py --seconds 60 --json bench-soak.json
	$(AS_ROOT) $(PY) scripts/bench_tasks.py --json bench-tasks.json
	$(AS_ROOT) $(PY) scripts/bench_files.py --json bench-files.json
	$(PY) scripts/bench_report.py --json bench-report.json
	$(AS_ROOT) $(PY) scripts/bench_scrape.py --json bench-scrape.json

# The man page iotrace(8), docs/iotrace.8, rendered from the argparse parsers --help prints
# (tests/unit/test_manpage.py fails while the committed page differs). Read it: man -l docs/iotrace.8
man:
	$(PY) -m tracer.cli.manpage -o docs/iotrace.8

# The C definitions the BPF programs include (bpf/iotrace_defs.h, bpf/tasks_defs.h), written from the one
# table both sides read, bpf/contract.toml (tests/unit/test_contract_syntax.py fails while they differ).
contract:
	$(PY) -m tracer.contract

# Remove the venv and every cache.
clean:
	rm -rf .venv .venv-tf .venv-torch .pytest_cache .hypothesis .ruff_cache *.egg-info build
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
