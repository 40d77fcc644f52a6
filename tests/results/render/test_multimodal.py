"""Rendering of explanations with images (:py:mod:`zennit_attn.results.render.multimodal`): every format of
``Explanation.save`` shows the overlay of each image with the token heatmap; the terminal shows patch grids."""

from __future__ import annotations

import io
import re

import pytest
import torch

from tests.models import tiny_llava
from tests.processors import image, llava_processor
from zennit_attn import explain
from zennit_attn.results.render.multimodal import overlays, save_multimodal


@pytest.fixture(scope='module')
def exp():
    return explain(
        tiny_llava(zero_bias=True),
        '<image>The ice bear lives',
        images=[image()],
        processor=llava_processor(),
        method='cplrp',
        target=50,
    )


def test_terminal_shows_tokens_and_patch_grid(exp):
    stream = io.StringIO()
    exp.show(color=False, stream=stream)
    text = stream.getvalue()
    assert '[image 1]' in text and '<image>' not in text
    assert 'patch relevance, 2 x 2' in text
    stream = io.StringIO()
    exp.show(color=True, stream=stream)
    assert text.count('\n') <= stream.getvalue().count('\n') and '\x1b[48;2;' in stream.getvalue()


def test_html_has_the_overlay_and_the_tokens(exp, tmp_path):
    page = exp.to_html()
    assert page.count('data:image/png;base64,') == 1 and 'za-tokens' in page and '[image 1]' in page
    path = exp.save(tmp_path / 'out' / 'x.html', alpha=0.5)
    assert path.read_text(encoding='utf-8') == exp.to_html(alpha=0.5)
    assert exp._repr_html_().count('<img') == 1


@pytest.mark.parametrize('suffix', ['.png', '.svg', '.pdf'])
def test_figures(exp, tmp_path, suffix):
    path = exp.save(tmp_path / f'x{suffix}', width=5)
    data = path.read_bytes()
    assert len(data) > 1000
    if suffix == '.svg':
        assert b'<image' in data  # the overlay is embedded


def test_png_shows_the_overlay_above_the_tokens(exp, tmp_path):
    from PIL import Image

    with_image = Image.open(exp.save(tmp_path / 'a.png', dpi=50))
    plain = Image.open(super(type(exp), exp).save(tmp_path / 'b.png', dpi=50))
    assert with_image.height > plain.height + 50  # the picture row (110 pt) is added


def test_latex_includes_the_overlay(exp, tmp_path):
    path = exp.save(tmp_path / 'fig.tex')
    snippet = path.read_text(encoding='utf-8')
    assert r'\includegraphics[width=\linewidth]{fig_image1.png}' in snippet and r'\zatoken' in snippet
    assert (tmp_path / 'fig_image1.png').exists()
    document = exp.save(tmp_path / 'doc.tex', document=True).read_text(encoding='utf-8')
    assert r'\usepackage{graphicx}' in document and document.rstrip().endswith(r'\end{document}')


def test_bad_options(exp, tmp_path):
    with pytest.raises(TypeError, match='takes no option'):
        exp.save(tmp_path / 'x.html', width=3)
    with pytest.raises(TypeError, match=r"takes no option\(s\) \['mean'\]"):
        save_multimodal(
            [],
            [('c', torch.zeros(3, 8, 8), torch.zeros(3, 8, 8), torch.zeros(1, 1), None, None)],
            tmp_path / 'y.png',
            mean=1,
        )
    with pytest.raises(TypeError, match='unknown image option'):
        overlays([], std=1)
    with pytest.raises(ValueError, match='suffix'):
        exp.save(tmp_path / 'x.jpg')


def test_overlay_is_the_image_overlay(exp):
    """The HTML picture is render.image.overlay of the image (upscaled), not a second implementation."""
    from zennit_attn.results.render.image import overlay

    picture = exp.images[0]
    ((caption, shown),) = overlays(exp._images(0))
    direct = overlay(picture.pixels, picture.relevance, mean=picture.mean, std=picture.std, scale=12)
    assert shown.tobytes() == direct.tobytes() and re.match(r'row 0, image 1: relevance', caption)
