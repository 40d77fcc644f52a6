"""The facts the command line keeps about the library to check arguments without importing it
(:py:mod:`zennit_attn.cli.library`) are the library's own: a method added, renamed or given another parameter in
:py:mod:`zennit_attn.methods.registry` fails here until the copy follows."""

from __future__ import annotations

import inspect
import types

from zennit_attn import pretrained
from zennit_attn.cli import library
from zennit_attn.inputs import objectives
from zennit_attn.methods import registry as methods
from zennit_attn.results.render import views
from zennit_attn.workflows import dataset


def test_methods_are_the_librarys():
    assert list(library.METHODS) == list(methods.METHODS)
    for name, facts in library.METHODS.items():
        method = methods.METHODS[name]
        assert facts.name == name
        assert dict(facts.params) == dict(method.params), name
        assert [type(value) for value in facts.params.values()] == [type(value) for value in method.params.values()]
        assert (facts.backward, facts.latent, facts.lrp) == (method.backward, method.latent, method.lrp), name
        # the methods that read attention maps (refused for encoder-decoder models) are those that call them
        assert facts.attention_maps == ('attention_maps(' in inspect.getsource(method.function)), name
    assert [name for name, facts in library.METHODS.items() if facts.attention_maps] == [
        'attention_rollout',
        'grad_attention_rollout',
        'gradcam',
    ]


def test_constants_are_the_librarys():
    assert library.SUFFIXES == views.SUFFIXES
    assert library.RUNNER_UP == objectives.RUNNER_UP
    assert library.INDEX_FILE == dataset.INDEX_FILE
    assert library.SMOLLM2_PACKAGE == pretrained.SMOLLM2_PACKAGE


def test_heavy_imports_a_module():
    assert library.heavy('.methods.registry') is methods
    assert library.heavy('.cli.runs.explain').__name__ == 'zennit_attn.cli.runs.explain'
    assert isinstance(library.heavy('json'), types.ModuleType)
