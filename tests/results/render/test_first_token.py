"""The first token's share of the relevance (an attention sink) and heatmaps that leave it out of the colour scale."""

from __future__ import annotations

import io
import math
import re

import pytest
import torch

from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import Explanation
from zennit_attn.results.render.colors import POSITIVE, css_rgb, relevance_to_rgb
from zennit_attn.results.render.layout import Heatmap, Segment, resolve_scales
from zennit_attn.results.segments import first_token_share

TEXTS = ['The ice bear lives', 'The ice']


@pytest.fixture(scope='module')
def explanation():
    tokenizer = byte_level_tokenizer()
    encoding = tokenizer(TEXTS, padding=True, return_tensors='pt')
    assert encoding.input_ids.shape == (2, 4)
    relevance = torch.tensor([[8.0, 1.0, -2.0, 1.0], [-6.0, 3.0, 0.0, 0.0]])
    return Explanation(
        relevance=relevance,
        embedding_relevance=None,
        target=torch.tensor([0, 0]),
        logit=torch.tensor([1.0, 1.0]),
        position=torch.tensor([3, 1]),
        input_ids=encoding.input_ids,
        attention_mask=encoding.attention_mask,
        tokenizer=tokenizer,
    )


def test_first_token_share_is_its_part_of_the_absolute_relevance(explanation):
    assert explanation.first_token_share.tolist() == [8 / 12, 6 / 9]
    assert explanation.first_token_share.dtype == torch.float64
    left = torch.tensor([[0.0, 0.0, 2.0, -1.0, 1.0], [5.0, 1.0, 1.0, 1.0, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    left[1, 4] = 100.0  # padding does not count
    share = first_token_share(left, mask)
    assert share[:2].tolist() == [2 / 4, 5 / 8] and math.isnan(share[2])
    assert first_token_share(left[:2, 2:]).tolist() == [2 / 4, 1 / 102]
    with pytest.raises(ValueError, match=r'\[batch, seq\]'):
        first_token_share(left[0])


def test_resolve_scales_leaves_unscaled_tokens_out():
    heatmaps = [
        Heatmap([Segment(['a', 'b'], [10.0, -2.0]), Segment(['c'], [1.0])], unscaled={(0, 0)}),
        Heatmap([Segment(['d'], [3.0])]),
    ]
    resolve_scales(heatmaps)
    assert [heatmap.scale for heatmap in heatmaps] == [2.0, 3.0]
    resolve_scales(heatmaps, 'shared')
    assert [heatmap.scale for heatmap in heatmaps] == [3.0, 3.0]
    heatmaps[0].unscaled = set()
    resolve_scales(heatmaps, 'shared')
    assert heatmaps[0].scale == 10.0


def test_heatmaps_without_first_token_in_the_scale(explanation):
    (plain,) = explanation.heatmaps([0])
    assert plain.unscaled == set()
    resolve_scales([plain])
    assert plain.scale == 8.0
    (without,) = explanation.heatmaps([0], scale_without_first=True)
    resolve_scales([without])
    assert without.scale == 2.0 and without.unscaled == {(0, 0)}
    assert without.title.endswith("first token 'The' (+8, 66.7% of |relevance|) left out of the colour scale")
    (words,) = explanation.heatmaps([1], words=True, scale_without_first=True)
    resolve_scales([words])
    assert words.scale == 3.0 and "first word 'The' (-6, 66.7% of |relevance|)" in words.title
    with pytest.raises(TypeError, match='scale_without_first must be True or False'):
        explanation.heatmaps([0], scale_without_first=1)


def test_renderers_take_the_option(explanation, tmp_path):
    page = explanation.to_html(rows=[0], scale_without_first=True)
    colors = re.findall(r'<span class="za-t[^"]*" data-i="\d+"[^>]*style="background: (rgb\([^)]*\))', page)
    assert colors == [css_rgb(relevance_to_rgb(value, 2.0)) for value in (8.0, 1.0, -2.0, 1.0)]
    assert colors[0] == css_rgb(POSITIVE)  # clipped to full colour
    assert page.count('za-unscaled"') == 1 and 'class="za-t za-unscaled" data-i="0"' in page
    assert 'za-unscaled' not in explanation.to_html(rows=[0]).split('</style>')[-1]
    stream = io.StringIO()
    explanation.show(row=0, color=True, stream=stream, scale_without_first=True)
    assert 'colour scale: blue -2 .. grey 0 .. red +2' in stream.getvalue()
    stream = io.StringIO()
    explanation.show(row=0, color=True, stream=stream)
    assert 'colour scale: blue -8 .. grey 0 .. red +8' in stream.getvalue()
    path = explanation.save(tmp_path / 'first.tex', scale_without_first=True)
    assert 'left out of the colour scale' in path.read_text()
