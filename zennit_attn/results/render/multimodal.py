"""Text and images together: the token heatmaps of a :py:class:`~zennit_attn.MultimodalExplanation` with the overlay
of each image (:py:func:`~zennit_attn.results.render.image.overlay`), in every format of :py:data:`views.SUFFIXES` and
on the terminal.

An image is given as ``(caption, pixels, relevance, patch_relevance, mean, std)``: ``pixels`` and ``relevance``
``[channels, height, width]`` as the model took the image, ``patch_relevance`` ``[rows, columns]`` (the terminal
draws it), ``mean``/``std`` the processor's normalisation (None: min-max scaled).
"""

from __future__ import annotations

import base64
import io
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import numpy as np

from . import latex
from .colors import relevance_to_rgb, symmetric_scale
from .figure import save_figure
from .html import figures_html, fragment, heatmap_fragment, page
from .image import overlay
from .layout import Heatmap, ScaleLike, format_relevance, resolve_scales
from .terminal import use_color
from .views import check_output, write_file

__all__ = ['IMAGE_OPTIONS', 'overlays', 'overlay_figures', 'show_images', 'multimodal_html', 'save_multimodal']

#: Options of the overlays (:py:func:`~zennit_attn.results.render.image.overlay`) that the multimodal views take.
IMAGE_OPTIONS = ('alpha', 'cmap', 'level', 'vmax')
#: Images are upscaled (nearest neighbour) to at least this many pixels on their longer side.
MIN_SIDE = 192


def overlays(images: Sequence[tuple], **options) -> list[tuple[str, object]]:
    """``[(caption, PIL image)]``: each image's relevance blended over it (small images upscaled to
    :py:data:`MIN_SIDE`)."""
    unknown = sorted(set(options) - set(IMAGE_OPTIONS))
    if unknown:
        raise TypeError(f'unknown image option(s) {unknown}; the overlays take {", ".join(IMAGE_OPTIONS)}')
    shown = []
    for caption, pixels, relevance, _, mean, std in images:
        scale = max(1, math.ceil(MIN_SIDE / max(pixels.shape[-2:])))
        shown.append((caption, overlay(pixels, relevance, mean=mean, std=std, scale=scale, **options)))
    return shown


def _split(options: dict) -> tuple[dict, dict]:
    """``(image options, format options)``."""
    return (
        {key: value for key, value in options.items() if key in IMAGE_OPTIONS},
        {key: value for key, value in options.items() if key not in IMAGE_OPTIONS},
    )


def show_images(images: Sequence[tuple], color: bool | None = None, stream: IO | None = None) -> None:
    """Print each image's patch relevance as a grid: coloured cells on a terminal (one colour scale per image, as
    the token heatmaps), the values otherwise."""
    stream = sys.stdout if stream is None else stream
    colored = use_color(color, stream)
    for caption, _, _, patches, _, _ in images:
        grid = patches.detach().to('cpu').double()
        bound = symmetric_scale(grid.flatten().tolist())  # the largest absolute finite relevance, as everywhere
        lines = [f'{caption} (patch relevance, {grid.shape[0]} x {grid.shape[1]})']
        for row in grid.tolist():
            if colored:
                cells = ''.join('\x1b[48;2;{};{};{}m  '.format(*relevance_to_rgb(value, bound)) for value in row)
                lines.append(cells + '\x1b[0m')
            else:
                lines.append(' '.join(f'{format_relevance(value, 3):>9}' for value in row))
        print('\n'.join(lines), file=stream)


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format='PNG')
    return buffer.getvalue()


def _figures(shown: Sequence[tuple[str, object]]) -> list[dict]:
    return [
        {
            'src': 'data:image/png;base64,' + base64.b64encode(_png(image)).decode('ascii'),
            'caption': caption,
            'width': image.width,
            'height': image.height,
        }
        for caption, image in shown
    ]


