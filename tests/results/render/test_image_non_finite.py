"""Image heatmaps, overlays and the terminal's patch grids of relevance with NaN or infinite pixels: the colour scale
is the largest absolute finite relevance, as in the token heatmaps, and a NaN pixel is drawn as relevance 0 (not as
full blue or black)."""

from __future__ import annotations

import io
import re

import numpy as np
import torch

from zennit_attn.results.render.colors import NEUTRAL, relevance_to_rgb
from zennit_attn.results.render.image import heatmap, overlay
from zennit_attn.results.render.multimodal import show_images

RELEVANCE = torch.tensor([[float('nan'), 2.0, -1.0], [0.5, 0.0, float('inf')]], dtype=torch.float64)


def test_heatmap_scale_is_the_largest_finite_relevance():
    image = heatmap(RELEVANCE)
    assert image.getpixel((0, 0)) == NEUTRAL  # NaN: drawn as 0
    # before: the scale was 1 (NaN maximum replaced by 1), so -1 was full blue and 0.5 had the colour of 1 of 2
    assert image.getpixel((2, 0)) == relevance_to_rgb(-1.0, 2.0)
    assert image.getpixel((0, 1)) == relevance_to_rgb(0.5, 2.0)
    assert image.getpixel((1, 0)) == relevance_to_rgb(2.0, 2.0)
    assert heatmap(RELEVANCE[1:, :2]).getpixel((0, 0)) == relevance_to_rgb(0.5, 0.5)
    zennit = heatmap(RELEVANCE, cmap='bwr')
    assert zennit.getpixel((0, 0)) == zennit.getpixel((1, 1))  # NaN as 0 (before: index 0, full blue)
    assert zennit.getpixel((2, 0)) == heatmap(RELEVANCE.nan_to_num(0.0, 0.0, 0.0), cmap='bwr').getpixel((2, 0))


def test_overlay_weights_follow_the_finite_scale():
    pixels = torch.full((3, 2, 3), 0.5)
    image = np.asarray(overlay(pixels, RELEVANCE, alpha=1.0), dtype=np.int64)
    grey = round(0.5 * 255)
    assert tuple(image[0, 0]) == (grey, grey, grey)  # NaN: the image shows (before: black, 0 0 0)
    assert tuple(image[1, 1]) == (grey, grey, grey)
    colours = np.asarray(heatmap(RELEVANCE), dtype=np.float64) / 255
    expected = np.round((0.5 * 0.5 + 0.5 * colours[0, 2]) * 255)  # weight |-1| / 2 (before: the whole overlay grey)
    assert (image[0, 2] == expected).all()
    assert tuple(image[0, 1]) == relevance_to_rgb(2.0, 2.0)


def test_terminal_patch_grid_scale_is_the_largest_finite_relevance():
    patches = torch.tensor([[float('nan'), 2.0], [-1.0, 0.0]], dtype=torch.float64)
    stream = io.StringIO()
    show_images([('image 1', None, None, patches, None, None)], color=True, stream=stream)
    cells = re.findall(r'\x1b\[48;2;(\d+);(\d+);(\d+)m', stream.getvalue())
    colours = [tuple(int(channel) for channel in cell) for cell in cells]
    # before: the scale was NaN, and every cell was drawn neutral
    assert colours == [NEUTRAL, relevance_to_rgb(2.0, 2.0), relevance_to_rgb(-1.0, 2.0), NEUTRAL]
