"""The one diverging colour map of every heatmap (terminal, HTML, PNG/SVG/PDF, LaTeX and image heatmaps).

Relevance 0 is a light neutral grey, positive relevance (evidence *for* the explained output) runs to a saturated
red and negative relevance (evidence *against* it) to a saturated blue. The map is a straight line in the OKLab
colour space (Ottosson 2020) on each side, so lightness and chroma change evenly with ``|relevance|``, and the two
sides are mirror images: a value and its negative have the same lightness and chroma, only the hue differs (red
29 degrees, blue 264 degrees, both ends at OKLab lightness 0.52, chroma 0.19). Why not white/red/blue: white for 0
turns a page of irrelevant tokens into a wall of white boxes on a dark background (Jupyter's dark theme, a dark
terminal), and the pure-red and pure-blue ends are not equally dark. Here the neutral grey reads on white and on
black pages alike, both ends take white text with a contrast ratio above 5, and the lightness step from 0 to full
saturation is the same for both signs.

The map is a table of :py:data:`LEVELS` colours per side: ``value / scale`` is rounded to the nearest of ``2 *
LEVELS + 1`` levels (half away from zero), so that the interactive HTML, whose script looks the same table up,
shows exactly the colours that the Python renderers write.
"""

from __future__ import annotations

import math
import numbers
from functools import cache

__all__ = [
    'RGB',
    'LEVELS',
    'POSITIVE',
    'NEGATIVE',
    'NEUTRAL',
    'relevance_to_rgb',
    'relevance_level',
    'color_table',
    'text_color',
    'luminance',
    'oklab',
    'css_rgb',
    'hex_rgb',
    'symmetric_scale',
]

RGB = tuple[int, int, int]

#: number of colour steps on each side of 0
LEVELS = 255

#: OKLab ``(lightness, chroma, hue in degrees)`` of 0 and of the two ends
_NEUTRAL_LCH = (0.95, 0.0, 0.0)
_POSITIVE_LCH = (0.52, 0.19, 29.0)
_NEGATIVE_LCH = (0.52, 0.19, 264.0)


def _linear_to_srgb(channel: float) -> float:
    return 12.92 * channel if channel <= 0.0031308 else 1.055 * channel ** (1 / 2.4) - 0.055


def _srgb_to_linear(channel: float) -> float:
    return channel / 12.92 if channel <= 0.04045 else ((channel + 0.055) / 1.055) ** 2.4


def _oklab_to_rgb(lightness: float, a: float, b: float) -> RGB:
    # the long, medium and short cone responses (OKLab's LMS space), cube roots first
    long_root = lightness + 0.3963377774 * a + 0.2158037573 * b
    medium_root = lightness - 0.1055613458 * a - 0.0638541728 * b
    short_root = lightness - 0.0894841775 * a - 1.2914855480 * b
    long, medium, short = long_root**3, medium_root**3, short_root**3
    linear = (
        4.0767416621 * long - 3.3077115913 * medium + 0.2309699292 * short,
        -1.2684380046 * long + 2.6097574011 * medium - 0.3413193965 * short,
        -0.0041960863 * long - 0.7034186147 * medium + 1.7076147010 * short,
    )
    return tuple(int(round(255 * min(1.0, max(0.0, _linear_to_srgb(c))))) for c in linear)  # type: ignore[return-value]


def oklab(rgb: RGB) -> tuple[float, float, float]:
    """OKLab ``(lightness, a, b)`` of an sRGB colour ``(r, g, b)`` in 0..255 (used to check the map's evenness).

    Parameters
    ----------
    rgb: tuple of int

    Returns
    -------
    tuple of float
    """
    r, g, b = (_srgb_to_linear(channel / 255) for channel in rgb)
    # cube roots of the long, medium and short cone responses (OKLab's LMS space)
    long = (0.4122214708 * r + 0.5363137098 * g + 0.0514459929 * b) ** (1 / 3)
    medium = (0.2119034982 * r + 0.6806995451 * g + 0.1073969566 * b) ** (1 / 3)
    short = (0.0883024619 * r + 0.2817188376 * g + 0.6299787005 * b) ** (1 / 3)
    return (
        0.2104542553 * long + 0.7936177850 * medium - 0.0040720468 * short,
        1.9779984951 * long - 2.4285922050 * medium + 0.4505937099 * short,
        0.0259040371 * long + 0.7827717662 * medium - 0.8086757660 * short,
    )


