"""Token relevance heatmaps: coloured text for the terminal and standalone HTML pages.

Both renderers use the same diverging colour scale, :py:func:`relevance_to_rgb`: white for 0, saturated red for
positive relevance (evidence *for* the explained output) and saturated blue for negative relevance (evidence
*against* it), linear in between and symmetric. By default a row is normalised by its largest absolute
relevance, so the most relevant token is fully saturated.

Only the standard library and torch are used.
"""
from __future__ import annotations

import html
import math
import os
import sys
from pathlib import Path
from typing import IO, Sequence

import torch

__all__ = [
    'RGB', 'POSITIVE', 'NEGATIVE', 'NEUTRAL', 'relevance_to_rgb', 'text_color', 'display_token', 'format_relevance',
    'use_color', 'render_terminal', 'render_html', 'write_html', 'from_explanation',
]

RGB = tuple[int, int, int]

#: colour of ``+scale``: saturated red
POSITIVE: RGB = (255, 0, 0)
#: colour of ``-scale``: saturated blue
NEGATIVE: RGB = (0, 0, 255)
#: colour of 0: white
NEUTRAL: RGB = (255, 255, 255)

_BLACK: RGB = (0, 0, 0)
_WHITE: RGB = (255, 255, 255)

#: visible stand-ins for whitespace characters that would break the layout
_VISIBLE = {'\n': '\u23ce', '\r': '\u240d', '\t': '\u21e5', '\x7f': '\u2421'}

RelevanceLike = torch.Tensor | Sequence[float]


def relevance_to_rgb(value: float, scale: float) -> RGB:
    """Map a relevance value to a colour on the diverging red/white/blue scale.

    Parameters
    ----------
    value: float
        The relevance.
    scale: float
        The relevance that gets the fully saturated colour (usually the largest absolute relevance of the row).
        Values beyond ``[-scale, scale]`` are clipped.

    Returns
    -------
    tuple of int
        ``(r, g, b)`` in 0..255: ``0 -> (255, 255, 255)``, ``+scale -> (255, 0, 0)``, ``-scale -> (0, 0, 255)``,
        ``+scale / 2 -> (255, 128, 128)``, ``-scale / 2 -> (128, 128, 255)``. White where ``value`` is NaN or
        ``scale`` is not a positive finite number (e.g. a row of zeros).
    """
    value, scale = float(value), float(scale)
    if math.isnan(value) or not (math.isfinite(scale) and scale > 0):
        return NEUTRAL
    fraction = max(-1.0, min(1.0, value / scale))
    target = POSITIVE if fraction >= 0 else NEGATIVE
    weight = abs(fraction)
    return tuple(int(round(white + (end - white) * weight)) for white, end in zip(NEUTRAL, target))  # type: ignore[return-value]


def _luminance(rgb: RGB) -> float:
    """Relative luminance of an sRGB colour (WCAG 2)."""
    def linear(channel: int) -> float:
        c = channel / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(channel) for channel in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_color(background: RGB) -> RGB:
    """Black or white, whichever has the higher WCAG contrast ratio on ``background``.

    Parameters
    ----------
    background: tuple of int
        ``(r, g, b)`` in 0..255.

    Returns
    -------
    tuple of int
        ``(0, 0, 0)`` or ``(255, 255, 255)``.
    """
    luminance = _luminance(background)
    on_black = (luminance + 0.05) / 0.05
    on_white = 1.05 / (luminance + 0.05)
    return _BLACK if on_black >= on_white else _WHITE


def display_token(token: str) -> str:
    """Make a token printable: leading/trailing spaces are kept, line breaks and control characters are shown.

    ``'\\n'`` becomes ``'⏎'``, ``'\\r'`` ``'␍'``, ``'\\t'`` ``'⇥'``, other C0 control characters (including ESC,
    which could otherwise inject terminal escape sequences) their Unicode control picture (``'\\x1b'`` ->
    ``'␛'``). An empty token becomes ``'∅'`` so that it stays visible.

    Parameters
    ----------
    token: str
        The decoded token.

    Returns
    -------
    str
    """
    if token == '':
        return '\u2205'
    out = []
    for char in token:
        if char in _VISIBLE:
            out.append(_VISIBLE[char])
        elif ord(char) < 0x20:
            out.append(chr(0x2400 + ord(char)))
        else:
            out.append(char)
    return ''.join(out)


