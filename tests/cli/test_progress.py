"""Progress messages on stderr (:py:mod:`zennit_attn.cli.progress`)."""

from __future__ import annotations

import io
import time

import pytest

from zennit_attn.cli.progress import status


def test_status_line():
    stream = io.StringIO()
    with status('loading the model', stream=stream):
        pass
    assert stream.getvalue().startswith('zennit-attn: loading the model ... done (')
    assert stream.getvalue().count('\n') == 1
    stream = io.StringIO()
    with pytest.raises(RuntimeError), status('loading', stream=stream):
        raise RuntimeError
    assert stream.getvalue() == 'zennit-attn: loading ... failed\n'
    stream = io.StringIO()
    with status('loading', enabled=False, stream=stream):
        pass
    assert stream.getvalue() == ''

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    with status('loading', stream=stream):
        time.sleep(0.5)
    text = stream.getvalue()
    assert '\r' in text and ' s ' in text and text.rstrip().endswith('s)') and text.endswith('\n')