def _lab(lch: tuple[float, float, float]) -> tuple[float, float, float]:
    lightness, chroma, hue = lch
    return lightness, chroma * math.cos(math.radians(hue)), chroma * math.sin(math.radians(hue))


@cache
def color_table() -> tuple[RGB, ...]:
    """The ``2 * LEVELS + 1`` colours of the map, from ``-scale`` (index 0) through 0 (index ``LEVELS``) to
    ``+scale`` (index ``2 * LEVELS``).

    Returns
    -------
    tuple of tuple of int
    """
    neutral = _lab(_NEUTRAL_LCH)
    table = []
    for level in range(-LEVELS, LEVELS + 1):
        end = _lab(_POSITIVE_LCH if level > 0 else _NEGATIVE_LCH)
        weight = abs(level) / LEVELS
        table.append(_oklab_to_rgb(*(n + (e - n) * weight for n, e in zip(neutral, end))))
    return tuple(table)


#: colour of ``+scale``: saturated red
POSITIVE: RGB = color_table()[-1]
#: colour of ``-scale``: saturated blue
NEGATIVE: RGB = color_table()[0]
#: colour of 0: light neutral grey
NEUTRAL: RGB = color_table()[LEVELS]


def relevance_level(value: float, scale: float) -> int:
    """The signed colour level of ``value``: ``round(LEVELS * value / scale)`` (half away from zero), clipped to
    ``[-LEVELS, LEVELS]``; 0 where ``value`` is NaN or ``scale`` is not a positive finite number.

    Parameters
    ----------
    value: float
    scale: float

    Returns
    -------
    int
    """
    value, scale = float(value), float(scale)
    if math.isnan(value) or not (math.isfinite(scale) and scale > 0):
        return 0
    fraction = max(-1.0, min(1.0, value / scale))
    return int(math.copysign(math.floor(abs(fraction) * LEVELS + 0.5), fraction))


def relevance_to_rgb(value: float, scale: float) -> RGB:
    """Map a relevance value to its colour on the diverging map.

    Parameters
    ----------
    value: float
        The relevance.
    scale: float
        The relevance that gets the fully saturated colour (usually the largest absolute relevance shown). Values
        beyond ``[-scale, scale]`` are clipped.

    Returns
    -------
    tuple of int
        ``(r, g, b)`` in 0..255: ``0 -> NEUTRAL`` (light grey), ``+scale -> POSITIVE`` (saturated red), ``-scale
        -> NEGATIVE`` (saturated blue), ``v`` and ``-v`` with equal lightness. :py:data:`NEUTRAL` where ``value`` is
        NaN or ``scale`` is not a positive finite number (e.g. a row of zeros).
    """
    return color_table()[relevance_level(value, scale) + LEVELS]


def luminance(rgb: RGB) -> float:
    """Relative luminance of an sRGB colour (WCAG 2).

    Parameters
    ----------
    rgb: tuple of int
        ``(r, g, b)`` in 0..255.

    Returns
    -------
    float
        0 (black) to 1 (white).
    """
    r, g, b = (_srgb_to_linear(channel / 255) for channel in rgb)
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
    value = luminance(background)
    return (0, 0, 0) if (value + 0.05) / 0.05 >= 1.05 / (value + 0.05) else (255, 255, 255)


def css_rgb(rgb: RGB) -> str:
    """``'rgb(r, g, b)'`` for CSS (the form browsers report as the computed style)."""
    return 'rgb({}, {}, {})'.format(*rgb)


def hex_rgb(rgb: RGB) -> str:
    """``'#rrggbb'``."""
    return '#{:02x}{:02x}{:02x}'.format(*rgb)


def symmetric_scale(values, scale: float | None = None) -> float:
    """The colour scale of ``values``: ``scale`` if given (a positive finite number), else the largest absolute
    finite value (0 for none, which shows everything neutral).

    Parameters
    ----------
    values: iterable of float
    scale: float, optional

    Returns
    -------
    float
    """
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(
                f'scale must be a positive finite number (the relevance of full colour) or None, got {scale!r}'
            )
        return float(scale)
    return max((abs(float(value)) for value in values if math.isfinite(float(value))), default=0.0)
