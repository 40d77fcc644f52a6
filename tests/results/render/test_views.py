"""The one output-path check (``check_output``): what it refuses, with messages that name the path and the fix, and
that it leaves nothing behind and changes no existing file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zennit_attn.results.render.views import IMAGE_SUFFIXES, SUFFIXES, check_output


def test_accepts_the_formats_and_leaves_nothing_behind(tmp_path):
    for suffix in SUFFIXES:
        assert check_output(str(tmp_path / f'out{suffix}')) == tmp_path / f'out{suffix}'
    assert check_output(tmp_path / 'OUT.HTML') == tmp_path / 'OUT.HTML'  # suffixes compare in lower case
    assert check_output(tmp_path / 'new' / 'folder' / 'out.png') == tmp_path / 'new' / 'folder' / 'out.png'
    assert list(tmp_path.iterdir()) == []  # neither the tried files nor missing folders are made


def test_an_existing_file_is_not_changed(tmp_path):
    path = tmp_path / 'page.html'
    path.write_text('keep me')
    assert check_output(path) == path
    assert path.read_text() == 'keep me'


def test_refuses_a_suffix_of_another_format(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"format of '.*out\.jpeg' from its suffix '\.jpeg': use one of \.html, "
        r'\.png, \.svg, \.pdf, \.tex$',
    ):
        check_output(tmp_path / 'out.jpeg')
    with pytest.raises(ValueError, match=r"suffix '\(none\)'"):
        check_output(tmp_path / 'out')
    with pytest.raises(ValueError, match=r'use one of \.png$'):
        check_output(tmp_path / 'out.svg', IMAGE_SUFFIXES)
    assert check_output(tmp_path / 'out.png', IMAGE_SUFFIXES) == tmp_path / 'out.png'


def test_refuses_a_directory_and_a_path_below_a_file(tmp_path):
    with pytest.raises(
        ValueError,
        match=rf"cannot write '{tmp_path}': it is a directory; give a file name such as "
        rf"'{tmp_path / 'heatmap.html'}'",
    ):
        check_output(tmp_path)
    (tmp_path / 'folder.png').mkdir()
    with pytest.raises(ValueError, match=r"it is a directory; give a file name such as '.*heatmap\.png'"):
        check_output(tmp_path / 'folder.png', IMAGE_SUFFIXES)
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    with pytest.raises(
        ValueError,
        match=rf"cannot write '{blocker / 'sub' / 'out.png'}': '{blocker}' is a file, "
        r'not a folder; choose a path in a folder',
    ):
        check_output(blocker / 'sub' / 'out.png')


@pytest.mark.skipif(hasattr(os, 'geteuid') and os.geteuid() == 0, reason='root may write in any folder')
def test_refuses_a_folder_without_write_permission(tmp_path):
    folder = tmp_path / 'locked'
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(ValueError, match=rf"no permission to write in the folder '{folder}'; choose a folder"):
            check_output(folder / 'sub' / 'out.html')
        with pytest.raises(ValueError, match='cannot write'):
            check_output(folder / 'out.html')
    finally:
        folder.chmod(0o700)


@pytest.mark.skipif(not Path('/proc/version').is_file(), reason='needs Linux /proc')
def test_refuses_what_the_file_system_refuses():
    """/proc takes no new files, and /proc/version cannot be written, whatever the permissions say (root passes
    os.access there): the file is really opened to find out."""
    with pytest.raises(
        ValueError,
        match=r"cannot write '/proc/zennit-attn-check\.html': .*; choose another file or "
        r'folder',
    ):
        check_output('/proc/zennit-attn-check.html')
    with pytest.raises(ValueError, match=r"cannot write '/proc/version'"):
        check_output('/proc/version', suffixes=('',))


def test_refuses_what_is_not_a_path():
    with pytest.raises(TypeError, match=r'\(str or os.PathLike\), got int'):
        check_output(3)
