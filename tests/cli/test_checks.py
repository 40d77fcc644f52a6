"""The shared argument checks (:py:mod:`zennit_attn.cli.checks`): method, composite and ``--param``; the prompt and
``--input``; ``--output``; ``--target``. Each refusal is one line and exit status 2, before anything is loaded (the
autouse fixture ``no_loading`` fails a test that loads)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import PROMPT, refused
from zennit_attn.cli import build_parser, checks
from zennit_attn.cli.errors import UsageError


# ------------------------------------------------------------------------------------------------ method, composite
def test_unknown_method_and_composite(capsys):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--method', 'shapley'])
    assert '--method' in line and 'attnlrp' in line and "'zennit-attn explain --help'" in line
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--composite', 'gamma'])
    assert '--composite' in line and 'cplrp' in line
    line = refused(capsys, ['generate', '--prompt', PROMPT, '--composite', 'gamma'])
    assert "'zennit-attn generate --help'" in line


@pytest.mark.parametrize('method', ['gradcam', 'integrated_gradients', 'random'])
def test_composite_with_a_method_that_is_not_lrp(capsys, method):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--method', method, '--composite', 'attnlrp'])
    assert '--composite applies to the LRP methods (attnlrp, cplrp, palrp, attnlrp_late)' in line and method in line
    refused(capsys, ['generate', '--prompt', PROMPT, '--method', method, '--composite', 'cplrp'])


def test_composite_contradicting_the_method(capsys):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--method', 'attnlrp', '--composite', 'cplrp'])
    assert 'contradicts' in line and '--method cplrp' in line


def test_method_and_composite_resolution():
    def resolved(*argv):
        args = build_parser().parse_args(['explain', '--prompt', PROMPT, *argv])
        return checks.method_and_composite(args)

    assert resolved() == ('attnlrp', None)
    assert resolved('--composite', 'cplrp') == ('cplrp', 'cplrp')
    assert resolved('--method', 'cplrp') == ('cplrp', None)
    assert resolved('--method', 'cplrp', '--composite', 'cplrp') == ('cplrp', 'cplrp')
    assert resolved('--method', 'gradcam') == ('gradcam', None)


def test_params(capsys):
    assert checks.parse_params(['steps=50', 'baseline=0.5'], 'integrated_gradients') == {'steps': 50, 'baseline': 0.5}
    assert checks.parse_params(['score=log_softmax'], 'atman') == {'score': 'log_softmax'}
    assert checks.parse_params(['seed=None'], 'random') == {'seed': None}
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--method', 'integrated_gradients', '--param', 'step=5'])
    assert "'step'" in line and 'steps, baseline' in line
    assert 'NAME=VALUE' in refused(capsys, ['explain', '--prompt', PROMPT, '--param', 'steps'])
    assert 'no parameters' in refused(capsys, ['explain', '--prompt', PROMPT, '--param', 'steps=5'])


@pytest.mark.parametrize('command', ['explain', 'generate', 'explain-dataset'])
@pytest.mark.parametrize(
    'method, param, name',
    [
        ('integrated_gradients', 'steps=0', 'steps'),
        ('integrated_gradients', 'steps=abc', 'steps'),
        ('smoothgrad', 'sigma=-1', 'sigma'),
        ('atman', 'score=bogus', 'score'),
    ],
)
def test_param_values_are_checked_before_loading(capsys, tmp_path, command, method, param, name):
    """A value the method refuses is a bad argument: exit status 2 naming the parameter, before the model is loaded
    (it used to be exit status 1 after loading)."""
    if command == 'explain-dataset':
        texts = tmp_path / 'texts.jsonl'
        texts.write_text('{"text": "The bear"}\n')
        argv = [command, '--input', str(texts), '--output', str(tmp_path / 'out')]
    else:
        argv = [command, '--prompt', PROMPT]
    line = refused(capsys, argv + ['--method', method, '--param', param])
    assert f'--param for method {method}: ' in line and name in line, line
    assert not (tmp_path / 'out').exists()


# ---------------------------------------------------------------------------------------------------------- prompt
@pytest.mark.parametrize('command', ['explain', 'generate', 'neurons'])
@pytest.mark.parametrize('prompt', ['', '   ', '\n\t'])
def test_empty_prompt(capsys, command, prompt):
    assert '--prompt is empty' in refused(capsys, [command, '--prompt', prompt])


def test_prompt_or_input_required(capsys):
    assert 'required' in refused(capsys, ['explain'])
    assert 'not allowed with' in refused(capsys, ['explain', '--prompt', PROMPT, '--input', 'x.txt'])


def test_missing_input_file(capsys, tmp_path):
    line = refused(capsys, ['explain', '--input', str(tmp_path / 'missing.txt')])
    assert 'no such file' in line and 'missing.txt' in line
    assert 'is a folder' in refused(capsys, ['generate', '--input', str(tmp_path)])


def test_empty_input_file(capsys, tmp_path):
    empty = tmp_path / 'empty.txt'
    empty.write_text('')
    assert 'is empty' in refused(capsys, ['explain', '--input', str(empty)])
    blank = tmp_path / 'blank.txt'
    blank.write_text('  \n\n')
    assert 'only white space' in refused(capsys, ['explain', '--input', str(blank)])
    newlines = tmp_path / 'newlines.txt'
    newlines.write_text('\n\n')
    assert 'is empty' in refused(capsys, ['generate', '--input', str(newlines)])


def test_input_not_utf8(capsys, tmp_path):
    binary = tmp_path / 'latin1.txt'
    binary.write_bytes('café'.encode('latin-1'))
    assert 'not UTF-8' in refused(capsys, ['explain', '--input', str(binary)])


def test_input_is_read(tmp_path):
    text = tmp_path / 'prompt.txt'
    text.write_text(PROMPT + '\n', encoding='utf-8')
    assert checks.read_prompt(None, text) == PROMPT
    text.write_bytes(b'\xef\xbb\xbf' + 'Ümlaut line\nsecond \r\n'.encode())  # byte order mark, CRLF
    assert checks.read_prompt(None, text) == 'Ümlaut line\nsecond '
    assert checks.read_prompt(None, Path('-'), stdin=io.StringIO(PROMPT + '\n')) == PROMPT
    with pytest.raises(UsageError, match='standard input is empty'):
        checks.read_prompt(None, Path('-'), stdin=io.StringIO(''))
    assert checks.read_prompt(' keeps its spaces ', None) == ' keeps its spaces '


def test_input_from_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, 'stdin', io.StringIO(' \n'))
    assert 'standard input holds only white space' in refused(capsys, ['explain', '--input', '-'])


# ---------------------------------------------------------------------------------------------------------- output
@pytest.mark.parametrize('command', ['explain', 'generate'])
def test_output_is_a_directory(capsys, tmp_path, command):
    line = refused(capsys, [command, '--prompt', PROMPT, '--output', str(tmp_path)])
    assert line.startswith('zennit-attn: error: --output: ') and 'is a directory' in line and str(tmp_path) in line


def test_output_under_a_regular_file(capsys, tmp_path):
    regular = tmp_path / 'file.txt'
    regular.write_text('not a folder')
    for path in (regular / 'x.html', regular / 'deeper' / 'x.html'):
        line = refused(capsys, ['explain', '--prompt', PROMPT, '--output', str(path)])
        assert 'not a folder' in line and str(regular) in line
    assert regular.read_text() == 'not a folder'


def test_output_not_writable(capsys, tmp_path, monkeypatch):
    folder = tmp_path / 'read-only'
    folder.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os,
        'access',
        lambda path, mode, *args, **kwargs: (
            False if str(path) == str(folder) and mode & os.W_OK else real_access(path, mode, *args, **kwargs)
        ),
    )
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--output', str(folder / 'x.html')])
    assert 'cannot write' in line and 'permission' in line


@pytest.mark.parametrize('name', ['x.jpg', 'x', 'x.html.bak', 'x.txt'])
def test_output_format(capsys, tmp_path, name):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--output', str(tmp_path / name)])
    assert '.html, .png, .svg, .pdf, .tex' in line


def test_good_outputs(tmp_path):
    for name in ('x.html', 'x.PNG', 'x.svg', 'x.pdf', 'x.tex', 'new/folder/x.html'):
        assert checks.check_output_option(tmp_path / name) == tmp_path / name
    assert checks.check_output_option(None) is None
    assert list(tmp_path.iterdir()) == []  # nothing created by the check


# ---------------------------------------------------------------------------------------------------------- target
def test_target_parsing(capsys):
    assert checks.parse_target(None) is None
    assert checks.parse_target('id:7042') == 7042
    assert checks.parse_target(' Paris') == ' Paris'
    assert checks.parse_target('id') == 'id'  # a token string
    for bad in ('id:', 'id:x', 'id:-1', 'id:1.5'):
        assert 'id: must be followed by a token id' in refused(capsys, ['explain', '--prompt', PROMPT, '--target', bad])
    assert '--target is empty' in refused(capsys, ['explain', '--prompt', PROMPT, '--target', ''])


# ---------------------------------------------------------------------------------------- the method for the model
def test_encoder_decoder_refusals(capsys, tmp_path):
    """What the library refuses for an encoder-decoder model once loaded (attention-map methods, latent sites) is
    refused by the checks, which read is_encoder_decoder from config.json: exit status 2, nothing loaded."""
    folder = tmp_path / 't5'
    folder.mkdir()
    (folder / 'config.json').write_text('{"model_type": "t5", "is_encoder_decoder": true}')
    (folder / 'tokenizer.json').write_text('{}')
    texts = tmp_path / 'texts.jsonl'
    texts.write_text('{"text": "The bear"}\n')
    others = (
        'use one of attnlrp, cplrp, palrp, attnlrp_late, input_x_gradient, integrated_gradients, smoothgrad, atman, '
        'kernelshap, random'
    )
    for method in ('attention_rollout', 'grad_attention_rollout', 'gradcam'):
        reason = 'reads attention maps, which are not implemented for encoder-decoder models'
        for argv in (
            ['explain', '--prompt', PROMPT],
            ['generate', '--prompt', PROMPT],
            ['explain-dataset', '--input', str(texts), '--output', str(tmp_path / 'out')],
        ):
            line = refused(capsys, [*argv, '--model', str(folder), '--method', method])
            assert (
                f'--method {method} {reason} such as {folder} (its config.json says is_encoder_decoder); {others}'
                in line
            )
    line = refused(capsys, ['neurons', '--prompt', PROMPT, '--model', str(folder)])
    assert f'{folder} is an encoder-decoder model (its config.json says is_encoder_decoder): latent sites' in line
    assert not (tmp_path / 'out').exists()
