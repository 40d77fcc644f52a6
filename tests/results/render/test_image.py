"""Image heatmaps: colours (the Pillow 13 palette workaround), overlays, and writing images (save_image)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from zennit_attn import ImageExplanation
from zennit_attn.results.render.colors import NEGATIVE, NEUTRAL, POSITIVE, relevance_to_rgb
from zennit_attn.results.render.image import heatmap, overlay
from zennit_attn.results.render.views import IMAGE_SUFFIXES, save_image, save_image_explanation


def test_heatmap_default_colours_are_those_of_the_token_heatmaps():
    relevance = torch.zeros(4, 4)
    relevance[0, 0], relevance[1, 1], relevance[2, 2], relevance[3, 2] = 2.0, -2.0, 1.0, -0.3
    image = heatmap(relevance)
    assert image.mode == 'RGB' and image.size == (4, 4)
    assert image.getpixel((0, 0)) == POSITIVE
    assert image.getpixel((1, 1)) == NEGATIVE
    assert image.getpixel((3, 3)) == NEUTRAL
    for x, y in [(2, 2), (2, 3)]:
        assert image.getpixel((x, y)) == relevance_to_rgb(float(relevance[y, x]), 2.0)
    assert heatmap(relevance, vmax=1.0).getpixel((2, 2)) == POSITIVE
    assert (np.asarray(heatmap(torch.zeros(3, 3))) == NEUTRAL[0]).all()


def test_heatmap_colours_are_symmetric_bwr():
    relevance = torch.zeros(4, 4)
    relevance[0, 0], relevance[1, 1], relevance[2, 2] = 2.0, -2.0, 1.0
    image = heatmap(relevance, cmap='bwr')
    assert image.mode == 'RGB' and image.size == (4, 4)
    assert image.getpixel((0, 0)) == (255, 0, 0)  # +max: red
    assert image.getpixel((1, 1)) == (0, 0, 255)  # -max: blue
    assert image.getpixel((3, 3)) == (255, 255, 255)  # 0: white
    r, g, b = image.getpixel((2, 2))
    assert r == 255 and 100 < g < 160 and g == b  # half: light red
    # channels are summed; a row of zeros is all white; upscaling
    assert heatmap(torch.stack([relevance, relevance]), cmap='bwr').getpixel((0, 0)) == (255, 0, 0)
    assert (np.asarray(heatmap(torch.zeros(3, 3), cmap='bwr')) == 255).all()
    assert heatmap(relevance, scale=3).size == (12, 12)
    assert heatmap(relevance, cmap='coldnhot').getpixel((3, 3)) == (0, 0, 0)


def test_png_files(tmp_path):
    relevance = torch.randn(28, 28)
    path = save_image(heatmap(relevance, scale=2), tmp_path / 'a' / 'heat.png')
    assert path == tmp_path / 'a' / 'heat.png'
    with Image.open(path) as image:
        assert image.format == 'PNG' and image.size == (56, 56)
        assert np.array_equal(np.asarray(image.convert('RGB')), np.asarray(heatmap(relevance, scale=2)))
    path = save_image(overlay(torch.rand(1, 28, 28), relevance), tmp_path / 'over.PNG')
    with Image.open(path) as image:
        assert image.format == 'PNG' and image.size == (28, 28)


def test_save_image_takes_arrays_and_refuses_what_it_cannot_write(tmp_path):
    grey = np.array([[0, 128], [255, 7]], dtype=np.uint8)
    with Image.open(save_image(grey, tmp_path / 'grey.png')) as image:
        assert image.mode == 'L' and np.array_equal(np.asarray(image), grey)
    rgb = np.zeros((2, 3, 3))
    rgb[0, 0] = (1.0, 0.5, 0.0)
    with Image.open(save_image(rgb, tmp_path / 'rgb.png')) as image:
        assert image.mode == 'RGB' and image.size == (3, 2) and image.getpixel((0, 0)) == (255, 128, 0)
    with pytest.raises(ValueError, match=r'finite values in \[0, 1\]'):
        save_image(rgb * 255, tmp_path / 'bad.png')
    with pytest.raises(ValueError, match=r'\[H, W\], \[H, W, 3\] or \[H, W, 4\]'):
        save_image(np.zeros((2, 2, 2)), tmp_path / 'bad.png')
    with pytest.raises(TypeError, match='PIL.Image.Image or a numpy array'):
        save_image(torch.zeros(2, 2), tmp_path / 'bad.png')
    with pytest.raises(ValueError, match=r"'\.jpg': use one of \.png"):
        save_image(grey, tmp_path / 'grey.jpg')
    assert IMAGE_SUFFIXES == ('.png',)
    assert sorted(path.name for path in tmp_path.iterdir()) == ['grey.png', 'rgb.png']


def test_overlay_shows_the_image_where_nothing_is_relevant():
    pixels = torch.rand(3, 6, 6)
    result = np.asarray(overlay(pixels, torch.zeros(6, 6)), dtype=np.float64)
    grey = pixels.mean(0).numpy() * 255
    assert np.abs(result[..., 0] - grey).max() <= 1 and np.abs(result[..., 2] - grey).max() <= 1
    relevance = torch.zeros(6, 6)
    relevance[0, 0] = 1.0
    coloured = np.asarray(overlay(pixels, relevance, alpha=1.0))
    assert tuple(coloured[0, 0]) == POSITIVE
    assert tuple(np.asarray(overlay(pixels, relevance, alpha=1.0, cmap='bwr'))[0, 0]) == (255, 0, 0)
    # normalised inputs outside [0, 1] are rescaled; mean/std un-normalise
    assert overlay(pixels * 4 - 2, relevance).size == (6, 6)
    assert overlay(pixels, relevance, mean=[0.5] * 3, std=[0.2] * 3).size == (6, 6)
    with pytest.raises(ValueError):
        overlay(torch.rand(2, 6, 6), relevance)


def test_save_image_explanation_passes_options_to_both_images(tmp_path):
    explanation = ImageExplanation(
        relevance=torch.randn(2, 8, 8),
        pixel_relevance=torch.randn(2, 1, 8, 8),
        target=torch.tensor([0, 1]),
        logit=torch.ones(2),
        pixels=torch.rand(2, 1, 8, 8),
    )
    paths = save_image_explanation(explanation, tmp_path / 'sample.png', row=-1, scale=4, cmap='seismic', alpha=1.0)
    assert [path.name for path in paths] == ['sample.png', 'sample_overlay.png']
    expected = [
        heatmap(explanation.relevance[1], cmap='seismic', scale=4),
        overlay(explanation.pixels[1], explanation.relevance[1], cmap='seismic', scale=4, alpha=1.0),
    ]
    for path, image in zip(paths, expected):
        with Image.open(path) as written:
            assert written.size == (32, 32) and np.array_equal(np.asarray(written.convert('RGB')), np.asarray(image))


def test_image_explanation_save(tmp_path):
    """ImageExplanation.save(path.png): the heatmap at path and <stem>_overlay.png beside it."""
    relevance = torch.zeros(2, 8, 8)
    relevance[1, 2, 3] = 5.0
    relevance[1, 6, 1] = -5.0
    explanation = ImageExplanation(
        relevance=relevance,
        pixel_relevance=relevance[:, None],
        target=torch.tensor([0, 1]),
        logit=torch.ones(2),
        pixels=torch.rand(2, 1, 8, 8),
    )
    heat, over = explanation.save(tmp_path / 'sub' / 'cat.png', row=1, scale=2)
    assert (heat.name, over.name) == ('cat.png', 'cat_overlay.png') and heat.parent == over.parent
    with Image.open(heat) as image:
        assert image.size == (16, 16)
        assert image.getpixel((6, 4)) == POSITIVE and image.getpixel((2, 12)) == NEGATIVE
        assert image.getpixel((0, 0)) == NEUTRAL
    with Image.open(over) as image:
        assert image.size == (16, 16)
    assert explanation.save(tmp_path / 'row0.png')[0].exists()
    with pytest.raises(ValueError, match='.png'):
        explanation.save(tmp_path / 'cat.pdf')
    with pytest.raises(IndexError, match='out of range'):
        explanation.save(tmp_path / 'cat.png', row=2)
    with pytest.raises(TypeError, match='unknown option'):
        explanation.save(tmp_path / 'cat.png', colour='red')
    with pytest.raises(ValueError, match='is a directory'):
        explanation.save(tmp_path / 'sub')
    (tmp_path / 'taken_overlay.png').mkdir()  # the overlay's place is checked before anything is written
    with pytest.raises(ValueError, match='taken_overlay.png.*is a directory'):
        explanation.save(tmp_path / 'taken.png')
    assert not (tmp_path / 'taken.png').exists()
