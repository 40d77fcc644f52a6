"""Token relevance heatmaps for the terminal: 24-bit ANSI colours, or plain ``token[relevance]`` text.

Colours are the diverging map of :py:func:`~zennit_attn.results.render.colors.relevance_to_rgb` (light grey for 0, red
for positive relevance, blue for negative, symmetric), the same in every format of :py:mod:`zennit_attn.results.render`.
By default a row is normalised by its largest absolute relevance, so the most relevant token is fully saturated.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Sequence
from typing import IO

import torch

from .colors import RGB, relevance_to_rgb, symmetric_scale, text_color
from .layout import Heatmap, Segment, format_relevance, split_space
from .tokens import display_token

__all__ = ['use_color', 'render_terminal', 'terminal_heatmap']

RelevanceLike = torch.Tensor | Sequence[float]


def use_color(color: bool | None = None, stream: IO | None = None) -> bool:
    """Decide whether to emit ANSI colours.

    Parameters
    ----------
    color: bool or None
        True or False force the decision. None decides automatically: no colour if the ``NO_COLOR`` environment
        variable is set to a non-empty value (https://no-color.org) or ``TERM`` is ``dumb``, otherwise colour
        exactly when ``stream`` is a terminal.
    stream: file-like, optional
        The stream the output goes to; default ``sys.stdout``.

    Returns
    -------
    bool
    """
    if color is not None:
        return bool(color)
    if os.environ.get('NO_COLOR', ''):
        return False
    if os.environ.get('TERM', '') == 'dumb':
        return False
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, 'isatty', None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (ValueError, OSError):  # closed or detached stream
        return False


def _values(tokens: Sequence[str], relevance: RelevanceLike) -> list[float]:
    if isinstance(relevance, torch.Tensor):
        relevance = relevance.detach().to('cpu', torch.float64)
        if relevance.dim() != 1:
            relevance = relevance.squeeze()
        if relevance.dim() != 1:
            raise ValueError(f'relevance must be one row [seq], got shape {tuple(relevance.shape)}')
        values = relevance.tolist()
    else:
        values = [float(value) for value in relevance]
    if len(values) != len(tokens):
        raise ValueError(f'{len(tokens)} tokens but {len(values)} relevance values')
    return values


def _ansi(rgb: RGB, background: bool) -> str:
    return '\x1b[{};2;{};{};{}m'.format(48 if background else 38, *rgb)


def _colored(segment: Segment, scale: float) -> str:
    parts = []
    for token, value in zip(segment.tokens, segment.values):
        lead, shown, trail = split_space(token)
        background = relevance_to_rgb(value, scale)
        parts.append(lead + _ansi(background, True) + _ansi(text_color(background), False) + shown + '\x1b[0m' + trail)
        if '\n' in token:
            parts.append('\n')
    return ''.join(parts)


#: bidirectional classes of right-to-left text (Hebrew, Arabic letters and digits)
_RIGHT_TO_LEFT = frozenset({'R', 'AL', 'AN'})


def _isolated(text: str) -> str:
    """``text`` between FIRST STRONG ISOLATE and POP DIRECTIONAL ISOLATE (U+2068, U+2069), its leading and trailing
    spaces outside, if it holds right-to-left characters; else ``text`` as it is.

    A display that applies the Unicode bidirectional algorithm (Jupyter's output, a browser, a BiDi terminal) lays
    out a run of right-to-left tokens from right to left, their ``[relevance]`` with them, so that each value would
    stand right of the next token; an isolated token is one unit in the left-to-right line, its value right of it.
    """
    if not any(unicodedata.bidirectional(char) in _RIGHT_TO_LEFT for char in text):
        return text
    core = text.strip(' ')
    lead = text[: len(text) - len(text.lstrip(' '))]
    return f'{lead}\u2068{core}\u2069{text[len(lead) + len(core) :]}'  # the spaces stay outside, where they are


def _plain(segment: Segment, digits: int) -> str:
    return ''.join(
        f'{_isolated(display_token(token))}[{format_relevance(value, digits)}]'
        for token, value in zip(segment.tokens, segment.values)
    )


def render_terminal(
    tokens: Sequence[str],
    relevance: RelevanceLike,
    color: bool | None = None,
    scale: float | None = None,
    stream: IO | None = None,
    digits: int = 3,
) -> str:
    """Render tokens with their relevance as text for a terminal.

    In colour mode every token gets a 24-bit ANSI background colour from :py:func:`relevance_to_rgb` and black or
    white text (:py:func:`text_color`); its leading and trailing spaces stay uncoloured between the boxes, and a
    token that contains a line break is followed by a real line break, so multi-line inputs keep their shape.
    Without colour the output is the concatenation of ``token[relevance]`` pairs, e.g. ``The[-1.51]
    E[+0.329]iffel[+3.67]``. Tokens are shown with :py:func:`display_token` in both modes (``'\\n'`` as ``'⏎'``).

    Parameters
    ----------
    tokens: sequence of str
        Decoded tokens, one per position.
    relevance: torch.Tensor or sequence of float
        One relevance per token (``[seq]``).
    color: bool or None
        Force colour (True) or plain text (False); None decides with :py:func:`use_color` for ``stream``.
    scale: float, optional
        Relevance of full saturation; default the row's largest absolute (finite) relevance.
    stream: file-like, optional
        Where the text will be written, for the automatic colour decision; default ``sys.stdout``.
    digits: int
        Significant digits of the relevance in plain mode.

    Returns
    -------
    str
        The rendered text, without a trailing newline.
    """
    segment = Segment(list(tokens), _values(tokens, relevance))
    if not use_color(color, stream):
        return _plain(segment, digits)
    return _colored(segment, symmetric_scale(segment.values, scale))


def terminal_heatmap(heatmap: Heatmap, color: bool | None = None, stream: IO | None = None, digits: int = 3) -> str:
    """A :py:class:`~zennit_attn.results.render.layout.Heatmap` for the terminal: its caption, then each segment (with
    its label) as :py:func:`render_terminal` draws it, then the colour scale.

    Parameters
    ----------
    heatmap: Heatmap
        With its scale resolved.
    color, stream, digits
        As for :py:func:`render_terminal`.

    Returns
    -------
    str
        Lines without a trailing newline.
    """
    colored = use_color(color, stream)
    lines = [heatmap.title] if heatmap.title else []
    for segment in heatmap.segments:
        text = _colored(segment, heatmap.scale) if colored else _plain(segment, digits)
        lines.append(f'{segment.label}: {text}' if segment.label else text)
    if colored:
        lines.append(
            f'colour scale: blue {format_relevance(-heatmap.scale)} .. grey 0 .. red {format_relevance(heatmap.scale)}'
        )
    return '\n'.join(lines)
