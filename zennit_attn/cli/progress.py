"""Progress on stderr while a command loads or computes: :py:func:`status` (a spinner with the elapsed seconds on a
terminal, one line otherwise) and :py:func:`quiet_loading` (no progress bars from the model loaders)."""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

from .errors import PROG

__all__ = ['status', 'quiet_loading', 'isatty']


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


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Hide the progress bars of GGUF dequantisation and weight loading while the block runs.

    The weight loader uses the progress bar switch of ``transformers.utils.logging``; the GGUF converter uses a
    plain ``tqdm`` imported into its module, which is swapped for a disabled one. Both are restored on exit.
    """
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    gguf_module, gguf_tqdm = None, None
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_module
        gguf_tqdm = getattr(gguf_module, 'tqdm', None)
    except ImportError:  # other transformers versions: the bars just stay
        gguf_module = None
    if gguf_tqdm is not None:
        gguf_module.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_module.tqdm = gguf_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()
