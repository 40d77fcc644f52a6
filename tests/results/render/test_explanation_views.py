"""Explanation.tokens/show/to_html/save: every format decodes and shows the right tokens in the right colours."""

from __future__ import annotations

import dataclasses
import io
import re
import subprocess
import xml.etree.ElementTree as ElementTree

import numpy as np
import pypdf
import pytest
import torch
from PIL import Image

from tests.models import tiny_model
from tests.results.render.conftest import compile_latex
from zennit_attn import Explanation, explain
from zennit_attn.results.render import shared_scale
from zennit_attn.results.render.colors import NEUTRAL, POSITIVE, hex_rgb, relevance_to_rgb
from zennit_attn.results.render.figure import render_figure
from zennit_attn.results.render.layout import resolve_scales
from zennit_attn.results.render.tokens import token_texts

TEXT = 'The ice bear lives in the Arctic, the polar bear lives in the north.\nCaf\u00e9 au lait'
TEXTS = [TEXT, 'The ice bear lives in the']


@pytest.fixture(scope='module')
def batch(llama, tokenizer):
    """Two texts, the second padded on the right, explained together (sdpa: float64 eager + padding gives NaN)."""
    model = tiny_model('llama', attn_implementation='sdpa')
    return explain(model, TEXTS, tokenizer=tokenizer)


@pytest.fixture(scope='module')
def single(llama, tokenizer):
    return explain(llama, TEXT, tokenizer=tokenizer)


def test_tokens_are_decoded_without_padding(batch, tokenizer):
    ids = tokenizer(TEXTS[1]).input_ids
    assert batch.attention_mask[1].sum() == len(ids) < batch.input_ids.shape[1]
    assert batch.tokens(row=1) == token_texts(tokenizer, ids) == ['The', ' ice', ' bear', ' lives', ' in', ' the']
    assert batch.tokens(row=-1) == batch.tokens(row=1)
    assert batch.tokens(row=0, words=True)[:3] == ['The', ' ice', ' bear']
    assert 'Caf\u00e9' in batch.tokens(row=0, words=True)
    assert batch.tokens(tokenizer, row=0) == batch.tokens(row=0)
    with pytest.raises(IndexError, match='row 2 is out of range'):
        batch.tokens(row=2)
    bare = Explanation(
        relevance=batch.relevance,
        embedding_relevance=None,
        target=batch.target,
        logit=batch.logit,
        position=batch.position,
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
    )
    field = next(field for field in dataclasses.fields(Explanation) if field.name == 'tokenizer')
    assert bare.tokenizer is None and field.compare is False and field.repr is False
    assert 'tokenizer' not in repr(batch)
    with pytest.raises(ValueError, match='tokenizer='):
        bare.tokens()
    with pytest.raises(ValueError, match='tokenizer='):
        bare.save('unused.html')
    assert bare._repr_html_() is None


def test_encoder_decoder_shows_both(tokenizer):
    model = tiny_model('t5')
    decoder = torch.tensor([[0, 16, 30]])
    explanation = explain(model, 'The ice bear lives', tokenizer=tokenizer, decoder_input_ids=decoder)
    tokens = explanation.tokens()
    encoder = token_texts(tokenizer, explanation.input_ids[0].tolist())
    assert tokens == encoder + token_texts(tokenizer, decoder[0].tolist())
    page = explanation.to_html()
    assert page.count('class="za-label"') == 2 and '>encoder</div>' in page and '>decoder</div>' in page
    assert 'decoder position 2' in page


def test_show_prints_a_heatmap(single, capsys):
    single.show(color=False)
    out = capsys.readouterr().out
    values = single.relevance[0].tolist()
    assert out.startswith('row 0: target token ')
    assert f'The[{values[0]:+.3g}] ice[{values[1]:+.3g}]' in out
    single.show(color=True, words=True)
    out = capsys.readouterr().out
    top = int(single.relevance[0].argmax())
    assert '\x1b[48;2;{};{};{}m'.format(*POSITIVE) in out  # the most relevant word is fully red
    assert 'colour scale: blue' in out
    stream = io.StringIO()
    single.show(color=False, stream=stream)
    assert stream.getvalue().startswith('row 0:') and top >= 0
    with pytest.raises(ValueError, match="'shared'"):
        single.show(scale='largest')


