"""What every renderer draws: a :py:class:`Heatmap` (one explained output) made of :py:class:`Segment`\\ s of tokens
(one for a decoder-only or encoder model, encoder and decoder tokens for an encoder-decoder), with one colour
scale; how a token's text is split into its surrounding spaces and the part drawn on a coloured box; and how a
relevance is written in words (tooltips, legends, plain terminal text)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

from .colors import symmetric_scale
from .tokens import display_token

__all__ = ['Segment', 'Heatmap', 'resolve_scales', 'split_space', 'format_relevance', 'ScaleLike']

#: a colour scale option: None (each heatmap its own largest absolute relevance), ``'shared'`` (one scale, the
#: largest absolute relevance of all heatmaps drawn together) or a positive number
ScaleLike = float | str | None


@dataclass
class Segment:
    """Tokens (or words) with their relevance.

    Attributes
    ----------
    tokens: list of str
        Token texts as :py:func:`~zennit_attn.results.render.tokens.token_texts` gives them (spaces and line breaks
        included).
    values: list of float
        One relevance per token.
    label: str or None
        What the tokens are (``'encoder'``, ``'decoder'``), shown before them; None for a single segment.
    positions: list of list of int
        For each token (word), its position(s) in the explained input, for tooltips.
    """

    tokens: list[str]
    values: list[float]
    label: str | None = None
    positions: list[list[int]] = field(default_factory=list)

    def __post_init__(self):
        self.values = [float(value) for value in self.values]
        if len(self.tokens) != len(self.values):
            raise ValueError(f'{len(self.tokens)} tokens but {len(self.values)} relevance values')
        if not self.positions:
            self.positions = [[index] for index in range(len(self.tokens))]


@dataclass
class Heatmap:
    """One explained output: its segments, the colour scale and a caption.

    Attributes
    ----------
    segments: list of Segment
    scale: float
        Relevance of full colour (0: everything neutral).
    title: str or None
        A caption line, plain text (e.g. ``"row 0: target ' Paris' (id 12), logit 12.84"``).
    unscaled: set of (int, int)
        ``(segment, token)`` indices of tokens left out of the colour scale (e.g. an attention sink): drawn with
        their colour clipped to full saturation, with a dashed outline in HTML.
    """

    segments: list[Segment]
    scale: float = 0.0
    title: str | None = None
    unscaled: set[tuple[int, int]] = field(default_factory=set)

    @property
    def values(self) -> list[float]:
        return [value for segment in self.segments for value in segment.values]

    @property
    def scale_values(self) -> list[float]:
        """The values that set the colour scale: all but the :py:attr:`unscaled` ones."""
        return [
            value
            for part, segment in enumerate(self.segments)
            for index, value in enumerate(segment.values)
            if (part, index) not in self.unscaled
        ]


def resolve_scales(heatmaps: Sequence[Heatmap], scale: ScaleLike = None) -> None:
    """Set the colour scale of every heatmap: its own largest absolute relevance (``scale=None``), the largest of all
    (``'shared'``) or ``scale`` (a positive number); values of :py:attr:`Heatmap.unscaled` tokens do not count.

    Parameters
    ----------
    heatmaps: sequence of Heatmap
    scale: None, 'shared' or float
    """
    if isinstance(scale, str):
        if scale != 'shared':
            raise ValueError(f"scale must be None, 'shared' or a positive number, got {scale!r}")
        common = max((symmetric_scale(heatmap.scale_values) for heatmap in heatmaps), default=0.0)
        for heatmap in heatmaps:
            heatmap.scale = common
        return
    if scale is not None and not isinstance(scale, numbers.Real):
        raise ValueError(f"scale must be None, 'shared' or a positive number, got {scale!r}")
    for heatmap in heatmaps:
        heatmap.scale = symmetric_scale(heatmap.scale_values, scale)


def split_space(token: str) -> tuple[str, str, str]:
    """``(leading spaces, shown text, trailing spaces)`` of a token: the spaces are drawn between the coloured boxes,
    the shown text (:py:func:`~zennit_attn.results.render.tokens.display_token`) on its box. A token of spaces only is
    shown as ``'␣'`` on its box; line breaks are shown as ``'⏎'``.

    Parameters
    ----------
    token: str

    Returns
    -------
    tuple of str
    """
    core = token.strip(' ')
    if not core:
        return '', display_token(token), ''
    lead = len(token) - len(token.lstrip(' '))
    trail = len(token) - len(token.rstrip(' '))
    return ' ' * lead, display_token(core), ' ' * trail


def format_relevance(value: float, digits: int = 4) -> str:
    """A relevance with its sign and ``digits`` significant digits (``3.670405 -> '+3.67'``).

    Parameters
    ----------
    value: float
    digits: int

    Returns
    -------
    str
    """
    return f'{float(value):+.{digits}g}'
