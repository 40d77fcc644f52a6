"""From explanations to pictures and files: the heatmaps of an :py:class:`~zennit_attn.Explanation` or a
:py:class:`~zennit_attn.GenerationExplanation`, the one check of an output path (:py:func:`check_output`), the one
function that writes token heatmaps by file suffix (:py:func:`save_heatmaps`) and the one that writes images
(:py:func:`save_image`, used for the heatmap and overlay of an :py:class:`~zennit_attn.ImageExplanation`).

The explanation classes call these functions for their ``tokens``, ``show``, ``to_html``, ``_repr_html_`` and
``save`` methods; they read the explanations' fields only (no import of the classes), so that rendering stays below
the attribution code.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import numpy as np
import torch
from PIL import Image

from . import figure, latex
from .html import fragment, generation_fragment, heatmap_fragment, page
from .image import heatmap, overlay
from .layout import Heatmap, ScaleLike, Segment, format_relevance, resolve_scales
from .terminal import terminal_heatmap
from .tokens import merge_words, token_texts

__all__ = [
    'SUFFIXES',
    'IMAGE_SUFFIXES',
    'resolve_tokenizer',
    'check_row',
    'explanation_heatmaps',
    'explanation_tokens',
    'generation_columns',
    'generation_heatmap',
    'generation_views',
    'show_heatmaps',
    'heatmaps_html',
    'check_output',
    'write_file',
    'save_heatmaps',
    'save_image',
    'save_image_explanation',
    'shared_scale',
]

#: file suffixes that :py:func:`save_heatmaps` writes
SUFFIXES = ('.html', '.png', '.svg', '.pdf', '.tex')

#: file suffixes that :py:func:`save_image` writes (lossless, so that the colours stay those of the map)
IMAGE_SUFFIXES = ('.png',)


def resolve_tokenizer(tokenizer, explanation):
    """``tokenizer``, else the one stored on the explanation, else a ValueError that names the fix."""
    tokenizer = tokenizer if tokenizer is not None else getattr(explanation, 'tokenizer', None)
    if tokenizer is None:
        raise ValueError(
            'showing tokens needs the tokenizer: pass tokenizer=..., or call explain(model, text, '
            'tokenizer=tokenizer), which stores it on the explanation'
        )
    if not callable(getattr(tokenizer, 'decode', None)):
        raise TypeError(f'tokenizer must be a Hugging Face tokenizer (with decode), got {type(tokenizer).__name__}')
    return tokenizer


def check_row(row, batch: int, what: str = 'row') -> int:
    """``row`` as a non-negative index into ``batch`` rows (negative rows count from the end); ``what`` names the
    rows in the error (``'row'``, ``'generated token'``)."""
    if isinstance(row, bool) or not isinstance(row, numbers.Integral):
        raise TypeError(f'{what} must be an integer index, got {row!r}')
    if not -batch <= row < batch:
        raise IndexError(
            f'{what} {row} is out of range: there are {batch} ({what} 0 to {batch - 1}, or negative from the end)'
        )
    return int(row) % batch


def _special(tokenizer, ids: Sequence[int]) -> list[bool]:
    special = set(getattr(tokenizer, 'all_special_ids', None) or ())
    return [int(token) in special for token in ids]


def _segment(
    tokenizer,
    ids: Sequence[int],
    values: Sequence[float],
    positions: Sequence[int],
    words: bool,
    label: str | None = None,
    images: torch.Tensor | None = None,
) -> Segment:
    """The segment of ``ids``; ``images`` (True at image placeholder tokens) shows each run of placeholders as one
    box ``[image k]`` holding their summed relevance (0 where the model replaces them by image features)."""
    if images is not None and bool(images.any()):
        parts, start, number = [], 0, 0
        flags = images.tolist() + [None]
        for index in range(1, len(flags)):
            if flags[index] != flags[index - 1]:
                span = slice(start, index)
                if flags[start]:
                    number += 1
                    parts.append(
                        Segment([f'[image {number}]'], [math.fsum(values[span])], None, [list(positions[span])])
                    )
                else:
                    parts.append(_segment(tokenizer, ids[span], values[span], positions[span], words))
                start = index
        return Segment(
            [token for part in parts for token in part.tokens],
            [value for part in parts for value in part.values],
            label,
            [group for part in parts for group in part.positions],
        )
    ids = [int(token) for token in ids]
    texts = token_texts(tokenizer, ids)
    if not words:
        return Segment(texts, list(values), label, [[position] for position in positions])
    # tokens left out between two shown ones (a chat template's) end a word: the words of two messages stay apart
    starts = [0] + [index for index in range(1, len(positions)) if positions[index] != positions[index - 1] + 1]
    merged, sums, groups = [], [], []
    for start, end in zip(starts, starts[1:] + [len(ids)]):
        part = merge_words(texts[start:end], list(values[start:end]), _special(tokenizer, ids[start:end]))
        merged += part[0]
        sums += part[1]
        groups += [[positions[start + index] for index in group] for group in part[2]]
    return Segment(merged, sums, label, groups)


def _row_values(tensor: torch.Tensor, row: int, keep: torch.Tensor | None = None) -> tuple[list[float], list[int]]:
    values = tensor[row].detach().to('cpu', torch.float64)
    positions = torch.arange(values.shape[0])
    if keep is not None:
        values, positions = values[keep], positions[keep]
    return values.tolist(), positions.tolist()


def _warn_non_finite(values: Sequence[float], where: str) -> None:
    bad = sum(not math.isfinite(value) for value in values)
    if bad:
        warnings.warn(
            f'{where} has {bad} non-finite relevance value(s) (NaN or infinite): they are shown as 0 '
            '(neutral) and left out of the colour scale',
            RuntimeWarning,
            stacklevel=4,
        )


def _describe(tokenizer, explanation, row: int) -> str:
    target = explanation.target[row]
    logit = explanation.logit[row]
    position = None if explanation.position is None else explanation.position[row]
    method = getattr(explanation, 'method', '')
    where = 'decoder position' if getattr(explanation, 'decoder_input_ids', None) is not None else 'position'
    if position is None and getattr(explanation, 'images', None):
        text = 'similarity score of the text and its image'
    elif position is None:
        text = f'target {int(target)}'
    elif target.dim() == 0:
        text = (
            f'target token {token_texts(tokenizer, [int(target)])[0]!r} (id {int(target)}) at {where} {int(position)}'
        )
    else:
        pairs = [f'{token_texts(tokenizer, [int(t)])[0]!r} at {int(p)}' for t, p in zip(target, position)]
        shown = ', '.join(pairs[:6]) + (f', ... ({len(pairs)} in all)' if len(pairs) > 6 else '')
        text = f'sum of {len(pairs)} logits: {shown}'
    contrast = getattr(explanation, 'contrast', None)
    if contrast is not None:  # explain(..., contrast=...): the logit is a difference
        others = [int(token) for token in contrast[row].reshape(-1)]
        named = (
            [str(token) for token in others]
            if position is None
            else [repr(text) for text in token_texts(tokenizer, others)]
        )
        text += f' minus the contrast {", ".join(named[:6])}{", ..." if len(named) > 6 else ""}'
    return f'row {row}: {text}, logit {float(logit.sum()):.4g} ({method})'


def explanation_heatmaps(
    explanation,
    rows=None,
    words: bool = False,
    tokenizer=None,
    scale_without_first: bool = False,
    template: bool = False,
) -> list[Heatmap]:
    """The heatmaps of rows of an :py:class:`~zennit_attn.Explanation` (scales not yet resolved).

    Padding (``attention_mask == 0``) is left out. Encoder-decoder explanations have two segments per row,
    ``'encoder'`` and ``'decoder'`` tokens.

    Parameters
    ----------
    explanation: zennit_attn.Explanation
    rows: int, sequence of int or None
        Rows to show; None: all.
    words: bool
        Merge tokens into words (relevance summed), see :py:func:`~zennit_attn.results.render.tokens.merge_words`.
    tokenizer: optional
        Default: the explanation's own (``explanation.tokenizer``).
    scale_without_first: bool
        Leave the first (non-padding) token, or with ``words`` its word, out of the colour scale (an attention
        sink, see :py:func:`zennit_attn.results.segments.first_token_share`); the caption says so and gives its share.
    template: bool
        Show the tokens of a chat template (``explanation.template``, see :py:mod:`zennit_attn.inputs.chat`) too; by
        default they are left out like padding (their relevance is unchanged).

    Returns
    -------
    list of Heatmap
    """
    if not isinstance(scale_without_first, bool):
        raise TypeError(f'scale_without_first must be True or False, got {scale_without_first!r}')
    tokenizer = resolve_tokenizer(tokenizer, explanation)
    batch = explanation.relevance.shape[0]
    if rows is None:
        rows = range(batch)
    elif isinstance(rows, numbers.Integral) and not isinstance(rows, bool):
        rows = [rows]
    rows = [check_row(row, batch) for row in rows]
    if not rows:
        raise ValueError('rows is empty: nothing to show')
    heatmaps = []
    for row in rows:
        mask = explanation.attention_mask
        keep = None if mask is None else (mask[row] != 0).cpu()
        hidden = getattr(explanation, 'template', None)
        if not template and hidden is not None:
            shown = ~hidden[row].cpu().bool()
            keep = shown if keep is None else keep & shown
        values, positions = _row_values(explanation.relevance, row, keep)
        ids = explanation.input_ids[row].cpu()
        ids = ids if keep is None else ids[keep]
        segments = []
        decoder = getattr(explanation, 'decoder_relevance', None)
        placeholders = getattr(explanation, 'image_tokens', None)
        if placeholders is not None:
            placeholders = placeholders[row].cpu() if keep is None else placeholders[row].cpu()[keep]
        segments.append(
            _segment(
                tokenizer,
                ids.tolist(),
                values,
                positions,
                words,
                'encoder' if decoder is not None else None,
                placeholders,
            )
        )
        if decoder is not None:
            decoder_mask = getattr(explanation, 'decoder_attention_mask', None)
            shown = None if decoder_mask is None else (decoder_mask[row] != 0).cpu()
            values, positions = _row_values(decoder, row, shown)
            decoder_ids = explanation.decoder_input_ids[row].cpu()
            decoder_ids = decoder_ids if shown is None else decoder_ids[shown]
            segments.append(_segment(tokenizer, decoder_ids.tolist(), values, positions, words, 'decoder'))
        heatmap = Heatmap(segments, title=_describe(tokenizer, explanation, row))
        if scale_without_first and segments[0].values:
            magnitude = sum(abs(value) for value in segments[0].values if math.isfinite(value))
            share = abs(segments[0].values[0]) / magnitude if magnitude else math.nan
            heatmap.unscaled = {(0, 0)}
            heatmap.title += (
                f'; first {"word" if words else "token"} {segments[0].tokens[0]!r} '
                f'({format_relevance(segments[0].values[0])}, {share:.1%} of |relevance|) left out of '
                'the colour scale'
            )
        _warn_non_finite(heatmap.values, f'row {row}')
        heatmaps.append(heatmap)
    return heatmaps


def explanation_tokens(
    explanation, tokenizer=None, row: int = 0, words: bool = False, template: bool = False
) -> list[str]:
    """The token (or word) texts of one row, padding (and, unless ``template``, a chat template's tokens) removed;
    encoder then decoder tokens for encoder-decoder models."""
    (heatmap,) = explanation_heatmaps(explanation, [row], words, tokenizer, template=template)
    return [token for segment in heatmap.segments for token in segment.tokens]


def shared_scale(*explanations, rows=None) -> float:
    """One colour scale for several explanations: the largest absolute finite relevance over all of them (their
    ``relevance``, plus ``decoder_relevance`` and ``answer_relevance`` where present), to pass as ``scale=`` to
    each one's ``show``, ``to_html`` or ``save`` so that equal colours mean equal relevance across them.

    Parameters
    ----------
    *explanations
        :py:class:`~zennit_attn.Explanation` or :py:class:`~zennit_attn.GenerationExplanation` objects.
    rows: sequence of int, optional
        Only these rows of each (for batch explanations).

    Returns
    -------
    float
    """
    if not explanations:
        raise ValueError('shared_scale() needs at least one explanation')
    largest = 0.0
    for explanation in explanations:
        for name in ('relevance', 'decoder_relevance', 'answer_relevance'):
            tensor = getattr(explanation, name, None)
            if tensor is None:
                continue
            tensor = tensor.detach().double()
            if rows is not None and name != 'answer_relevance':
                tensor = tensor[list(rows)]
            finite = tensor[torch.isfinite(tensor)]
            if finite.numel():
                largest = max(largest, float(finite.abs().max()))
    return largest


def show_heatmaps(
    heatmaps: Sequence[Heatmap], scale: ScaleLike = None, color: bool | None = None, stream: IO | None = None
) -> None:
    """Print heatmaps to ``stream`` (default ``sys.stdout``) in colour if it is a terminal (see
    :py:func:`~zennit_attn.results.render.terminal.use_color`)."""
    resolve_scales(heatmaps, scale)
    stream = sys.stdout if stream is None else stream
    text = '\n\n'.join(terminal_heatmap(heatmap, color, stream) for heatmap in heatmaps)
    print(text, file=stream)


def heatmaps_html(
    heatmaps: Sequence[Heatmap],
    scale: ScaleLike = None,
    title: str | None = None,
    subtitle: str | None = None,
    standalone: bool = True,
) -> str:
    """Heatmaps as HTML: a standalone page, or a fragment for Jupyter (``standalone=False``)."""
    resolve_scales(heatmaps, scale)
    body = ''.join(heatmap_fragment(heatmap) for heatmap in heatmaps)
    if standalone:
        return page(body, title or 'Token relevance', subtitle)
    return fragment(body, title, subtitle)


def check_output(path: str | os.PathLike, suffixes: Sequence[str] = SUFFIXES) -> Path:
    """``path`` as a :py:class:`~pathlib.Path` if a file in a format of ``suffixes`` can be written there, else a
    ValueError that names the path and what to do; nothing is left behind.

    Refused: a suffix not in ``suffixes`` (compared in lower case), a path that is a directory, a path below a file,
    a folder one may not write in, and a file the file system refuses to open for writing although the permissions
    allow it (a read-only mount, ``/proc``): where the folder exists, the file is opened for appending (an existing
    file is not changed) and removed again if it did not exist. Missing folders are not made here; the functions
    that write (:py:func:`save_heatmaps`, :py:func:`save_image`) make them.

    Parameters
    ----------
    path: str or os.PathLike
        The output file.
    suffixes: sequence of str
        The accepted suffixes with their dot; default :py:data:`SUFFIXES`, the formats of :py:func:`save_heatmaps`
        (:py:data:`IMAGE_SUFFIXES` for :py:func:`save_image`).

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ValueError
        Where no file of a format of ``suffixes`` can be written at ``path`` (the message says why and what to do).
    TypeError
        Where ``path`` is not a str or os.PathLike.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f'path must be a file name (str or os.PathLike), got {type(path).__name__}')
    path = Path(path)
    suffixes = [suffix.lower() for suffix in suffixes]
    if not suffixes:
        raise ValueError('suffixes is empty: give the accepted file suffixes, e.g. (".png",)')
    try:
        if path.is_dir():
            raise ValueError(
                f'cannot write {str(path)!r}: it is a directory; give a file name such as '
                f'{str(path / ("heatmap" + suffixes[0]))!r}'
            )
        if path.suffix.lower() not in suffixes:
            raise ValueError(
                f'cannot tell the format of {str(path)!r} from its suffix {path.suffix or "(none)"!r}: '
                f'use one of {", ".join(suffixes)}'
            )
        folder = next(ancestor for ancestor in path.absolute().parents if ancestor.exists())
        if not folder.is_dir():
            raise ValueError(
                f'cannot write {str(path)!r}: {str(folder)!r} is a file, not a folder; choose a path in a folder'
            )
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(
                f'cannot write {str(path)!r}: no permission to write in the folder {str(folder)!r}; '
                'choose a folder you may write in'
            )
        if folder == path.absolute().parent:  # a file system may refuse what the permissions allow: try it
            existed = path.exists()
            with path.open('a'):
                pass
            if not existed:
                path.unlink()
    except OSError as error:
        raise ValueError(
            f'cannot write {str(path)!r}: {error.strerror or error}; choose another file or folder'
        ) from error
    return path


