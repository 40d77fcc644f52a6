"""``zennit-attn explain`` (:py:mod:`zennit_attn.cli.explain`)."""

from __future__ import annotations

import argparse

import pytest

from tests.cli.conftest import PROMPT, refused, run
from zennit_attn.cli import explain
from zennit_attn.cli.errors import UsageError


@pytest.mark.parametrize(
    'argv, message',
    [
        (['--top', '-1'], '--top must be 0 or more'),
        (['--top', 'many'], "argument --top: invalid int value: 'many'"),
        (['--dtype', 'int8'], 'argument --dtype: invalid choice'),
        (['--unknown'], 'unrecognized arguments: --unknown'),
    ],
)
def test_bad_arguments(capsys, argv, message):
    assert message in refused(capsys, ['explain', '--prompt', PROMPT, *argv])


def test_explain_a_model_folder(capsys, tiny_folder, tmp_path):
    output = tmp_path / 'x.tex'
    code, out, err = run(
        capsys,
        [
            'explain',
            '--prompt',
            'The ice bear lives in the',
            '--model',
            str(tiny_folder['llama']),
            '--output',
            str(output),
            '--color',
            'never',
            '--top',
            '2',
        ],
    )
    assert code == 0, err
    assert f'Model:       {tiny_folder["llama"]}' in out and 'Prediction:  ' in out and 'Top-2 input tokens:' in out
    assert f'Wrote the heatmap to {output.resolve()}' in out and output.stat().st_size > 0
    assert err.count('\n') == 2 and 'loading' in err and 'explaining with attnlrp' in err
    # a target by id, another method with a parameter, words, float64
    code, out, err = run(
        capsys,
        [
            'explain',
            '--prompt',
            'The ice bear lives in the',
            '--model',
            str(tiny_folder['llama']),
            '--target',
            'id:5',
            '--method',
            'integrated_gradients',
            '--param',
            'steps=3',
            '--words',
            '--dtype',
            'float64',
            '--color',
            'never',
            '-q',
        ],
    )
    assert code == 0 and err == '', err
    assert 'Explained:   ' in out and '(token id 5, ' in out and 'integrated_gradients (steps=3)' in out
    assert 'Relevance of each word' in out


def test_explain_an_encoder_decoder_folder(capsys, tiny_folder):
    code, out, err = run(
        capsys,
        [
            'explain',
            '--prompt',
            'The ice bear lives in the',
            '--model',
            str(tiny_folder['t5']),
            '--composite',
            'cplrp',
            '--color',
            'never',
            '-q',
        ],
    )
    assert code == 0, err
    assert 'Prediction:  ' in out and 'cplrp with --composite cplrp' in out


@pytest.mark.slow
def test_explain_end_to_end(capsys, builtin, tmp_path):
    output = tmp_path / 'out' / 'x.html'
    code, out, err = run(capsys, ['explain', '--prompt', PROMPT, '--output', str(output), '--color', 'never'])
    assert code == 0, err
    assert "Prediction:  ' Paris' (token id 7042, logit " in out
    assert 'Eiffel' in out or 'iffel' in out  # the heatmap and the top tokens
    assert f'Wrote the heatmap to {output.resolve()}' in out
    assert output.stat().st_size > 0 and '<html' in output.read_text().lower()
    assert 'loading SmolLM2-135M-Instruct' in err and 'Traceback' not in err
    # another target, checked with the real tokenizer; the prediction is printed as well
    code, out, err = run(
        capsys,
        [
            'explain',
            '--prompt',
            PROMPT,
            '--target',
            ' London',
            '--composite',
            'cplrp',
            '--top',
            '0',
            '--color',
            'never',
            '--quiet',
        ],
    )
    assert code == 0 and err == '', err
    assert "Prediction:  ' Paris' (token id 7042" in out and "Explained:   ' London'" in out
    assert 'cplrp' in out and 'Top-' not in out


@pytest.mark.slow
def test_target_that_is_not_one_token(capsys, builtin):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--target', ' Parisian', '--quiet'])
    assert "' Parisian' is 2 tokens: ' Paris' (id:7042), 'ian' (id:" in line


def test_contrast(capsys, tiny_folder):
    argv = [
        'explain',
        '--prompt',
        'The ice bear lives in the',
        '--model',
        str(tiny_folder['llama']),
        '--dtype',
        'float64',
        '--color',
        'never',
        '-q',
        '--top',
        '0',
    ]
    code, out, err = run(capsys, argv + ['--target', 'id:5', '--contrast', 'id:7'])
    assert code == 0 and err == '', err
    line = next(line for line in out.splitlines() if line.startswith('Explained:'))
    assert '(token ids 5 and 7, logit difference ' in line and '--target and --contrast' in line
    assert 'minus the contrast' in out  # the heatmap's caption
    code, out, err = run(capsys, argv + ['--contrast', 'runner-up'])
    assert code == 0 and err == '', err
    assert ' rather than ' in out and 'Prediction:' not in out


@pytest.mark.parametrize(
    'value, message',
    [
        ('id:x', "--contrast 'id:x': id: must be followed by a token id"),
        ('', '--contrast is empty'),
    ],
)
def test_bad_contrast(capsys, value, message):
    assert message in refused(capsys, ['explain', '--prompt', PROMPT, '--contrast', value])


@pytest.mark.parametrize(
    'target, contrast, written',
    [
        (' b', ' b', "(' b')"),
        ('id:5', 'id:5', '(id:5)'),
        ('id:5', 'id: 5', '(id:5)'),
    ],
)
def test_contrast_that_is_the_target(capsys, tmp_path, target, contrast, written):
    """Refused by the checks, exit status 2, nothing loaded (conftest's ``no_loading``): it used to be refused by
    explain() after loading the model, with exit status 1. Also with a --model folder that would not load."""
    folder = tmp_path / 'model'
    folder.mkdir()
    (folder / 'config.json').write_text('{"model_type": "llama"}')
    (folder / 'tokenizer.json').write_text('{}')
    for model in ([], ['--model', str(folder)]):
        line = refused(capsys, ['explain', '--prompt', 'a', '--target', target, '--contrast', contrast, *model])
        assert line.startswith(
            f'zennit-attn: error: --contrast is the --target itself {written}: nothing to contrast; give another token'
        )
    # --contrast runner-up is the most likely other token, never the target: allowed with a target written so
    explain.check_contrast(argparse.Namespace(target='runner-up', contrast='runner-up'))
    with pytest.raises(UsageError):
        explain.check_contrast(argparse.Namespace(target=' b', contrast=' b'))


def test_palrp_shows_each_token_with_its_position(capsys, tiny_folder, tmp_path):
    """``--method palrp``: the positions' relevance is split off in a line and the heatmap, the top tokens and the
    written file are of the position-token pairs (before: the tokens' share alone, the positions dropped without a
    word); ``generate`` likewise."""
    output = tmp_path / 'pairs.tex'
    arguments = ['--prompt', 'The ice bear', '--model', str(tiny_folder['llama']), '--color', 'never', '-q']
    code, out, err = run(
        capsys, ['explain', *arguments, '--method', 'palrp', '--dtype', 'float64', '--output', str(output)]
    )
    assert code == 0, err
    assert 'to the positions' in out and 'Relevance of each input token with its position' in out
    code, out, err = run(capsys, ['generate', *arguments, '--method', 'palrp', '--max-new-tokens', '2'])
    assert code == 0, err
    assert 'to the positions' in out and 'Relevance of each token with its position' in out