def test_html_has_one_heatmap_per_row_and_shared_scales(batch):
    page = batch.to_html()
    assert page.startswith('<!DOCTYPE html>') and '<script' not in page
    assert page.count('class="za-heatmap"') == 2
    spans = re.findall(r'<span class="za-t"', page)
    assert len(spans) == int(batch.attention_mask.sum())  # padding is not shown
    legends = re.findall(r'class="za-lo">([^<]*)<', page)
    assert len(legends) == 2 and legends[0] != legends[1]
    shared = re.findall(r'class="za-lo">([^<]*)<', batch.to_html(scale='shared'))
    largest = float(batch.relevance.abs().max())
    assert shared == [f'{-largest:+.4g}'] * 2
    assert batch.to_html(rows=1).count('class="za-heatmap"') == 1
    fragment = batch._repr_html_()
    assert fragment.startswith('<div class="za">') and '<html' not in fragment


def test_shared_scale_across_explanations(single, batch):
    scale = shared_scale(single, batch)
    assert scale == max(float(single.relevance.abs().max()), float(batch.relevance.abs().max()))
    page = single.to_html(scale=scale)
    assert f'class="za-hi">{scale:+.4g}<' in page


def test_png_has_the_most_relevant_token_reddest(single, tmp_path):
    """The PNG written by save() is the figure whose token boxes render_figure reports; the reddest pixel lies in
    the box of the most relevant token, whose colour is the saturated end of the map."""
    path = single.save(tmp_path / 'fig.png', dpi=144)
    heatmaps = single.heatmaps([0])
    resolve_scales(heatmaps)
    figure, boxes = render_figure(heatmaps)
    buffer = io.BytesIO()
    figure.savefig(buffer, format='png', dpi=144, facecolor='white')
    with Image.open(path) as image, Image.open(buffer) as expected:
        assert image.format == 'PNG'
        pixels = np.asarray(image.convert('RGB')).astype(int)
        assert np.array_equal(pixels, np.asarray(expected.convert('RGB')).astype(int))
    values = single.relevance[0].tolist()
    top = int(np.argmax(values))
    assert len(boxes) == len(values)
    box = boxes[top]
    assert box.color == hex_rgb(POSITIVE)
    redness = pixels[..., 0] - pixels[..., 1:].max(-1)
    y, x = np.unravel_index(np.argmax(redness), redness.shape)
    scale = 144 / 72
    assert box.x0 * scale - 1 <= x <= box.x1 * scale + 1 and box.y0 * scale - 1 <= y <= box.y1 * scale + 1
    inside = pixels[int((box.y0 + 0.6) * scale), int((box.x0 + 0.6) * scale)]
    assert tuple(inside) == POSITIVE
    # every token box has the colour of its relevance
    for box, value in zip(boxes, values):
        assert box.color == hex_rgb(relevance_to_rgb(value, max(abs(v) for v in values)))


def test_svg_and_pdf_decode(single, tmp_path):
    svg = single.save(tmp_path / 'fig.svg')
    root = ElementTree.parse(svg).getroot()
    assert root.tag.endswith('svg') and float(root.get('width').rstrip('pt')) == pytest.approx(540)
    text = svg.read_text()
    assert hex_rgb(POSITIVE) in text and hex_rgb(NEUTRAL) in text
    pdf = single.save(tmp_path / 'fig.pdf')
    reader = pypdf.PdfReader(pdf)
    assert len(reader.pages) == 1
    content = reader.pages[0].extract_text()
    assert 'ice' in content and 'Arctic' in content and 'target token' in content
    assert float(reader.pages[0].mediabox.width) == pytest.approx(540)


def test_pdf_shows_the_colours(single, tmp_path, pdftoppm):
    pdf = single.save(tmp_path / 'fig.pdf')
    subprocess.run(
        [pdftoppm, '-png', '-r', '72', '-singlefile', str(pdf), str(tmp_path / 'page')], check=True, timeout=60
    )
    with Image.open(tmp_path / 'page.png') as image:
        colours = {
            tuple(int(channel) for channel in pixel) for pixel in np.asarray(image.convert('RGB')).reshape(-1, 3)
        }
    assert any(max(abs(a - b) for a, b in zip(colour, POSITIVE)) <= 2 for colour in colours)
    assert any(max(abs(a - b) for a, b in zip(colour, NEUTRAL)) <= 2 for colour in colours)