def format_relevance(value: float, digits: int = 4) -> str:
    """Format a relevance with sign and ``digits`` significant digits (``3.670405 -> '+3.67'``)."""
    return f'{float(value):+.{digits}g}'


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


def _scale(values: Sequence[float], scale: float | None) -> float:
    if scale is not None:
        return float(scale)
    finite = [abs(value) for value in values if math.isfinite(value)]
    return max(finite, default=0.0)


def render_terminal(
    tokens: Sequence[str],
    relevance: RelevanceLike,
    color: bool | None = None,
    scale: float | None = None,
    stream: IO | None = None,
    digits: int = 3,
) -> str:
    """Render tokens with their relevance as text for a terminal.

    In colour mode every token gets a 24-bit ANSI background colour from :py:func:`relevance_to_rgb` and
    black or white text (:py:func:`text_color`); a token that contains a line break is followed by a real line
    break, so multi-line inputs keep their shape. Without colour the output is the concatenation of
    ``token[relevance]`` pairs, e.g. ``The[-1.51] E[+0.329]iffel[+3.67]``. Tokens are shown with
    :py:func:`display_token` in both modes (leading spaces kept, ``'\\n'`` as ``'⏎'``).

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
    values = _values(tokens, relevance)
    if not use_color(color, stream):
        return ''.join(f'{display_token(token)}[{format_relevance(value, digits)}]' for token, value in zip(tokens, values))
    row_scale = _scale(values, scale)
    parts = []
    for token, value in zip(tokens, values):
        background = relevance_to_rgb(value, row_scale)
        foreground = text_color(background)
        parts.append(
            '\x1b[48;2;{};{};{}m\x1b[38;2;{};{};{}m'.format(*background, *foreground)
            + display_token(token) + '\x1b[0m'
        )
        if '\n' in token:
            parts.append('\n')
    return ''.join(parts)


def _css_rgb(rgb: RGB) -> str:
    return 'rgb({}, {}, {})'.format(*rgb)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 60em;
       padding: 0 1em; color: #111; background: #fff; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; }
.subtitle { color: #444; margin-top: 0; }
.target { font-size: 1.05em; }
code, .tokens { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.tokens { font-size: 1.15em; line-height: 2.1; white-space: pre-wrap; word-break: break-word;
          border: 1px solid #ddd; padding: 0.8em; border-radius: 4px; }
.tok { padding: 0.15em 0; border-radius: 2px; -webkit-print-color-adjust: exact; print-color-adjust: exact; }
.legend { display: flex; align-items: center; gap: 0.6em; margin: 1.2em 0; font-size: 0.9em; }
.bar { width: 18em; height: 1em; border: 1px solid #999; -webkit-print-color-adjust: exact;
       print-color-adjust: exact; }
.note { color: #555; font-size: 0.85em; }
"""