def write_file(path: Path, write: Callable[[Path], object]) -> Path:
    """Make the missing folders of ``path`` and call ``write(path)``; an OSError names the path."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    except OSError as error:
        raise OSError(error.errno, f'cannot write {str(path)!r}: {error.strerror or error}') from error
    return path


def save_heatmaps(
    heatmaps: Sequence[Heatmap],
    path: str | os.PathLike,
    scale: ScaleLike = None,
    title: str | None = None,
    html: str | None = None,
    **options,
) -> Path:
    """Write heatmaps to ``path`` in the format of its suffix (checked by :py:func:`check_output`).

    ``.html``: a standalone page (``html`` replaces its content, e.g. the interactive page of a generated answer);
    ``.png``, ``.svg``, ``.pdf``: a matplotlib figure (:py:func:`~zennit_attn.results.render.figure.save_figure`;
    options ``width``, ``font_size``, ``dpi``, ``colorbar``); ``.tex``: a LaTeX snippet
    (:py:func:`~zennit_attn.results.render.latex.save_latex`; options ``document``, ``captions``). Missing folders are
    made.

    Parameters
    ----------
    heatmaps: sequence of Heatmap
    path: str or os.PathLike
    scale: None, 'shared' or float
        See :py:func:`~zennit_attn.results.render.layout.resolve_scales`.
    title: str, optional
        Heading of the HTML page.
    html: str, optional
        The whole HTML document to write for ``.html``.
    **options
        Format options (see above); an option the format does not take is a TypeError.

    Returns
    -------
    pathlib.Path
    """
    path = check_output(path)
    suffix = path.suffix.lower()
    resolve_scales(heatmaps, scale)
    allowed = {
        '.html': (),
        '.tex': ('document', 'captions'),
        '.png': ('width', 'font_size', 'dpi', 'colorbar'),
        '.svg': ('width', 'font_size', 'dpi', 'colorbar'),
        '.pdf': ('width', 'font_size', 'dpi', 'colorbar'),
    }[suffix]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f'saving {suffix} takes no option(s) {unknown}; it takes {list(allowed) or "none"}')
    if suffix == '.html':
        document = html if html is not None else heatmaps_html(heatmaps, None, title)
        return write_file(path, lambda target: target.write_text(document, encoding='utf-8'))
    if suffix == '.tex':
        return write_file(path, lambda target: latex.save_latex(heatmaps, target, **options))
    return write_file(path, lambda target: figure.save_figure(heatmaps, target, suffix[1:], **options))


def _pillow(image) -> Image.Image:
    """A Pillow image, or an ``[H, W]``, ``[H, W, 3]`` or ``[H, W, 4]`` array of uint8 or of floats in [0, 1], as
    a Pillow image."""
    if isinstance(image, Image.Image):
        return image
    if not isinstance(image, np.ndarray):
        raise TypeError(f'image must be a PIL.Image.Image or a numpy array, got {type(image).__name__}')
    if not (image.ndim == 2 or image.ndim == 3 and image.shape[2] in (3, 4)):
        raise ValueError(f'an image array must be [H, W], [H, W, 3] or [H, W, 4], got shape {image.shape}')
    if image.dtype != np.uint8:
        if image.dtype.kind not in 'fiu':
            raise TypeError(f'an image array must hold numbers (uint8 0-255 or floats in [0, 1]), got {image.dtype}')
        values = image.astype(np.float64)
        if not np.isfinite(values).all() or values.min(initial=0.0) < 0 or values.max(initial=0.0) > 1:
            raise ValueError(
                'an image array that is not uint8 must hold finite values in [0, 1] (convert 0-255 '
                'values with .astype(numpy.uint8))'
            )
        image = np.round(values * 255).astype(np.uint8)
    return Image.fromarray(image)


def save_image(image, path: str | os.PathLike) -> Path:
    """Write an image in the format of the suffix of ``path`` (:py:data:`IMAGE_SUFFIXES`; checked by
    :py:func:`check_output`); missing folders are made. This writes every image heatmap and overlay.

    Parameters
    ----------
    image: PIL.Image.Image or numpy.ndarray
        A Pillow image (e.g. :py:func:`~zennit_attn.results.render.image.heatmap` or
        :py:func:`~zennit_attn.results.render.image.overlay`), or an ``[H, W]`` (grey), ``[H, W, 3]`` (RGB) or
        ``[H, W, 4]`` (RGBA) array of uint8 or of floats in [0, 1].
    path: str or os.PathLike

    Returns
    -------
    pathlib.Path
    """
    path = check_output(path, IMAGE_SUFFIXES)
    image = _pillow(image)
    image_format = Image.registered_extensions()[path.suffix.lower()]
    return write_file(path, lambda target: image.save(target, format=image_format))


def save_image_explanation(explanation, path: str | os.PathLike, row: int = 0, **options) -> tuple[Path, Path]:
    """Write the heatmap of ``row`` of an :py:class:`~zennit_attn.ImageExplanation` to ``path`` and its overlay
    on the input image to ``<stem>_overlay<suffix>`` in the same folder (made if missing), with
    :py:func:`save_image`.

    Parameters
    ----------
    explanation: zennit_attn.ImageExplanation
    path: str or os.PathLike
        A file name with a suffix of :py:data:`IMAGE_SUFFIXES` (``.png``).
    row: int
        The batch row (negative rows count from the end).
    **options
        ``cmap``, ``level``, ``scale``, ``vmax`` for both images (:py:func:`~zennit_attn.results.render.image.heatmap`);
        ``alpha``, ``mean``, ``std`` for the overlay (:py:func:`~zennit_attn.results.render.image.overlay`).

    Returns
    -------
    tuple of pathlib.Path
        ``(heatmap, overlay)``.
    """
    path = check_output(path, IMAGE_SUFFIXES)
    overlay_path = check_output(path.with_name(f'{path.stem}_overlay{path.suffix}'), IMAGE_SUFFIXES)
    unknown = sorted(set(options) - {'cmap', 'level', 'scale', 'vmax', 'alpha', 'mean', 'std'})
    if unknown:
        raise TypeError(f'unknown option(s) {unknown}; image heatmaps take cmap, level, scale, vmax, alpha, mean, std')
    row = check_row(row, explanation.relevance.shape[0])
    both = {key: value for key, value in options.items() if key in ('cmap', 'level', 'scale', 'vmax')}
    relevance = explanation.relevance[row]
    return (
        save_image(heatmap(relevance, **both), path),
        save_image(overlay(explanation.pixels[row], relevance, **options), overlay_path),
    )


# ------------------------------------------------------------------------------------------------ generated answers
def generation_columns(generation, tokenizer=None, words: bool = False):
    """The shown columns of a :py:class:`~zennit_attn.GenerationExplanation`: its parts (prompt, for T5 the decoder
    start, answer) with token texts, and how tokens were merged.

    Returns
    -------
    tuple
        ``(parts, groups)``: ``parts`` is a list of ``(label, texts, column groups)`` per part; ``groups`` the
        column indices of every shown item, in order.
    """
    tokenizer = resolve_tokenizer(tokenizer, generation)
    ids = generation.input_ids[0].tolist() if generation.input_ids.dim() == 2 else generation.input_ids.tolist()
    texts = token_texts(tokenizer, ids)
    special = _special(tokenizer, ids)
    bounds = [0, generation.prompt_length, generation.answer_start, len(ids)]
    labels = [
        'prompt' if not generation.encoder_decoder else 'encoder (prompt)',
        'decoder start',
        'answer' if not generation.encoder_decoder else 'decoder (answer)',
    ]
    placeholders = getattr(generation, 'image_tokens', None)
    placeholders = [False] * len(ids) if placeholders is None else [bool(flag) for flag in placeholders.tolist()]
    parts, groups, number = [], [], 0
    for label, start, end in zip(labels, bounds[:-1], bounds[1:]):
        if end <= start:
            continue
        merged, part_groups = [], []
        for run_start, run_end in _runs(placeholders, start, end):
            if placeholders[run_start]:  # a run of image placeholder tokens: one item, as in the explanations
                number += 1
                merged.append(f'[image {number}]')
                part_groups.append(list(range(run_start, run_end)))
            elif words:
                run_texts, _, run_groups = merge_words(
                    texts[run_start:run_end], [0.0] * (run_end - run_start), special[run_start:run_end]
                )
                merged += run_texts
                part_groups += [[run_start + index for index in group] for group in run_groups]
            else:
                merged += texts[run_start:run_end]
                part_groups += [[index] for index in range(run_start, run_end)]
        parts.append((label, merged, part_groups))
        groups += part_groups
    return parts, groups


def _runs(flags: Sequence[bool], start: int, end: int) -> list[tuple[int, int]]:
    """``[(start, end)]`` of the runs of equal ``flags`` between ``start`` and ``end``."""
    runs, first = [], start
    for index in range(start + 1, end + 1):
        if index == end or flags[index] != flags[first]:
            runs.append((first, index))
            first = index
    return runs


def _sum_columns(values: Sequence[float], groups: Sequence[Sequence[int]]) -> list[float]:
    return [sum(values[column] for column in group) for group in groups]


def generation_heatmap(generation, token: int | None = None, words: bool = False, tokenizer=None) -> Heatmap:
    """The heatmap of the whole answer (``token=None``: ``answer_relevance``) or of generated token ``token`` (its
    row of ``relevance``), with prompt and answer as segments (scale not resolved)."""
    tokenizer = resolve_tokenizer(tokenizer, generation)
    count = generation.relevance.shape[0]
    if token is None:
        values = generation.answer_relevance.detach().double().tolist()
        text = ''.join(token_texts(tokenizer, generation.generated_ids.tolist()))
        title = f'whole answer {text!r}: sum of the logits of its {count} tokens, {float(generation.logit.sum()):.4g}'
    else:
        token = check_row(token, count, 'generated token')
        values = generation.relevance[token].detach().double().tolist()
        text = token_texts(tokenizer, [int(generation.target[token])])[0]
        title = (
            f'generated token {token + 1} of {count}: {text!r} (id {int(generation.target[token])}), logit '
            f'{float(generation.logit[token]):.4g}'
        )
    parts, _ = generation_columns(generation, tokenizer, words)
    segments = [Segment(texts, _sum_columns(values, groups), label, groups) for label, texts, groups in parts]
    heatmap = Heatmap(segments, title=f'{title} ({generation.method})')
    _warn_non_finite(heatmap.values, 'the answer' if token is None else f'generated token {token}')
    return heatmap


def generation_views(
    generation,
    words: bool = False,
    scale: ScaleLike = None,
    tokenizer=None,
    images: Callable[[Sequence[int] | None], list[dict]] | None = None,
) -> str:
    """The interactive HTML fragment of a generated answer (see
    :py:func:`~zennit_attn.results.render.html.generation_fragment`); ``images``, for an answer to images, gives the
    image overlays of a view from the indices of its generated tokens (None: the whole answer)."""
    tokenizer = resolve_tokenizer(tokenizer, generation)
    parts, groups = generation_columns(generation, tokenizer, words)
    texts = [text for _, part_texts, _ in parts for text in part_texts]
    start = generation.answer_start
    rows = generation.relevance.detach().double()
    views, clickable = [], []
    for index, group in enumerate(groups):
        generated = [column - start for column in group if column >= start]
        if not generated:
            clickable.append(None)
            continue
        values = _sum_columns(rows[generated].sum(0).tolist(), groups)
        shown = ''.join(token_texts(tokenizer, [int(generation.target[k]) for k in generated]))
        logit = float(generation.logit[generated].sum())
        which = (
            f'generated token {generated[0] + 1}'
            if len(generated) == 1
            else f'generated tokens {generated[0] + 1}-{generated[-1] + 1}'
        )
        views.append(
            {'values': values, 'upto': index, 'label': f'{which} of {rows.shape[0]}: {shown!r}, logit {logit:.4g}'}
        )
        if images is not None:
            views[-1]['images'] = images(generated)
        clickable.append(len(views) - 1)
    answer = _sum_columns(generation.answer_relevance.detach().double().tolist(), groups)
    text = ''.join(token_texts(tokenizer, generation.generated_ids.tolist()))
    views.append(
        {
            'values': answer,
            'upto': len(groups),
            'label': f'whole answer {text!r}: sum of the logits of its {rows.shape[0]} tokens, '
            f'{float(generation.logit.sum()):.4g}',
        }
    )
    if images is not None:
        views[-1]['images'] = images(None)
    heatmaps = [Heatmap([Segment(texts, view['values'])]) for view in views]
    _warn_non_finite(heatmaps[-1].values, 'the answer')
    resolve_scales(heatmaps, scale)
    for view, drawn in zip(views, heatmaps):
        view['scale'] = drawn.scale
    positions = [list(group) for group in groups]
    caption = f'Why the model answered this ({generation.method}): prompt and answer'
    return generation_fragment(texts, positions, views, clickable, caption)
