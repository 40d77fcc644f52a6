"""The facts the command line keeps about the library to check arguments without importing it
(:py:mod:`zennit_attn.cli.library`) are the library's own, and the command line's methods are the library's
declarations (the methods' declarations against their implementations: ``tests/methods/test_declarations.py``)."""

from __future__ import annotations

import types

from zennit_attn import pretrained
from zennit_attn.cli import checks, explain, library, neurons, options
from zennit_attn.inputs import objectives
from zennit_attn.methods import declarations
from zennit_attn.methods import registry as methods
from zennit_attn.results.render import views
from zennit_attn.workflows import dataset


def test_the_methods_are_the_declarations():
    """The command line reads the methods from the library's declarations, the same objects the registry is built
    from: no copy to keep in step."""
    for module in (options, checks, explain, neurons):
        assert module.DECLARATIONS is declarations.DECLARATIONS
    assert list(declarations.DECLARATIONS) == list(methods.METHODS)
    for name, declaration in declarations.DECLARATIONS.items():
        assert methods.METHODS[name].params == declaration.params, name


def test_constants_are_the_librarys():
    assert library.SUFFIXES == views.SUFFIXES
    assert library.RUNNER_UP == objectives.RUNNER_UP
    assert library.INDEX_FILE == dataset.INDEX_FILE
    assert library.SMOLLM2_PACKAGE == pretrained.SMOLLM2_PACKAGE


def test_heavy_imports_a_module():
    assert library.heavy('.methods.registry') is methods
    assert library.heavy('.cli.runs.explain').__name__ == 'zennit_attn.cli.runs.explain'
    assert isinstance(library.heavy('json'), types.ModuleType)
