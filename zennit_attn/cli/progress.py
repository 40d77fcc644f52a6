"""Progress on stderr while a command loads or computes: :py:func:`status`, a spinner with the elapsed seconds on a
terminal, one line otherwise (the loaders' own progress bars are hidden by
:py:func:`zennit_attn.cli.loading.quiet_loading`)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from .errors import PROG

__all__ = ['status', 'isatty']


def isatty(stream) -> bool:
    """Whether ``stream`` is a terminal (False for streams without ``isatty`` or closed ones)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def status(message: str, enabled: bool = True, stream: TextIO | None = None) -> Iterator[None]:
    """Show ``message`` on ``stream`` (stderr) while the block runs: a spinner with the elapsed seconds on a
    terminal, else one line; then ``done (N s)`` or ``failed``.

    Parameters
    ----------
    message: str
        What is being done, e.g. ``'loading the tokenizer'``.
    enabled: bool
        False shows nothing (``--quiet``).
    stream: file-like, optional
        Default ``sys.stderr``.
    """
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        yield
        return
    start = time.perf_counter()
    live = isatty(stream)
    stop = threading.Event()
    lock = threading.Lock()
    thread = None
    line = f'{PROG}: {message} ...'
    stream.write(line)
    stream.flush()
    if live:

        def spin():
            frames = '|/-\\'
            index = 0
            while not stop.wait(0.2):
                with lock:
                    stream.write(f'\r{line} {frames[index % 4]} {time.perf_counter() - start:.0f} s ')
                    stream.flush()
                index += 1

        thread = threading.Thread(target=spin, daemon=True)
        thread.start()
    outcome = 'failed'
    try:
        yield
        outcome = f'done ({time.perf_counter() - start:.1f} s)'
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        with lock:
            stream.write(f'\r{line} {outcome}        \n' if live else f' {outcome}\n')
            stream.flush()
