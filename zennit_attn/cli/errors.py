"""The two ways a ``zennit-attn`` command ends early, and the one-line form of its messages."""

from __future__ import annotations

__all__ = ['PROG', 'UsageError', 'CommandError', 'one_line']

#: the program name in messages and manuals
PROG = 'zennit-attn'


class UsageError(Exception):
    """A bad argument: one line on stderr, exit status 2. ``command`` names the subcommand whose ``--help`` helps."""

    def __init__(self, message: str, command: str | None = None):
        super().__init__(message)
        self.command = command


class CommandError(Exception):
    """A failure while running: one line on stderr, exit status 1."""


def one_line(text: object) -> str:
    """``text`` with its white space (line breaks included) collapsed to single spaces."""
    return ' '.join(str(text).split())
