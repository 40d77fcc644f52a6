"""Image heatmaps: a relevance heatmap and an overlay on the input image, as Pillow images (written to files by
:py:func:`zennit_attn.results.render.views.save_image`).

By default the heatmap has the colours of every other heatmap of :py:mod:`zennit_attn.results.render`
(:py:func:`~zennit_attn.results.render.colors.relevance_to_rgb`: light grey for 0, red positive, blue negative,
symmetric around 0). zennit's colour maps are there by name (``cmap='bwr'``, ``'coldnhot'``, ...), through
:py:func:`zennit.image.imgify` and :py:mod:`zennit.cmap` palettes. zennit 0.5.1 hands the palette to Pillow as a
numpy array, which Pillow 13 refuses (``imgify(...)`` and ``zennit.image.imsave`` fail for 1-channel heatmaps);
here the image is made without a palette and the palette is set as bytes,
``img.putpalette(palette(cmap).astype('uint8').tobytes())``.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from zennit.image import imgify, palette

from .colors import LEVELS, color_table

__all__ = ['heatmap', 'overlay']


def _array(tensor) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        tensor = tensor.detach().float().cpu().numpy()
    return np.asarray(tensor, dtype=np.float64)


def _relevance_map(relevance) -> np.ndarray:
    """``[H, W]``, ``[1, H, W]`` or ``[C, H, W]`` (summed over channels) -> ``[H, W]``."""
    array = _array(relevance)
    if array.ndim == 3:
        array = array.sum(0)
    if array.ndim != 2:
        raise ValueError(f'relevance must be [H, W] or [C, H, W], got shape {array.shape}')
    return array


def _bound(array: np.ndarray, vmax: float | None = None) -> float:
    """The relevance of full colour: ``vmax``, else the largest absolute finite relevance (as the token heatmaps:
    NaN and infinite pixels do not set it); 1 where that is not a positive finite number (all pixels 0)."""
    if vmax is None:
        finite = np.abs(array[np.isfinite(array)])
        vmax = float(finite.max()) if finite.size else 0.0
    bound = float(vmax)
    return bound if bound > 0 and np.isfinite(bound) else 1.0


def heatmap(
    relevance, cmap: str | None = None, level: float = 1.0, scale: int = 1, vmax: float | None = None
) -> Image.Image:
    """The relevance as an RGB heatmap, symmetric around 0.

    Parameters
    ----------
    relevance: tensor or array
        ``[H, W]`` or ``[C, H, W]`` (summed over channels).
    cmap: str or zennit.cmap.ColorMap, optional
        None (default): the map of :py:func:`~zennit_attn.results.render.colors.relevance_to_rgb`, as in the token
        heatmaps; else a zennit colour map name (``'bwr'``, ``'coldnhot'``, ``'seismic'``, ...) or colour map
        source code.
    level: float
        zennit's palette level (above 1 saturates earlier; zennit colour maps only).
    scale: int
        Integer upscaling (nearest neighbour), for small images such as 28 x 28.
    vmax: float, optional
        Relevance that gets the saturated colour; default the largest absolute finite relevance (0 maps to the
        centre; NaN pixels are drawn as 0 and, like infinite ones, do not set the scale).

    Returns
    -------
    PIL.Image.Image
        An RGB image; :py:func:`zennit_attn.results.render.views.save_image` writes it.
    """
    array = _relevance_map(relevance)
    bound = _bound(array, vmax)
    if cmap is None:  # the token heatmaps' colour levels (relevance_level), looked up in their table
        fraction = np.clip(np.nan_to_num(array / bound), -1.0, 1.0)
        levels = (np.sign(fraction) * np.floor(np.abs(fraction) * LEVELS + 0.5)).astype(np.int64) + LEVELS
        image = Image.fromarray(np.asarray(color_table(), dtype=np.uint8)[levels], mode='RGB')
        if scale != 1:
            image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
        return image
    # uint8 indices into the palette (imgify keeps uint8 input as it is); no cmap passed -> no numpy palette
    indices = np.clip(np.round((np.clip(np.nan_to_num(array / bound), -1.0, 1.0) + 1.0) * 127.5), 0, 255).astype(
        np.uint8
    )
    image = imgify(indices)
    if image.mode != 'L':  # pragma: no cover - imgify of a uint8 2-D array gives mode 'L'
        image = Image.fromarray(indices, mode='L')
    image = image.convert('P')
    image.putpalette(np.asarray(palette(cmap, level), dtype=np.uint8).tobytes())
    image = image.convert('RGB')
    if scale != 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    return image


def _input_image(pixels, mean=None, std=None) -> np.ndarray:
    """``[C, H, W]`` or ``[H, W]`` pixels -> ``[H, W, 3]`` floats in [0, 1] (min-max normalised unless in range)."""
    array = _array(pixels)
    if array.ndim == 3:
        if mean is not None and std is not None:
            array = array * np.asarray(std).reshape(-1, 1, 1) + np.asarray(mean).reshape(-1, 1, 1)
        array = array.transpose(1, 2, 0)
        if array.shape[2] == 1:
            array = array[..., 0]
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f'pixels must be [H, W], [1, H, W] or [3, H, W], got {_array(pixels).shape}')
    low, high = float(array.min()), float(array.max())
    if low < 0 or high > 1:
        array = (array - low) / (high - low) if high > low else np.zeros_like(array)
    return array


def overlay(
    pixels,
    relevance,
    cmap: str | None = None,
    level: float = 1.0,
    alpha: float = 0.7,
    scale: int = 1,
    mean=None,
    std=None,
    vmax: float | None = None,
) -> Image.Image:
    """The heatmap blended over the greyscale input image; each pixel's heatmap weight is ``alpha`` times its
    absolute relevance relative to ``vmax``, so irrelevant pixels show the image.

    Parameters
    ----------
    pixels: tensor or array
        ``[C, H, W]`` or ``[H, W]`` input image (normalised inputs are min-max scaled, or un-normalised with ``mean``
        and ``std`` per channel).
    relevance: tensor or array
        ``[H, W]`` or ``[C, H, W]``.
    cmap, level, scale, vmax
        As for :py:func:`heatmap`.
    alpha: float
        Largest weight of the heatmap.
    mean, std: sequence of float, optional
        Per-channel normalisation of ``pixels`` to undo.

    Returns
    -------
    PIL.Image.Image
        An RGB image; :py:func:`zennit_attn.results.render.views.save_image` writes it.
    """
    image = _input_image(pixels, mean, std)
    grey = image.mean(2, keepdims=True).repeat(3, axis=2)
    colours = np.asarray(heatmap(relevance, cmap, level, 1, vmax), dtype=np.float64) / 255
    array = _relevance_map(relevance)
    weight = alpha * np.clip(np.nan_to_num(np.abs(array) / _bound(array, vmax)), 0, 1)[..., None]
    blended = (1 - weight) * grey + weight * colours
    result = Image.fromarray(np.clip(np.round(blended * 255), 0, 255).astype(np.uint8), mode='RGB')
    if scale != 1:
        result = result.resize((result.width * scale, result.height * scale), Image.NEAREST)
    return result
