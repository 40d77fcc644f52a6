"""Views of a token-pair relevance matrix (:py:class:`~zennit_attn.results.similarity.SimilarityExplanation`): a
matrix figure (matplotlib) and an HTML page that links the tokens of both inputs (pointing at a token of one input
colours the tokens of the other by their pair relevance with it)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from .colors import css_rgb, relevance_to_rgb, symmetric_scale, text_color
from .html import fragment, legend

try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure
except ImportError:  # pragma: no cover - exercised where matplotlib is missing
    Figure = None

__all__ = ['pair_figure', 'pair_html', 'page_of']

#: The script of the linked view: pointing at a token shows its pair relevance on the other input's tokens.
_SCRIPT = """
<script>
(function () {
  const root = document.currentScript.parentElement;
  const data = JSON.parse(root.querySelector('script[type="application/json"]').textContent);
  const spans = {a: root.querySelectorAll('[data-side="a"]'), b: root.querySelectorAll('[data-side="b"]')};
  function paint(side, colors) {
    spans[side].forEach((span, index) => {
      span.style.background = colors[index][0];
      span.style.color = colors[index][1];
    });
  }
  function reset() { paint('a', data.a); paint('b', data.b); }
  ['a', 'b'].forEach((side) => spans[side].forEach((span, index) => {
    span.addEventListener('mouseenter', () => {
      const other = side === 'a' ? 'b' : 'a';
      paint(other, side === 'a' ? data.rows[index] : data.columns[index]);
    });
    span.addEventListener('mouseleave', reset);
  }));
})();
</script>
"""


def _colors(values: Sequence[float], scale: float) -> list[tuple[str, str]]:
    """``(background, text colour)`` in CSS of each value on the diverging map."""
    colors = []
    for value in values:
        background = relevance_to_rgb(float(value), scale)
        colors.append((css_rgb(background), css_rgb(text_color(background))))
    return colors


def pair_html(relevance: torch.Tensor, labels_a: Sequence[str], labels_b: Sequence[str], title: str) -> str:
    """An HTML fragment: both inputs' tokens coloured by their first-order relevance (the rows' and columns' sums of
    ``relevance``); pointing at a token colours the other input's tokens by their pair relevance with it (one scale,
    the largest absolute pair relevance)."""
    matrix = relevance.double()
    pair_scale = symmetric_scale(matrix.flatten().tolist())
    rows, columns = matrix.sum(1), matrix.sum(0)
    first_scale = symmetric_scale([*rows.tolist(), *columns.tolist()])
    data = {
        'a': _colors(rows.tolist(), first_scale),
        'b': _colors(columns.tolist(), first_scale),
        'rows': [_colors(row.tolist(), pair_scale) for row in matrix],
        'columns': [_colors(column.tolist(), pair_scale) for column in matrix.T],
    }

    def line(side: str, labels: Sequence[str], values: torch.Tensor, colors) -> str:
        spans = ''.join(
            f'<span class="za-t" data-side="{side}" title="{float(value):.4g}" '
            f'style="background:{background};color:{color}">{html.escape(label)}</span> '
            for label, value, (background, color) in zip(labels, values.tolist(), colors)
        )
        return f'<p>{spans}</p>'

    body = (
        line('a', labels_a, rows, data['a'])
        + line('b', labels_b, columns, data['b'])
        + legend(first_scale, 'first-order relevance; point at a token to see its pair relevance')
        + f'<script type="application/json">{json.dumps(data)}</script>'
        + _SCRIPT
    )
    return fragment(f'<div class="za-pairs">{body}</div>', title=title)


def page_of(fragment_html: str) -> str:
    """A standalone HTML document around a fragment of :py:func:`pair_html`."""
    return f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{fragment_html}</body></html>'


def pair_figure(
    relevance: torch.Tensor,
    labels_a: Sequence[str],
    labels_b: Sequence[str],
    title: str,
    path: str | Path | None = None,
):
    """A matplotlib figure of the matrix (rows: ``labels_a``, columns: ``labels_b``, the diverging map symmetric about
    0), saved to ``path`` if given (PNG, SVG, PDF)."""
    if Figure is None:
        raise ImportError('the pair-relevance figure is drawn with matplotlib: pip install matplotlib')
    matrix = relevance.double().numpy()
    scale = symmetric_scale(matrix.flatten().tolist()) or 1.0
    rows, columns = matrix.shape
    figure = Figure(figsize=(max(4.0, 0.32 * columns + 2.5), max(3.0, 0.3 * rows + 1.5)))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    colors = [css_to_unit(relevance_to_rgb(value, 1.0)) for value in (-1.0, 0.0, 1.0)]
    image = axes.imshow(
        matrix, cmap=LinearSegmentedColormap.from_list('relevance', colors), vmin=-scale, vmax=scale, aspect='auto'
    )
    axes.set_xticks(range(columns), list(labels_b), rotation=90, fontsize=8)
    axes.set_yticks(range(rows), list(labels_a), fontsize=8)
    axes.set_title(title, fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.04)
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=150)
    return figure


def css_to_unit(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    """An 8-bit RGB colour as matplotlib's 0..1 floats."""
    return tuple(channel / 255 for channel in rgb)
