"""Pieces of the commands' printouts on stdout: the colour choice, the heatmap legend, the method label, shortened
prompts and decoded tokens."""

from __future__ import annotations

import argparse
import sys

from ..results.render import use_color

__all__ = ['color_choice', 'legend', 'method_label', 'shorten', 'decode']


def color_choice(choice: str) -> bool | None:
    """``--color`` as the ``color`` argument of ``show``: auto -> None, always -> True, never -> False."""
    return {'auto': None, 'always': True, 'never': False}[choice]


def legend(choice: str) -> str:
    """The legend after a heatmap's heading: the colours, or the plain ``token[relevance]`` form."""
    return ' (red: for, blue: against)' if use_color(color_choice(choice), sys.stdout) else ' (token[relevance])'


def method_label(args: argparse.Namespace) -> str:
    """The method as the printout names it, with ``--composite`` and ``--param`` values."""
    label = args.method + (f' with --composite {args.composite}' if args.composite else '')
    if args.params:
        label += ' (' + ', '.join(f'{key}={value!r}' for key, value in args.params.items()) + ')'
    return label


def shorten(text: str, limit: int = 120) -> str:
    """``text``, or its start and end around ``' ... '`` where it is longer than ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 30] + ' ... ' + text[-25:]


def decode(tokenizer, token: int) -> str:
    """The text of one token id."""
    return tokenizer.decode([int(token)])
