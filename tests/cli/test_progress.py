"""Progress messages on stderr (:py:mod:`zennit_attn.cli.progress`), with a clock of the test's own (no sleeping)."""

from __future__ import annotations

import io

import pytest

from zennit_attn.cli.progress import status


class Clock:
    """A clock that stands still until the test moves it."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_status_line():
    clock = Clock()
    stream = io.StringIO()
    with status('loading the model', stream=stream, clock=clock):
        clock.now += 2.5
    assert stream.getvalue() == 'zennit-attn: loading the model ... done (2.5 s)\n'
    stream = io.StringIO()
    with pytest.raises(RuntimeError), status('loading', stream=stream, clock=clock):
        raise RuntimeError
    assert stream.getvalue() == 'zennit-attn: loading ... failed\n'
    stream = io.StringIO()
    with status('loading', enabled=False, stream=stream, clock=clock) as line:
        assert line is None
    assert stream.getvalue() == ''


def test_spinner_on_a_terminal():
    """On a terminal the line is redrawn with a spinner frame and the elapsed whole seconds at each tick, and ends
    with the time the block took; a line that is not a terminal's is never redrawn."""
    clock = Clock()
    stream = Terminal()
    with status('loading', stream=stream, clock=clock, interval=None) as line:
        for _ in range(5):
            clock.now += 1.2
            line.tick()
        clock.now += 0.3
    frames = [f'\rzennit-attn: loading ... {frame} {seconds} s ' for frame, seconds in zip('|/-\\|', (1, 2, 4, 5, 6))]
    assert stream.getvalue() == 'zennit-attn: loading ...' + ''.join(frames) + (
        '\rzennit-attn: loading ... done (6.3 s)        \n'
    )
    stream = io.StringIO()
    with status('loading', stream=stream, clock=clock, interval=None) as line:
        line.tick()
    assert stream.getvalue() == 'zennit-attn: loading ... done (0.0 s)\n'


def test_spinner_thread_stops_with_the_block():
    """With the spinner thread (the default interval) the line ends exactly once, after the thread stopped."""
    clock = Clock()
    stream = Terminal()
    with status('loading', stream=stream, clock=clock):
        clock.now += 3.0
    text = stream.getvalue()
    assert text.startswith('zennit-attn: loading ...')
    assert text.endswith('\rzennit-attn: loading ... done (3.0 s)        \n') and text.count('\n') == 1
