"""Token heatmaps as figures for papers: PNG, SVG and PDF drawn with matplotlib (an optional dependency:
``pip install matplotlib``).

The tokens flow like text in lines of a fixed width, each on a box of its colour from
:py:func:`~zennit_attn.results.render.colors.relevance_to_rgb` with black or white text; spaces are gaps between the
boxes, line-break tokens end their line. A colour bar from ``-scale`` to ``+scale`` closes the figure. Only matplotlib's
object interface is used (no ``pyplot``), so nothing global changes and no display is needed.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .colors import color_table, hex_rgb, relevance_to_rgb, text_color
from .layout import Heatmap, split_space

try:  # optional dependency
    from matplotlib import font_manager
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties
    from matplotlib.patches import FancyBboxPatch, Rectangle
except ImportError:  # pragma: no cover - exercised where matplotlib is missing
    Figure = None

__all__ = ['FORMATS', 'IMAGE_HEIGHT', 'Box', 'render_figure', 'save_figure']

#: file formats written through matplotlib
FORMATS = ('png', 'svg', 'pdf')

_MARGIN = 10.0
_PAD_X = 1.8
_PAD_Y = 2.6
_GAP = 1.4
_FAMILY = 'DejaVu Sans'
#: Height in points of the pictures :py:func:`render_figure` draws above the heatmaps.
IMAGE_HEIGHT = 110.0


@dataclass
class Box:
    """Where a token was drawn, in points from the figure's top-left corner.

    Attributes
    ----------
    heatmap, segment, token: int
        Indices of the heatmap, its segment and the token in it.
    x0, y0, x1, y1: float
        The coloured box.
    color: str
        Its colour, ``'#rrggbb'``.
    """

    heatmap: int
    segment: int
    token: int
    x0: float
    y0: float
    x1: float
    y1: float
    color: str


def _need_matplotlib() -> None:
    if Figure is None:
        raise ImportError(
            'PNG, SVG and PDF heatmaps are drawn with matplotlib: pip install matplotlib '
            '(or save as .html or .tex, which need nothing)'
        )


class _Measure:
    """Sizes in points of texts in the figure's fonts (token, bold title, small label), measured by matplotlib's Agg
    renderer, and the glyphs the token font has."""

    def __init__(self, font_size: float):
        self.font_size = font_size
        self.figure = Figure(figsize=(1, 1), dpi=72)
        self.renderer = FigureCanvasAgg(self.figure).get_renderer()
        self.prop = FontProperties(family=_FAMILY, size=font_size)
        self.bold = FontProperties(family=_FAMILY, size=font_size * 0.9, weight='bold')
        self.small = FontProperties(family=_FAMILY, size=font_size * 0.72)
        charmap = font_manager.get_font(font_manager.findfont(self.prop)).get_charmap()
        self.glyphs = set(charmap)
        self.space = self.width('a a') - self.width('aa')
        _, height, descent = self.renderer.get_text_width_height_descent('Hg', self.prop, ismath=False)
        self.ascent, self.descent = height - descent, descent

    def width(self, text: str, prop=None) -> float:
        if not text:
            return 0.0
        width, _, _ = self.renderer.get_text_width_height_descent(text, prop or self.prop, ismath=False)
        return width

    def printable(self, text: str) -> str:
        """``text`` with characters the font lacks replaced by U+FFFD (shown as a replacement mark)."""
        return ''.join(char if ord(char) in self.glyphs or char == ' ' else '\ufffd' for char in text)


def render_figure(
    heatmaps: Sequence[Heatmap],
    width: float = 7.5,
    font_size: float = 11.0,
    colorbar: bool = True,
    images: Sequence[tuple[str, np.ndarray]] = (),
):
    """Draw heatmaps one below the other as a matplotlib figure (with ``images`` in rows above them).

    Parameters
    ----------
    heatmaps: sequence of Heatmap
        With their scales resolved (:py:func:`~zennit_attn.results.render.layout.resolve_scales`).
    width: float
        Figure width in inches; the height follows from the number of lines.
    font_size: float
        Token font size in points.
    colorbar: bool
        Whether to draw the colour bar (labelled with the scale if all heatmaps share one, else ``-max |R|`` to
        ``+max |R|``).
    images: sequence of (str, array)
        ``(caption, [height, width, 3] uint8 RGB)`` pictures (the overlays of a multimodal explanation), drawn
        :py:data:`IMAGE_HEIGHT` points high in rows above the heatmaps, each with its caption below.

    Returns
    -------
    tuple
        ``(figure, boxes)``: the :py:class:`matplotlib.figure.Figure` and a :py:class:`Box` per token.
    """
    _need_matplotlib()
    measure = _Measure(font_size)
    layout = _Layout(measure, width)
    layout.add_images(images)
    for number, heatmap in enumerate(heatmaps):
        layout.add_heatmap(number, heatmap)
    if colorbar:
        layout.add_colorbar(heatmaps)
    height = layout.y + _MARGIN

    figure = Figure(figsize=(width, height / 72), dpi=72)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_xlim(0, width * 72)
    axes.set_ylim(height, 0)
    axes.axis('off')
    for kind, x, y, payload in layout.commands:
        _DRAW[kind](axes, measure, x, y, payload)
    axes.set_xlim(0, width * 72)
    axes.set_ylim(height, 0)
    return figure, layout.boxes


class _Layout:
    """The first pass of :py:func:`render_figure`: where everything goes (in points from the figure's top-left
    corner, ``x`` and ``y`` the cursor), as drawing commands ``(kind, x, y, payload)`` in order, and the
    :py:class:`Box` of every token. Tokens flow like text in lines up to ``width`` inches."""

    def __init__(self, measure: _Measure, width: float):
        self.measure = measure
        self.line = measure.ascent + measure.descent + 2 * _PAD_Y + 3.0
        self.right = width * 72 - _MARGIN
        self.commands: list[tuple] = []
        self.boxes: list[Box] = []
        self.x = _MARGIN
        self.y = _MARGIN

    def add_images(self, images: Sequence[tuple[str, np.ndarray]]) -> None:
        """The pictures in rows of :py:data:`IMAGE_HEIGHT` points, each with its caption below."""
        font_size = self.measure.font_size
        for caption, picture in images:
            box = IMAGE_HEIGHT * picture.shape[1] / picture.shape[0]
            if self.x + box > self.right and self.x > _MARGIN + 1e-6:
                self.x = _MARGIN
                self.y += IMAGE_HEIGHT + font_size * 1.6
            self.commands.append(('image', self.x, self.y, (picture, box, self.measure.printable(caption))))
            self.x += box + 2 * _GAP + font_size
        if images:
            self.y += IMAGE_HEIGHT + font_size * 2.0

    def add_heatmap(self, number: int, heatmap: Heatmap) -> None:
        """Heatmap ``number``: its title (wrapped) and its segments, each under its label."""
        if number:
            self.y += self.line * 0.5
        if heatmap.title:
            self._title(heatmap.title)
        for part, segment in enumerate(heatmap.segments):
            if segment.label:
                self.y += self.measure.font_size * 1.1
                self.commands.append(('label', _MARGIN, self.y, segment.label.upper()))
            self.x = _MARGIN
            self.y += self.line - _PAD_Y - self.measure.descent - 1.5  # baseline of the first line
            for index, (token, value) in enumerate(zip(segment.tokens, segment.values)):
                self._token((number, part, index), token, value, heatmap.scale)
            self.y += self.measure.descent + _PAD_Y + 4

    def _title(self, title: str) -> None:
        """A heatmap's title in bold, wrapped to the figure's width."""
        characters = max(20, int((self.right - _MARGIN) / (self.measure.width('n', self.measure.bold) or 6)))
        for text in textwrap.wrap(title, characters) or ['']:
            self.y += self.measure.font_size * 1.25
            self.commands.append(('title', _MARGIN, self.y, self.measure.printable(text)))
        self.y += 4

    def _token(self, where: tuple[int, int, int], token: str, value: float, scale: float) -> None:
        """One token on its box (``where``: the indices of its heatmap, segment and itself), after the space it
        leads with; a box that does not fit the line starts the next one, and a line break ends it."""
        measure = self.measure
        lead, shown, trail = split_space(token)
        shown = measure.printable(shown)
        box = measure.width(shown) + 2 * _PAD_X
        self.x += len(lead) * measure.space
        if self.x + box > self.right and self.x > _MARGIN + 1e-6:
            self.x = _MARGIN
            self.y += self.line
        color = relevance_to_rgb(value, scale)
        top = self.y - measure.ascent - _PAD_Y
        bottom = self.y + measure.descent + _PAD_Y
        self.commands.append(('token', self.x, self.y, (shown, color, top, bottom, box)))
        self.boxes.append(Box(*where, self.x, top, self.x + box, bottom, hex_rgb(color)))
        self.x += box + _GAP + len(trail) * measure.space
        if '\n' in token:
            self.x = _MARGIN
            self.y += self.line

    def add_colorbar(self, heatmaps: Sequence[Heatmap]) -> None:
        """The colour bar below everything (:py:func:`_colorbar`)."""
        self.y += 10
        self.commands.append(('colorbar', _MARGIN, self.y, heatmaps))
        self.y += 22


def _draw_title(axes, measure: _Measure, x: float, y: float, text: str) -> None:
    """A line of a heatmap's title, bold, on the baseline ``y``."""
    axes.text(x, y, text, fontproperties=measure.bold, va='baseline', ha='left', parse_math=False, color='#222222')


