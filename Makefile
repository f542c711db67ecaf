# Set-up, the default job and the tests.  `make run`, `make test` and `make test-full`
# set up first.
#
#   make setup      create .venv (if missing) and install the project (idempotent)
#   make run        verify the default implementation on every CosmoFlow layer (CPU, batch 1)
#   make test       the fast tier (what CI runs): every implementation x pass on a few
#                   representative layers, and every unit test (GPU tests skip without a GPU)
#   make test-full  the full tier: the fast tier plus the sweeps (every layer of both
#                   CosmoFlow sets at batch 1 and 2, every odd shape, every tuned entry,
#                   every nvcc build); writes the coverage table to $(COVERAGE_OUT)
#
# Variables: PYTHON (interpreter that creates the venv), VENV, TORCH_SPEC (the torch
# requirement installed first; the default takes this machine's local CPU wheel),
# RUN_ARGS (extra flags for `make run`), PYTEST_ARGS, COVERAGE_OUT, TEST_WORKERS (pytest
# processes, pytest-xdist's -n: one per core by default, at most 4; a test file stays
# in one process, and the processes share the session's builds; 0 runs in this process).

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
RUN_ARGS   ?=
PYTEST_ARGS ?=
COVERAGE_OUT ?= results/verify/cpu
TEST_WORKERS ?= auto

PY    := $(VENV)/bin/python
STAMP := $(VENV)/.convbench-installed

.PHONY: setup run test test-full clean-cache

setup: $(STAMP)

# Re-install when the package metadata or the torch spec changes.
$(STAMP): setup.cfg pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=23" "setuptools>=61" wheel
	@# torch first, explicitly: otherwise pip resolves "torch" to the newest CUDA build.
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet --no-build-isolation -e ".[test]"
	@$(PY) -c "import dace, numpy, networkx, torch; print('dace', dace.__version__, '| numpy', numpy.__version__, '| networkx', networkx.__version__, '| torch', torch.__version__)"
	@touch $(STAMP)

run: setup
	$(PY) profile_conv3d.py --verify --device cpu --batch 1 --paramscsv cosmoflow $(RUN_ARGS)

# lint-imports checks the architecture first (the contracts are in setup.cfg).
XDIST := -n $(TEST_WORKERS) --maxprocesses=4 --dist loadfile

test: setup
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The full tier steals work between processes: one file (test_impls_cpu.py) holds most of
# its time, and --dist loadfile would give it to a single process.
test-full: setup
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest $(subst loadfile,worksteal,$(XDIST)) --full --coverage-out=$(COVERAGE_OUT) $(PYTEST_ARGS)

clean-cache:
	rm -rf .cache/builds
