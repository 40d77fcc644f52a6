"""``zennit-attn patching`` (:py:mod:`zennit_attn.cli.patching`)."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import refused, run

PAIRS = [
    {'clean': 'The bear lives in the', 'corrupted': 'the bear lives in the', 'answer': ' Arctic', 'wrong': ' the'},
    {'clean': 'The ice bear lives in', 'corrupted': 'The ice bear lives the', 'answer': ' the', 'wrong': ' bear'},
]


@pytest.mark.parametrize(
    'argv, message',
    [
        (['--pairs', '0'], '--pairs must be at least 1'),
        (['--top', '0'], '--top must be at least 1'),
        (['--pairs-file', 'missing.json'], "--pairs-file 'missing.json' is not a file"),
        (['--components', 'mlp', 'mlp'], '--components names a component twice'),
        (['--output', 'view.svg'], '--output'),
        (['--method', 'gradient'], "argument --method: invalid choice: 'gradient'"),
        (['--steps', '0'], '--steps must be at least 1'),
        (['--span', '0'], '--span must be in (0, 1]'),
        (['--span', '1.5'], '--span must be in (0, 1]'),
        (['--edges', '-1'], '--edges must be at least 0'),
        (['--direction', 'clean'], "argument --direction: invalid choice: 'clean'"),
        (['--components', 'hook_z'], "argument --components: invalid choice: 'hook_z'"),
    ],
)
def test_patching_refusals(capsys, argv, message):
    assert message in refused(capsys, ['patching', *argv])


@pytest.mark.parametrize(
    'text, message',
    [
        ('{not json', 'is not JSON (Expecting property name'),
        ('{"clean": "a"}', 'holds dict'),
        ('[]', 'holds list [], not a JSON list of'),
        ('[{"clean": "a", "corrupted": "b", "answer": " c"}]', "pair 0 ({'clean': 'a'"),
        ('[{"clean": "a", "corrupted": "b", "answer": " c", "wrong": 3}]', 'is not one of a JSON list of'),
    ],
)
def test_a_pairs_file_that_is_not_pairs_is_refused_before_the_model_is_loaded(capsys, tmp_path, text, message):
    """Before, a file that is not JSON failed with exit status 1 after the model was loaded; the manual promises 2
    before loading (the model folder here does not exist: a load would fail otherwise)."""
    path = tmp_path / 'pairs.json'
    path.write_text(text)
    line = refused(capsys, ['patching', '--pairs-file', str(path), '--model', str(tmp_path / 'no-model')])
    assert f"--pairs-file '{path}'" in line and message in line


def test_patching_options_are_the_library_s():
    """The CLI names the methods and defaults without importing the library: they must be the library's."""
    from zennit_attn.cli import patching
    from zennit_attn.workflows.patching import (
        COMPONENTS,
        DEFAULT_DIRECTION,
        DEFAULT_METHOD,
        DEFAULT_PATH,
        DEFAULT_SPAN,
        DEFAULT_STEPS,
        DIRECTIONS,
        PATCHING_METHODS,
        PATHS,
        TASKS,
        PromptPair,
    )
    from zennit_attn.workflows.patching.components import ALIASES

    assert set(patching.METHODS) == set(PATCHING_METHODS)
    assert set(patching.COMPONENTS) == set(COMPONENTS) | set(ALIASES)
    assert (set(patching.DIRECTIONS), patching.DEFAULT_DIRECTION) == (set(DIRECTIONS), DEFAULT_DIRECTION)
    assert ('task', *patching.PAIR_FIELDS, 'template') == tuple(PromptPair.__dataclass_fields__)
    assert patching.TASKS == tuple(TASKS)
    defaults = (patching.DEFAULT_METHOD, patching.DEFAULT_STEPS, patching.DEFAULT_SPAN, patching.DEFAULT_PATH)
    assert defaults == (DEFAULT_METHOD, DEFAULT_STEPS, DEFAULT_SPAN, DEFAULT_PATH)
    assert patching.PATHS == tuple(PATHS)


def test_patching_with_a_model_folder(capsys, tiny_folder, tmp_path):
    """The printed top components are those of relevance_patching of the same pairs; the view is written."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zennit_attn.cli.runs.patching import PromptPair
    from zennit_attn.workflows.patching import edge_patching, pair_ids, relevance_patching

    path = tmp_path / 'pairs.json'
    path.write_text(json.dumps(PAIRS))
    view = tmp_path / 'view.html'
    argv = ['patching', '--pairs-file', str(path), '--model', str(tiny_folder['llama']), '--top', '3']
    code, out, err = run(capsys, [*argv, '--output', str(view), '--reference', '--edges', '4', '-q'])
    assert code == 0, err
    model = AutoModelForCausalLM.from_pretrained(tiny_folder['llama']).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder['llama'])
    ids = pair_ids(tokenizer, [PromptPair('file', **pair) for pair in PAIRS])
    top = relevance_patching(model, **ids).top(3)
    edges = edge_patching(model, **ids).top(4)
    assert [line.split('. ', 1)[1] for line in out.splitlines() if line.startswith('    ') and '. ' in line] == [
        str(entry) for entry in [*top, *edges]
    ]
    assert 'Pearson / Spearman' in out and view.read_text().count('<td style') > 0
    assert (tmp_path / 'view-edges.html').read_text().count('<line ') == 4


def test_patching_denoising_under_transformer_lens_names(capsys, tiny_folder, tmp_path):
    """--direction and TransformerLens's names reach relevance_patching: the printed top components are its."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zennit_attn.cli.runs.patching import PromptPair
    from zennit_attn.workflows.patching import pair_ids, relevance_patching

    path = tmp_path / 'pairs.json'
    path.write_text(json.dumps(PAIRS))
    names = ['resid_post', 'z', 'mlp_out']
    argv = ['patching', '--pairs-file', str(path), '--model', str(tiny_folder['llama']), '--top', '4', '-q']
    code, out, err = run(capsys, [*argv, '--direction', 'denoising', '--components', *names])
    assert code == 0, err
    model = AutoModelForCausalLM.from_pretrained(tiny_folder['llama']).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder['llama'])
    ids = pair_ids(tokenizer, [PromptPair('file', **pair) for pair in PAIRS])
    top = relevance_patching(model, components=names, direction='denoising', **ids).top(4)
    noising = relevance_patching(model, components=names, **ids).top(4)
    printed = [line.split('. ', 1)[1] for line in out.splitlines() if line.startswith('    ') and '. ' in line]
    assert printed == [str(entry) for entry in top] != [str(entry) for entry in noising]
    assert 'Direction:   denoising' in out