def overlay_figures(images: Sequence[tuple], **options) -> list[dict]:
    """The :py:func:`overlays` as inline PNG images: dicts with ``src`` (a ``data:image/png;base64,...`` URL),
    ``caption``, ``width`` and ``height``, as :py:func:`~zennit_attn.results.render.html.figures_html` and the views of
    :py:func:`~zennit_attn.results.render.html.generation_fragment` take them."""
    return _figures(overlays(images, **options))


def multimodal_html(
    heatmaps: Sequence[Heatmap],
    images: Sequence[tuple],
    scale: ScaleLike = None,
    title: str | None = None,
    standalone: bool = True,
    **options,
) -> str:
    """The overlays (inline PNG images) above the token heatmaps: a standalone page, or a fragment for Jupyter
    (``standalone=False``); ``options`` are :py:data:`IMAGE_OPTIONS`."""
    resolve_scales(heatmaps, scale)
    body = figures_html(overlay_figures(images, **options)) + ''.join(heatmap_fragment(heatmap) for heatmap in heatmaps)
    if standalone:
        return page(body, title or 'Token and pixel relevance')
    return fragment(body, title)


def _latex(heatmaps, shown, path: Path, document: bool = False, captions: bool = True) -> str:
    """The LaTeX of the overlays (written as PNG files beside ``path``) and the token heatmaps."""
    lines = [r'\begingroup\setlength{\parindent}{0pt}%']
    for number, (caption, image) in enumerate(shown, 1):
        name = f'{path.stem}_image{number}.png'
        image.save(path.with_name(name), format='PNG')
        lines.append(
            r'\begin{minipage}[t]{0.3\linewidth}\centering'
            rf'\includegraphics[width=\linewidth]{{{name}}}'
            + (rf'\par{{\footnotesize {latex.latex_escape(caption)}}}' if captions else '')
            + r'\end{minipage}\hfill%'
        )
    lines.append(r'\par\medskip\endgroup')
    snippet = '\n'.join(lines) + '\n' + latex.latex_snippet(heatmaps, captions)
    return latex.latex_document(snippet, packages=('graphicx',)) if document else snippet


def save_multimodal(
    heatmaps: Sequence[Heatmap],
    images: Sequence[tuple],
    path: str | os.PathLike,
    scale: ScaleLike = None,
    title: str | None = None,
    html: str | None = None,
    **options,
) -> Path:
    """Write the token heatmaps with the overlay of each image in the format of the suffix of ``path``.

    ``.html``: a standalone page with the images inline (``html``: the whole document to write instead, e.g. the
    interactive page of a generated answer); ``.png``, ``.svg``, ``.pdf``: one matplotlib figure, the
    images in a row above the tokens (options ``width``, ``font_size``, ``dpi``, ``colorbar``); ``.tex``: a snippet
    (``document=True``: a document) that includes the overlays, written as ``<stem>_image<k>.png`` beside it
    (``\\usepackage{graphicx}``; option ``captions``). Every format takes the overlay options
    :py:data:`IMAGE_OPTIONS`. Missing folders are made.

    Returns
    -------
    pathlib.Path
    """
    path = check_output(path)
    suffix = path.suffix.lower()
    image_options, options = _split(options)
    allowed = {'.html': (), '.tex': ('document', 'captions')}.get(suffix, ('width', 'font_size', 'dpi', 'colorbar'))
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f'saving {suffix} takes no option(s) {unknown}; it takes {list(allowed) + list(IMAGE_OPTIONS)}')
    shown = overlays(images, **image_options)
    if suffix == '.html':
        document = html if html is not None else multimodal_html(heatmaps, images, scale, title, **image_options)
        return write_file(path, lambda target: target.write_text(document, encoding='utf-8'))
    resolve_scales(heatmaps, scale)
    if suffix == '.tex':
        return write_file(
            path, lambda target: target.write_text(_latex(heatmaps, shown, target, **options), encoding='utf-8')
        )
    pictures = [(caption, np.asarray(image.convert('RGB'))) for caption, image in shown]
    return write_file(path, lambda target: save_figure(heatmaps, target, suffix[1:], images=pictures, **options))
