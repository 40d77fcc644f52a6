"""The demo's argument check: an output path that cannot be written is refused before anything is loaded."""
from __future__ import annotations

import os

import pytest

from zennit_attn import demo


def _refused(capsys, argv) -> str:
    """Run ``parse_args(argv)``, expect argparse's exit with status 2, return the error line it printed."""
    with pytest.raises(SystemExit) as info:
        demo.parse_args(argv)
    assert info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith('python -m zennit_attn.demo: error: '), error
    return error[-1]


def test_output_is_a_directory(tmp_path, capsys):
    line = _refused(capsys, ['--output', str(tmp_path)])
    assert 'is a directory' in line and str(tmp_path) in line
    assert 'is a directory' in _refused(capsys, ['--output', ''])  # the current directory


def test_output_inside_a_regular_file(tmp_path, capsys):
    regular = tmp_path / 'file.txt'
    regular.write_text('not a folder')
    for path in (regular / 'out.html', regular / 'deeper' / 'out.html'):
        line = _refused(capsys, ['--output', str(path)])
        assert 'not a folder' in line and str(regular) in line
    assert regular.read_text() == 'not a folder'


@pytest.mark.skipif(not hasattr(os, 'geteuid') or os.geteuid() == 0,
                    reason='root may write into read-only folders (chmod does not stop it): see '
                           'test_output_not_writable_by_access for the same check with os.access denying')
def test_output_in_a_read_only_folder(tmp_path, capsys):
    folder = tmp_path / 'read-only'
    folder.mkdir()
    existing = folder / 'old.html'
    existing.write_text('old')
    existing.chmod(0o444)
    folder.chmod(0o555)
    try:
        assert 'cannot write' in _refused(capsys, ['--output', str(folder / 'new.html')])
        assert 'cannot write' in _refused(capsys, ['--output', str(folder / 'sub' / 'new.html')])
        assert 'cannot write' in _refused(capsys, ['--output', str(existing)])
    finally:
        folder.chmod(0o755)


def test_output_not_writable_by_access(tmp_path, capsys, monkeypatch):
    """The permission check asks os.access (which says yes to root for any mode bits): here it says no for
    one folder and one file, as it does for an ordinary user in a read-only folder."""
    folder = tmp_path / 'read-only'
    folder.mkdir()
    existing = tmp_path / 'old.html'
    existing.write_text('old')
    denied = {str(folder), str(existing)}
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if str(path) in denied and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, 'access', access)
    for path in (folder / 'new.html', folder / 'missing' / 'new.html'):
        line = _refused(capsys, ['--output', str(path)])
        assert 'cannot write' in line and str(folder) in line
    line = _refused(capsys, ['--output', str(existing)])
    assert 'cannot write' in line and str(existing) in line
    # the same paths are fine where access says yes
    assert demo.parse_args(['--output', str(tmp_path / 'new.html')]).output == tmp_path / 'new.html'


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc, a folder that refuses new files')
def test_output_where_the_file_system_refuses(capsys):
    """/proc passes every permission check (os.access says yes to root) but refuses new files: trying to create the
    file finds it, before anything is loaded."""
    line = _refused(capsys, ['--output', '/proc/zennit-attn-heatmap.html'])
    assert 'cannot write' in line and '/proc/zennit-attn-heatmap.html' in line


def test_good_outputs(tmp_path, capsys):
    existing = tmp_path / 'old.html'
    existing.write_text('old')
    for path in (tmp_path / 'new.html', existing, tmp_path / 'missing' / 'deeper' / 'new.html'):
        args = demo.parse_args(['--output', str(path)])
        assert args.output == path
    assert demo.parse_args([]).output.name == 'heatmap.html'
    # nothing is created or changed by the check
    assert sorted(p.name for p in tmp_path.iterdir()) == ['old.html'] and existing.read_text() == 'old'
    assert capsys.readouterr().err == ''


def test_todays_options_and_defaults(capsys):
    args = demo.parse_args([])
    assert (args.prompt, args.output.name, args.composite, args.top, args.color, args.report) == (
        'The Eiffel Tower is located in the city of', 'heatmap.html', 'attnlrp', 3, 'auto', False)
    args = demo.parse_args(['--prompt', 'Hello', '--composite', 'cplrp', '--top', '2', '--color', 'never', '--report'])
    assert (args.prompt, args.composite, args.top, args.color, args.report) == ('Hello', 'cplrp', 2, 'never', True)
    with pytest.raises(SystemExit) as info:
        demo.parse_args(['--help'])
    assert info.value.code == 0
    manual = capsys.readouterr().out
    assert manual.startswith('usage: python -m zennit_attn.demo')
    for option in ('--prompt', '--output', '--composite', '--top', '--color', '--report'):
        assert option in manual
    assert 'must be at least 1' in _refused(capsys, ['--top', '0'])
    assert 'must not be empty' in _refused(capsys, ['--prompt', '  '])


def test_options_on_another_parser(tmp_path):
    """``zennit-attn demo`` reuses the options and their checks on its own parser."""
    import argparse

    class Refused(Exception):
        pass

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise Refused(message)

    parser = demo.add_arguments(Parser(prog='other'))
    args = demo.check_args(parser, parser.parse_args(['--output', str(tmp_path / 'x.html')]))
    assert args.output == tmp_path / 'x.html' and args.prompt == demo.DEFAULT_PROMPT
    with pytest.raises(Refused, match='is a directory'):
        demo.check_args(parser, parser.parse_args(['--output', str(tmp_path)]))