def test_tex_snippet(single, tmp_path):
    path = single.save(tmp_path / 'fig.tex', words=True)
    snippet = path.read_text(encoding='utf-8')
    assert '\\usepackage{xcolor}' in snippet.splitlines()[0]  # says what it needs
    assert snippet.count('\\zatoken{') == len(single.tokens(words=True))
    assert "Caf\\'{e}" in snippet  # é as an accent command
    red = ','.join(f'{channel / 255:.3f}' for channel in POSITIVE)
    assert f'\\zatoken{{{red}}}' in snippet
    document = single.save(tmp_path / 'doc.tex', document=True).read_text(encoding='utf-8')
    assert document.startswith('\\documentclass') and document.rstrip().endswith('\\end{document}')


def test_tex_snippet_compiles(single, tmp_path, tex_engine):
    single.save(tmp_path / 'snippet.tex')
    hostile = Explanation(
        relevance=torch.tensor([[1.0, -2.0, 0.5, 0.0, 3.0, -1.0]]),
        embedding_relevance=None,
        target=torch.tensor([3]),
        logit=torch.tensor([1.0]),
        position=torch.tensor([5]),
        input_ids=torch.tensor([[4, 5, 6, 7, 8, 9]]),
    )

    class Tokenizer:  # TeX's special characters, a line break, an emoji, spaces
        texts = {
            4: '$x_1^2 & 50% #1',
            5: ' {a}~\\b',
            6: '\n',
            7: ' \U0001f43b',
            8: '  ',
            9: ' \u00fc\u00df\u00e5\u2013',
        }
        all_special_ids = []

        def decode(self, ids, **kwargs):
            return ''.join(self.texts.get(int(token), '?') for token in ids)

    hostile.save(tmp_path / 'hostile.tex', tokenizer=Tokenizer())
    result = compile_latex(tex_engine, tmp_path, 'snippet.tex', 'hostile.tex')
    assert result.returncode == 0, result.stdout[-3000:]
    reader = pypdf.PdfReader(tmp_path / 'main.pdf')
    content = reader.pages[0].extract_text()
    assert 'Arctic' in content and 'lives' in content
    assert '50%' in content and '#1' in content


def test_bad_paths_and_options(single, tmp_path):
    with pytest.raises(ValueError, match=r'\.html, \.png, \.svg, \.pdf, \.tex'):
        single.save(tmp_path / 'fig.jpeg')
    with pytest.raises(ValueError, match='suffix'):
        single.save(tmp_path / 'fig')
    with pytest.raises(ValueError, match='is a directory; give a file name such as'):
        single.save(tmp_path)
    blocker = tmp_path / 'file'
    blocker.write_text('x')
    with pytest.raises(ValueError, match='is a file, not a folder'):
        single.save(blocker / 'fig.png')
    with pytest.raises(TypeError, match='takes no option'):
        single.save(tmp_path / 'fig.html', dpi=3)
    with pytest.raises(IndexError):
        single.save(tmp_path / 'fig.html', row=1)
    path = single.save(tmp_path / 'new' / 'folder' / 'fig.HTML')
    assert path.exists() and path.read_text(encoding='utf-8').startswith('<!DOCTYPE html>')


def test_non_finite_relevance_is_shown_neutral_with_a_warning(tokenizer):
    explanation = Explanation(
        relevance=torch.tensor([[1.0, float('nan'), -2.0]]),
        embedding_relevance=None,
        target=torch.tensor([5]),
        logit=torch.tensor([1.0]),
        position=torch.tensor([2]),
        input_ids=torch.tensor([[59, 75, 49]]),
        tokenizer=tokenizer,
    )
    with pytest.warns(RuntimeWarning, match='1 non-finite'):
        page = explanation.to_html()
    backgrounds = re.findall(r'style="background: (rgb\([^)]*\))', page)
    assert backgrounds[1] == 'rgb({}, {}, {})'.format(*NEUTRAL)
    assert backgrounds[2] == 'rgb({}, {}, {})'.format(*relevance_to_rgb(-1.0, 1.0))
