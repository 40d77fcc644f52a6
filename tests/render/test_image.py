"""Image heatmaps: colours, PNG files (the Pillow 13 palette workaround), overlays."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from zennit_attn import ImageExplanation
from zennit_attn.render.image import heatmap, overlay, save_explanation, save_heatmap, save_overlay


def test_heatmap_colours_are_symmetric_bwr():
    relevance = torch.zeros(4, 4)
    relevance[0, 0], relevance[1, 1], relevance[2, 2] = 2.0, -2.0, 1.0
    image = heatmap(relevance)
    assert image.mode == 'RGB' and image.size == (4, 4)
    assert image.getpixel((0, 0)) == (255, 0, 0)  # +max: red
    assert image.getpixel((1, 1)) == (0, 0, 255)  # -max: blue
    assert image.getpixel((3, 3)) == (255, 255, 255)  # 0: white
    r, g, b = image.getpixel((2, 2))
    assert r == 255 and 100 < g < 160 and g == b  # half: light red
    # channels are summed; a row of zeros is all white; upscaling
    assert heatmap(torch.stack([relevance, relevance])).getpixel((0, 0)) == (255, 0, 0)
    assert (np.asarray(heatmap(torch.zeros(3, 3))) == 255).all()
    assert heatmap(relevance, scale=3).size == (12, 12)
    assert heatmap(relevance, cmap='coldnhot').getpixel((3, 3)) == (0, 0, 0)


def test_png_files(tmp_path):
    relevance = torch.randn(28, 28)
    path = save_heatmap(relevance, tmp_path / 'a' / 'heat.png', scale=2)
    with Image.open(path) as image:
        assert image.format == 'PNG' and image.size == (56, 56)
        assert np.asarray(image.convert('RGB')).shape == (56, 56, 3)
    path = save_overlay(torch.rand(1, 28, 28), relevance, tmp_path / 'over.png')
    with Image.open(path) as image:
        assert image.size == (28, 28)


def test_overlay_shows_the_image_where_nothing_is_relevant():
    pixels = torch.rand(3, 6, 6)
    result = np.asarray(overlay(pixels, torch.zeros(6, 6)), dtype=np.float64)
    grey = pixels.mean(0).numpy() * 255
    assert np.abs(result[..., 0] - grey).max() <= 1 and np.abs(result[..., 2] - grey).max() <= 1
    relevance = torch.zeros(6, 6)
    relevance[0, 0] = 1.0
    coloured = np.asarray(overlay(pixels, relevance, alpha=1.0))
    assert tuple(coloured[0, 0]) == (255, 0, 0)
    # normalised inputs outside [0, 1] are rescaled; mean/std un-normalise
    assert overlay(pixels * 4 - 2, relevance).size == (6, 6)
    assert overlay(pixels, relevance, mean=[0.5] * 3, std=[0.2] * 3).size == (6, 6)
    with pytest.raises(ValueError):
        overlay(torch.rand(2, 6, 6), relevance)


def test_save_explanation(tmp_path):
    explanation = ImageExplanation(relevance=torch.randn(2, 8, 8), pixel_relevance=torch.randn(2, 1, 8, 8),
                                   target=torch.tensor([0, 1]), logit=torch.ones(2), pixels=torch.rand(2, 1, 8, 8))
    paths = save_explanation(explanation, tmp_path / 'sample', row=1, scale=4, cmap='seismic')
    assert [path.name for path in paths] == ['sample_heatmap.png', 'sample_overlay.png']
    for path in paths:
        with Image.open(path) as image:
            assert image.size == (32, 32)
