"""The circuit view: the mean patching score of every component as a heatmap of layers x components (the residual
stream, the attention output, the MLP output and each head), with the top components listed, as a PNG (drawn with
Pillow, which zennit requires) and as an HTML page (:py:func:`~zennit_attn.results.render.html.page`); and the graph
of the top edges of :py:func:`~.edges.edge_patching` (senders above receivers by layer, a line per edge as wide as
its score), as a PNG and as an HTML page with the graph in SVG.

The colours are the library's diverging map (:py:func:`~zennit_attn.results.render.colors.relevance_to_rgb`): red
where patching the component raises the metric, blue where it lowers it, scaled to the largest absolute score.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image, ImageDraw

from ...results.render.colors import css_rgb, relevance_to_rgb, symmetric_scale
from ...results.render.html import page
from ...results.render.views import check_output
from .edges import EdgeScores, Node, RankedEdge
from .scores import PatchingScores

__all__ = [
    'circuit_grid',
    'circuit_html',
    'circuit_png',
    'save_circuit',
    'edge_graph',
    'edges_png',
    'edges_html',
    'save_edges',
]

#: the whole outputs shown as one column each, in this order
COLUMNS = ('residual', 'attention', 'mlp')
#: pixels of one cell of the PNG
CELL = 18
#: pixels between the rows (layers) and the columns (nodes of a layer) of the edge graph
ROW, COLUMN = 40, 70


def circuit_grid(scores: PatchingScores) -> tuple[list[str], torch.Tensor]:
    """``(column labels, [rows, columns] values)``: the mean score over pairs (summed over positions) of the
    residual stream (row ``r``: layer ``r``, the input of the first block; the output of the last block is the last
    row), the attention and MLP outputs of block ``r`` and its heads, of the components in ``scores``; NaN where a
    component has no layer ``r``.

    Raises
    ------
    ValueError
        Where ``scores`` holds none of the components the view shows.
    """
    columns, values = [], []
    for name in COLUMNS:
        if name in scores.scores:
            columns.append(name)
            values.append(scores.mean(name)[:, 0])
    if 'heads' in scores.scores:
        heads = scores.mean('heads')
        columns += [f'head {index}' for index in range(heads.shape[1])]
        values += list(heads.T)
    if not values:
        raise ValueError(
            f'the circuit view shows {", ".join(COLUMNS)} and heads; the scores hold {list(scores.scores)}'
        )
    rows = max(len(column) for column in values)
    grid = torch.full((rows, len(values)), float('nan'), dtype=torch.float64)
    for index, column in enumerate(values):
        grid[: len(column), index] = column.double().cpu()
    return columns, grid


def circuit_png(scores: PatchingScores) -> Image.Image:
    """The heatmap of :py:func:`circuit_grid` as an image: one row per layer (layer 0 at the top), one column per
    component, a label row and column."""
    columns, grid = circuit_grid(scores)
    scale = symmetric_scale(grid[~grid.isnan()].tolist() or [0.0])
    left, top = 4 * CELL, 2 * CELL
    image = Image.new('RGB', (left + CELL * len(columns) + CELL, top + CELL * grid.shape[0] + CELL), 'white')
    draw = ImageDraw.Draw(image)
    draw.text((4, 4), f'{scores.method}: mean score, {grid.shape[0]} layers, scale {scale:.3g}', fill='black')
    for index, name in enumerate(columns):
        label = name[0] if not name.startswith('head') else name.split()[1]
        draw.text((left + index * CELL + 4, top - CELL + 4), label, fill='black')
    for row in range(grid.shape[0]):
        draw.text((4, top + row * CELL + 4), str(row), fill='black')
        for index in range(len(columns)):
            value = float(grid[row, index])
            if value != value:  # NaN: no such layer
                continue
            box = (left + index * CELL, top + row * CELL, left + (index + 1) * CELL - 1, top + (row + 1) * CELL - 1)
            draw.rectangle(box, fill=relevance_to_rgb(value, scale))
    return image


def circuit_html(scores: PatchingScores, k: int = 20, title: str = 'Circuit') -> str:
    """A standalone page: the heatmap of :py:func:`circuit_grid` as a table (the value in each cell's tooltip) and
    the ``k`` top components (:py:meth:`~.scores.PatchingScores.top`)."""
    columns, grid = circuit_grid(scores)
    scale = symmetric_scale(grid[~grid.isnan()].tolist() or [0.0])
    head = ''.join(f'<th>{html.escape(name)}</th>' for name in columns)
    rows = []
    for row in range(grid.shape[0]):
        cells = []
        for index in range(len(columns)):
            value = float(grid[row, index])
            if value != value:
                cells.append('<td></td>')
                continue
            color = css_rgb(relevance_to_rgb(value, scale))
            cells.append(
                f'<td style="background:{color};width:1.2em" title="{html.escape(columns[index])} layer {row}: '
                f'{value:+.4f}"></td>'
            )
        rows.append(f'<tr><th>{row}</th>{"".join(cells)}</tr>')
    top = ''.join(f'<li>{html.escape(str(entry))}</li>' for entry in scores.top(k))
    clean = f'{float(scores.clean.mean()):.3f}'
    corrupted = f'{float(scores.corrupted.mean()):.3f}'
    body = (
        f'<p>{html.escape(scores.method)}; {scores.clean.numel()} prompt pairs; metric clean {clean}, corrupted '
        f'{corrupted}; the mean change of the metric when a component is patched (red: up, blue: down; scale '
        f'{scale:.4g}).</p>'
        f'<table style="border-collapse:collapse"><tr><th>layer</th>{head}</tr>{"".join(rows)}</table>'
        f'<h2>Top {k} components</h2><ol>{top}</ol>'
    )
    return page(body, title=title)


def _write(path, png: Callable[[], Image.Image], page_html: Callable[[], str]) -> Path:
    """Write the image of ``png()`` or the page of ``page_html()`` to ``path`` (by its suffix, ``.png`` or ``.html``).

    Raises
    ------
    ValueError
        For another suffix or a path that cannot be written.
    """
    path = check_output(path, ('.png', '.html'))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == '.png':
        png().save(path)
    else:
        path.write_text(page_html(), encoding='utf-8')
    return path


def save_circuit(scores: PatchingScores, path, k: int = 20) -> Path:
    """Write the circuit view to ``path``: ``.png`` (:py:func:`circuit_png`) or ``.html`` (:py:func:`circuit_html`).

    Raises
    ------
    ValueError
        For another suffix or a path that cannot be written.
    """
    return _write(path, lambda: circuit_png(scores), lambda: circuit_html(scores, k))


def edge_graph(edges: EdgeScores, k: int = 20) -> tuple[dict[Node, tuple[int, int]], list[RankedEdge], float]:
    """``(positions, top edges, scale)`` of the graph of the ``k`` top edges: each node of a top edge at
    ``(x, y)`` pixels, one row per layer (the embeddings above the first block, the logits below the last; a block's
    senders and receivers share its row), nodes in a row ordered by kind and head; the scale is the largest absolute
    score."""
    top = edges.top(k)
    nodes = sorted({node for entry in top for node in (entry.sender, entry.receiver)}, key=_node_order)
    rows: dict[int, list[Node]] = {}
    for node in nodes:
        rows.setdefault(_row(node), []).append(node)
    order = sorted(rows)
    positions = {
        node: (COLUMN // 2 + column * COLUMN, ROW + index * ROW)
        for index, row in enumerate(order)
        for column, node in enumerate(rows[row])
    }
    return positions, top, max((abs(entry.score) for entry in top), default=0.0)


def _row(node: Node) -> int:
    return -1 if node.kind == 'embedding' else node.layer


def _node_order(node: Node) -> tuple:
    kinds = ('embedding', 'query', 'key', 'value', 'head', 'mlp', 'logits')
    return _row(node), kinds.index(node.kind), node.unit


def _width(score: float, scale: float) -> int:
    return 1 + round(5 * abs(score) / scale) if scale > 0 else 1


def edges_png(edges: EdgeScores, k: int = 20) -> Image.Image:
    """The graph of :py:func:`edge_graph` as an image (red: the edge raises the metric, blue: lowers it)."""
    positions, top, scale = edge_graph(edges, k)
    width = max((x for x, _ in positions.values()), default=0) + COLUMN
    height = max((y for _, y in positions.values()), default=0) + ROW
    image = Image.new('RGB', (max(width, 320), height), 'white')
    draw = ImageDraw.Draw(image)
    draw.text((4, 4), f'{edges.method}, {edges.path}: top {len(top)} edges, scale {scale:.3g}', fill='black')
    for entry in top:
        color = relevance_to_rgb(entry.score, scale or 1.0)
        draw.line([positions[entry.sender], positions[entry.receiver]], fill=color, width=_width(entry.score, scale))
    for node, (x, y) in positions.items():
        draw.ellipse((x - 4, y - 4, x + 4, y + 4), fill='black')
        draw.text((x + 6, y - 12), str(node), fill='black')
    return image


def edges_html(edges: EdgeScores, k: int = 20, title: str = 'Circuit edges') -> str:
    """A standalone page: the graph of :py:func:`edge_graph` in SVG (each edge's score in its tooltip) and the list of
    the ``k`` top edges."""
    positions, top, scale = edge_graph(edges, k)
    width = max((x for x, _ in positions.values()), default=0) + COLUMN
    height = max((y for _, y in positions.values()), default=0) + ROW
    lines = []
    for entry in top:
        (x1, y1), (x2, y2) = positions[entry.sender], positions[entry.receiver]
        color = css_rgb(relevance_to_rgb(entry.score, scale or 1.0))
        lines.append(
            f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color}" '
            f'stroke-width="{_width(entry.score, scale)}"><title>{html.escape(str(entry))}</title></line>'
        )
    for node, (x, y) in positions.items():
        lines.append(f'<circle cx="{x}" cy="{y}" r="4" fill="black"/>')
        lines.append(f'<text x="{x + 6}" y="{y - 6}" font-size="11">{html.escape(str(node))}</text>')
    listed = ''.join(f'<li>{html.escape(str(entry))}</li>' for entry in top)
    body = (
        f'<p>{html.escape(edges.method)}, {edges.path}; {edges.clean.numel()} prompt pairs; the mean change of '
        f"the metric when the receiver alone reads the sender's corrupted output (red: up, blue: down; scale "
        f'{scale:.4g}).</p>'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">{"".join(lines)}</svg>'
        f'<h2>Top {len(top)} edges</h2><ol>{listed}</ol>'
    )
    return page(body, title=title)


def save_edges(edges: EdgeScores, path, k: int = 20) -> Path:
    """Write the edge graph to ``path``: ``.png`` (:py:func:`edges_png`) or ``.html`` (:py:func:`edges_html`).

    Raises
    ------
    ValueError
        For another suffix or a path that cannot be written.
    """
    return _write(path, lambda: edges_png(edges, k), lambda: edges_html(edges, k))