def _draw_label(axes, measure: _Measure, x: float, y: float, text: str) -> None:
    """A segment's label, small and grey, on the baseline ``y``."""
    axes.text(x, y, text, fontproperties=measure.small, va='baseline', ha='left', parse_math=False, color='#555555')


def _draw_token(axes, measure: _Measure, x: float, y: float, payload: tuple) -> None:
    """A token's rounded box in its colour, and its text in black or white on it."""
    shown, color, top, bottom, box = payload
    axes.add_patch(
        FancyBboxPatch(
            (x, top),
            box,
            bottom - top,
            boxstyle='round,pad=0,rounding_size=1.6',
            facecolor=hex_rgb(color),
            edgecolor='none',
            linewidth=0,
        )
    )
    axes.text(
        x + _PAD_X,
        y,
        shown,
        fontproperties=measure.prop,
        va='baseline',
        ha='left',
        parse_math=False,
        color=hex_rgb(text_color(color)),
    )


def _draw_image(axes, measure: _Measure, x: float, y: float, payload: tuple) -> None:
    """A picture :py:data:`IMAGE_HEIGHT` points high, its caption below it."""
    picture, box, caption = payload
    axes.imshow(picture, extent=(x, x + box, y + IMAGE_HEIGHT, y), interpolation='nearest', aspect='auto')
    axes.text(
        x,
        y + IMAGE_HEIGHT + measure.font_size * 1.1,
        caption,
        fontproperties=measure.small,
        va='baseline',
        ha='left',
        parse_math=False,
        color='#555555',
    )


