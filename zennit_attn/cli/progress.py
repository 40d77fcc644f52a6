"""Progress on stderr while a command loads or computes: :py:func:`status`, a spinner with the elapsed seconds on a
terminal, one line otherwise (the loaders' own progress bars are hidden by
:py:func:`zennit_attn.cli.loading.quiet_loading`)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from .errors import PROG

__all__ = ['status', 'Status', 'spinning', 'isatty']


def isatty(stream) -> bool:
    """Whether ``stream`` is a terminal (False for streams without ``isatty`` or closed ones)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Status:
    """One progress line on ``stream``: ``PROG: message ...``, redrawn with a spinner frame and the elapsed seconds by
    :py:meth:`tick` (on a terminal), ended by :py:meth:`finish`.

    Parameters
    ----------
    message: str
        What is being done.
    stream: file-like
        Where the line goes.
    clock: callable
        ``clock() -> seconds`` (default :py:func:`time.perf_counter`): the elapsed time is read from it, so that a
        test can give its own clock.
    """

    #: the spinner's frames, one per :py:meth:`tick`
    FRAMES = '|/-\\'

    def __init__(self, message: str, stream: TextIO, clock: Callable[[], float] = time.perf_counter):
        self.line = f'{PROG}: {message} ...'
        self.stream, self.clock = stream, clock
        self.live = isatty(stream)
        self.lock = threading.Lock()
        self.ticks = 0
        self.start = clock()

    def elapsed(self) -> float:
        """Seconds since the line was started."""
        return self.clock() - self.start

    def begin(self) -> None:
        """Write the line (without its end)."""
        self.write(self.line)

    def tick(self) -> None:
        """Redraw the line with the next spinner frame and the elapsed whole seconds (on a terminal only)."""
        if self.live:
            frame = self.FRAMES[self.ticks % len(self.FRAMES)]
            self.write(f'\r{self.line} {frame} {self.elapsed():.0f} s ')
            self.ticks += 1

    def finish(self, outcome: str) -> None:
        """End the line with ``outcome`` (``done (N s)`` or ``failed``)."""
        self.write(f'\r{self.line} {outcome}        \n' if self.live else f' {outcome}\n')

    def write(self, text: str) -> None:
        with self.lock:
            self.stream.write(text)
            self.stream.flush()


@contextlib.contextmanager
def spinning(line: Status, interval: float | None) -> Iterator[None]:
    """While the block runs, :py:meth:`Status.tick` ``line`` every ``interval`` seconds from a thread (on a terminal;
    not at all for ``interval`` None)."""
    if not line.live or interval is None:
        yield
        return
    stop = threading.Event()

    def spin():
        while not stop.wait(interval):
            line.tick()

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def status(
    message: str,
    enabled: bool = True,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.perf_counter,
    interval: float | None = 0.2,
) -> Iterator[Status | None]:
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
    clock: callable
        ``clock() -> seconds``, the source of the elapsed time (default :py:func:`time.perf_counter`).
    interval: float or None
        Seconds between the spinner's frames on a terminal (default 0.2); None: no spinner thread, the block
        calls :py:meth:`Status.tick` of the yielded line itself.

    Yields
    ------
    Status or None
        The line (None where ``enabled`` is False).
    """
    if not enabled:
        yield None
        return
    line = Status(message, stream if stream is not None else sys.stderr, clock)
    line.begin()
    outcome = 'failed'
    try:
        with spinning(line, interval):
            yield line
            outcome = f'done ({line.elapsed():.1f} s)'
    finally:
        line.finish(outcome)
