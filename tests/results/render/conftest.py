"""System programs that render tests use: a headless browser for the HTML pages (Debian's ``chromium``),
``pdftoppm`` to rasterise PDF figures, a TeX engine to compile LaTeX snippets. Tests never install system packages:
`make system` (run by `make test` and `.ci/run`) installs them where it can; where one is missing, the tests that
need it are skipped with that reason and the fix."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest
from playwright.sync_api import sync_playwright

#: what every headless run gets: no sandbox (root in a container), no GPU, no network chatter, a fresh profile
CHROMIUM_FLAGS = [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
    '--hide-scrollbars',
]


def _skip_missing(program: str, package: str) -> NoReturn:
    pytest.skip(f'{program} not found: run `make system` as root, or apt-get install {package}')


@pytest.fixture(scope='session')
def chromium() -> str:
    """The path of a chromium binary (``chromium`` or ``chromium-browser``)."""
    return shutil.which('chromium') or shutil.which('chromium-browser') or _skip_missing('chromium', 'chromium')


@pytest.fixture(scope='session')
def pdftoppm() -> str:
    """The path of poppler's ``pdftoppm``."""
    return shutil.which('pdftoppm') or _skip_missing('pdftoppm', 'poppler-utils')


@pytest.fixture(scope='session')
def tex_engine() -> str:
    """The path of a TeX engine (``pdflatex``, ``lualatex`` or ``xelatex``)."""
    engines = ('pdflatex', 'lualatex', 'xelatex')
    return next(filter(None, map(shutil.which, engines)), None) or _skip_missing(
        'pdflatex', 'texlive-latex-recommended'
    )


@pytest.fixture(scope='module')
def browser(chromium):
    """A headless chromium driven by playwright (skipped where playwright cannot launch it)."""
    with sync_playwright() as driver:
        try:
            browser = driver.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        except Exception as error:  # noqa: BLE001 - any launch failure means no browser to test with
            pytest.skip(f'playwright cannot drive {chromium}: {error}')
        yield browser
        browser.close()


def compile_latex(engine: str, folder: Path, *snippets: str) -> subprocess.CompletedProcess:
    """Compile ``main.tex`` in ``folder``: an article with xcolor alone (what the snippets' docs ask for) that inputs
    the ``snippets`` (file names in ``folder``), with the TeX ``engine`` (a path)."""
    inputs = ''.join(f'\\input{{{snippet}}}\n' for snippet in snippets)
    (folder / 'main.tex').write_text(
        '\\documentclass{article}\n\\usepackage{xcolor}\n\\begin{document}\n' + inputs + '\\end{document}\n'
    )
    return subprocess.run(
        [engine, '-interaction=nonstopmode', '-halt-on-error', 'main.tex'],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=180,
    )
