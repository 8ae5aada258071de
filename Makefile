# make demo  - install what is missing, then train, fold and evaluate one model per task family
#              (RetinaNet, Mask R-CNN, UperNet, classifier) on generated data; tools/demo.py --help
# make test  - install what is missing, then run the test suite, both tiers (unit, integration)
# make test-fast - the unit tier only (tests/unit, mirrors mmrepa/; no Runner training, DDP, export;
#              its two tests that start 2 processes, marked `processes`, run in make test)
# make test-kernels - the tests whose tolerances are bounds of floating-point error (the unit
#              tier, the sharded bfloat16 run, the benchmark's precisions) on lowered kernels:
#              ATen without vector instructions, oneDNN capped at AVX2 (no AVX-512, VNNI, bf16,
#              AMX). These switches only lower; a bound that holds here and on the native kernels
#              is not fitted to one CPU (docs/troubleshooting.md, "Other CPUs")
# make test-cuda - the tests marked `cuda` (tests/integration/test_cuda_tier.py: AMP, DDP / SyncBN
#              over NCCL, FSDP, folds, BN recalibration, ONNX export on the GPU); without CUDA they
#              skip, or run on the CPU with MMREPA_TEST_DEVICE=cpu (=cuda: fail without CUDA)
# make lint  - ruff's checks and its formatter's check (ruff.toml); `make format` rewrites
# make docs  - install what is missing (with the docs requirements), then build docs/ into
#              docs/_build/html, strictly (warnings and broken cross-references are errors)
# PYTHON=/path/to/python uses that interpreter's environment instead of .venv/.
VENV := .venv
PYTHON ?= $(VENV)/bin/python
BASE_PYTHON ?= $(shell command -v python3.11 || command -v python3)
# two single-threaded workers use 2 cores better than one worker with 2 threads; a file runs
# on one worker, so module fixtures (trained models) are built once; files are handed out in
# tests/conftest.py's order (longest first), which xdist would otherwise replace by test count
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=

.PHONY: install install-tests demo test test-fast test-kernels test-cuda lint format docs clean

$(VENV)/bin/python:
	$(BASE_PYTHON) -m venv $(VENV)

install: $(if $(filter $(VENV)/bin/python,$(PYTHON)),$(VENV)/bin/python)
	bash tools/install_deps.sh $(PYTHON)

install-tests: $(if $(filter $(VENV)/bin/python,$(PYTHON)),$(VENV)/bin/python)
	bash tools/install_deps.sh $(PYTHON) --tests

demo: install
	$(PYTHON) tools/demo.py

lint: install-tests
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format: install-tests
	$(PYTHON) -m ruff check --fix .
	$(PYTHON) -m ruff format .

# both tiers in one run: a worker that finishes its integration files takes unit files while
# the other is still busy (the integration files go first, longest first: tests/conftest.py)
test: lint
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest tests -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: lint
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest tests/unit -m "not processes" -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

KERNELS_TESTS := tests/unit tests/integration/test_fsdp.py tests/integration/test_benchmark_precision.py
test-kernels: install-tests
	ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 $(PYTHON) -m pytest $(KERNELS_TESTS) -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# no install step: a GPU machine's environment is made apart (mmdet's and mmseg's models need
# mmcv's CUDA ops); the tier imports torch, mmengine, mmcv without ops and mmrepa only. One CPU
# thread: forced onto a loaded 2-core CPU, 2 threads took 82 s instead of 8
test-cuda:
	MMREPA_TEST_DEVICE=$${MMREPA_TEST_DEVICE:-} OMP_NUM_THREADS=1 $(PYTHON) -m pytest tests -m cuda $(PYTEST_ARGS)

docs: install-tests
	$(PYTHON) -m sphinx -W --keep-going -n -b html docs docs/_build/html

clean:
	rm -rf work_dirs/demo work_dirs/demo_repopt data/demo_shapes data/demo_shapes_cls data/demo_shapes_ade