def _colorbar(axes, measure: _Measure, x: float, y: float, heatmaps: Sequence[Heatmap]) -> None:
    table = color_table()
    length, thickness = 150.0, 8.0
    step = length / len(table)
    for index, color in enumerate(table):
        axes.add_patch(
            Rectangle(
                (x + 60 + index * step, y - thickness),
                step * 1.05,
                thickness,
                facecolor=hex_rgb(color),
                edgecolor='none',
                linewidth=0,
            )
        )
    axes.add_patch(
        Rectangle((x + 60, y - thickness), length, thickness, facecolor='none', edgecolor='#888888', linewidth=0.5)
    )
    scales = {round(heatmap.scale, 12) for heatmap in heatmaps}
    if len(scales) == 1:
        scale = heatmaps[0].scale
        low, high = f'{-scale:+.3g}', f'{scale:+.3g}'
    else:
        low, high = '-max |R|', '+max |R|'
    axes.text(
        x + 56, y - 1, low, fontproperties=measure.small, va='baseline', ha='right', color='#333333', parse_math=False
    )
    axes.text(
        x + 64 + length,
        y - 1,
        high,
        fontproperties=measure.small,
        va='baseline',
        ha='left',
        color='#333333',
        parse_math=False,
    )
    axes.text(
        x + 60 + length / 2,
        y + 10,
        'relevance: blue against, grey 0, red for',
        fontproperties=measure.small,
        va='baseline',
        ha='center',
        color='#555555',
        parse_math=False,
    )


#: How :py:func:`render_figure` draws each kind of command of :py:class:`_Layout`.
_DRAW = {
    'title': _draw_title,
    'label': _draw_label,
    'token': _draw_token,
    'image': _draw_image,
    'colorbar': _colorbar,
}


def save_figure(
    heatmaps: Sequence[Heatmap], path: str | os.PathLike, format: str | None = None, dpi: float = 200, **options
) -> Path:
    """Write :py:func:`render_figure` as PNG, SVG or PDF.

    Parameters
    ----------
    heatmaps: sequence of Heatmap
    path: str or os.PathLike
        The file; its folder must exist.
    format: str, optional
        ``'png'``, ``'svg'`` or ``'pdf'``; default from the suffix of ``path``.
    dpi: float
        Resolution of PNG files (vector formats ignore it).
    **options
        ``width``, ``font_size``, ``colorbar`` of :py:func:`render_figure`.

    Returns
    -------
    pathlib.Path
    """
    path = Path(path)
    format = (format or path.suffix.lstrip('.')).lower()
    if format not in FORMATS:
        raise ValueError(f'save_figure writes {", ".join(FORMATS)}, not {format!r}')
    figure, _ = render_figure(heatmaps, **options)
    metadata = {'Software': 'zennit-attn'} if format == 'png' else {'Creator': 'zennit-attn'}
    if format == 'svg':
        metadata = {'Creator': 'zennit-attn'}
    figure.savefig(path, format=format, dpi=dpi, facecolor='white', metadata=metadata)
    return path