def render_html(
    tokens: Sequence[str],
    relevance: RelevanceLike,
    title: str = 'Token relevance',
    subtitle: str | None = None,
    target: str | None = None,
    logit: float | None = None,
    scale: float | None = None,
) -> str:
    """Render tokens with their relevance as a standalone HTML page (inline CSS, no scripts, no external files).

    Each token is a ``<span>`` whose background comes from :py:func:`relevance_to_rgb` (text black or white
    for contrast) and whose ``title`` tooltip gives its position and relevance. The page has a header (title,
    subtitle, the explained target token and its logit) and a colour legend from ``-scale`` to ``+scale``.
    All text is HTML-escaped.

    Parameters
    ----------
    tokens: sequence of str
        Decoded tokens, one per position.
    relevance: torch.Tensor or sequence of float
        One relevance per token (``[seq]``).
    title: str
        Page title and main heading.
    subtitle: str, optional
        A line under the heading (e.g. the model and composite).
    target: str, optional
        The explained output token, shown in the header with ``logit``.
    logit: float, optional
        The explained logit (the initial relevance).
    scale: float, optional
        Relevance of full saturation; default the largest absolute (finite) relevance.

    Returns
    -------
    str
        The HTML document.
    """
    values = _values(tokens, relevance)
    row_scale = _scale(values, scale)
    escape = html.escape

    spans = []
    for position, (token, value) in enumerate(zip(tokens, values)):
        background = relevance_to_rgb(value, row_scale)
        tooltip = f'position {position}: relevance {format_relevance(value)}'
        spans.append(
            f'<span class="tok" style="background: {_css_rgb(background)}; color: {_css_rgb(text_color(background))}"'
            f' title="{escape(tooltip)}">{escape(display_token(token))}</span>'
        )
        if '\n' in token:
            spans.append('<br>')

    header = [f'<h1>{escape(title)}</h1>']
    if subtitle:
        header.append(f'<p class="subtitle">{escape(subtitle)}</p>')
    if target is not None or logit is not None:
        parts = []
        if target is not None:
            parts.append(f'Explained token: <code>{escape(repr(target))}</code>')
        if logit is not None:
            parts.append(f'logit <code>{float(logit):.4f}</code>')
        header.append(f'<p class="target">{", ".join(parts)}</p>')

    gradient = f'linear-gradient(to right, {_css_rgb(NEGATIVE)}, {_css_rgb(NEUTRAL)}, {_css_rgb(POSITIVE)})'
    legend = (
        '<div class="legend">'
        f'<span>{escape(format_relevance(-row_scale))}</span>'
        f'<span class="bar" style="background: {gradient}"></span>'
        f'<span>{escape(format_relevance(row_scale))}</span>'
        '<span class="note">blue: against, white: 0, red: for the explained token'
        ' (hover a token for its relevance)</span>'
        '</div>'
    )
    total = sum(value for value in values if math.isfinite(value))
    footer = f'<p class="note">{len(values)} tokens, relevance sum {escape(format_relevance(total))}</p>'

    return '\n'.join([
        '<!DOCTYPE html>',
        '<html lang="en">',
        '<head>',
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<title>{escape(title)}</title>',
        f'<style>{_CSS}</style>',
        '</head>',
        '<body>',
        *header,
        legend,
        f'<div class="tokens">{"".join(spans)}</div>',
        footer,
        '</body>',
        '</html>',
        '',
    ])


def write_html(
    path: str | os.PathLike,
    tokens: Sequence[str],
    relevance: RelevanceLike,
    title: str = 'Token relevance',
    subtitle: str | None = None,
    target: str | None = None,
    logit: float | None = None,
    scale: float | None = None,
) -> Path:
    """Write :py:func:`render_html` to ``path`` (UTF-8) and return the path.

    Parameters
    ----------
    path: str or os.PathLike
        The output file; its folder must exist.
    tokens, relevance, title, subtitle, target, logit, scale
        As for :py:func:`render_html`.

    Returns
    -------
    pathlib.Path
    """
    path = Path(path)
    path.write_text(render_html(tokens, relevance, title, subtitle, target, logit, scale), encoding='utf-8')
    return path


def from_explanation(explanation, tokenizer, row: int = 0) -> tuple[list[str], torch.Tensor]:
    """Tokens and relevance of one row of an :py:class:`~zennit_attn.Explanation`, padding removed.

    Parameters
    ----------
    explanation: zennit_attn.Explanation
        What :py:func:`~zennit_attn.explain` returned.
    tokenizer
        The model's tokenizer (its ``decode`` is used per token).
    row: int
        The batch row.

    Returns
    -------
    tuple
        ``(tokens, relevance)``: a list of decoded tokens and the ``[seq]`` relevance of the non-padding positions.
    """
    ids = explanation.input_ids[row]
    relevance = explanation.relevance[row]
    if explanation.attention_mask is not None:
        keep = explanation.attention_mask[row] != 0
        ids, relevance = ids[keep], relevance[keep]
    return [tokenizer.decode([int(token)]) for token in ids], relevance.detach().cpu()
