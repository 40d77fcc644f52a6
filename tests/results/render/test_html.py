"""The HTML page and Jupyter fragment of token heatmaps (what ``Explanation.to_html`` and ``save('*.html')`` write):
escaping, one coloured box with a tooltip per token, header, legend, nothing loaded from elsewhere."""

from __future__ import annotations

import html
import re

import pytest

from zennit_attn.results.render.colors import NEGATIVE, NEUTRAL, POSITIVE, relevance_to_rgb
from zennit_attn.results.render.layout import Heatmap, Segment, format_relevance
from zennit_attn.results.render.tokens import display_token
from zennit_attn.results.render.views import heatmaps_html

TOKENS = ['The', ' E', 'iffel', ' Tower', '\n', ' of']
VALUES = [-1.5, 0.25, 3.0, 0.0, 0.75, -3.0]


def _spans(page: str) -> list[tuple[str, str, str, str]]:
    """(leading spaces, background, tooltip, shown text) of every token box."""
    return re.findall(
        r'( *)<span class="za-t[^"]*" data-i="\d+"[^>]*? style="background: (rgb\([^)]*\));[^"]*" '
        r'title="([^"]*)">([^<]*)</span>',
        page,
    )


def test_html_escapes_tokens_and_text():
    heatmap = Heatmap(
        [Segment(['<script>alert(1)</script>', ' & "x"'], [1.0, -1.0], label='<u>l</u>')],
        title='explained token <script>',
    )
    for document in (
        heatmaps_html([heatmap], title='<b>t</b>', subtitle='<i>s</i>'),
        heatmaps_html([heatmap], title='<b>t</b>', subtitle='<i>s</i>', standalone=False),
    ):
        assert '<script' not in document
        assert '&lt;script&gt;alert(1)&lt;/script&gt;' in document
        assert '&amp; &quot;x&quot;' in document
        assert '<b>' not in document and '<i>' not in document and '<u>' not in document
        assert '&lt;b&gt;t&lt;/b&gt;' in document and '&lt;i&gt;s&lt;/i&gt;' in document
        assert 'explained token &lt;script&gt;' in document and '&lt;u&gt;l&lt;/u&gt;' in document


def test_html_tooltips_carry_each_relevance():
    values = [0.123456, -2.5, 0.0, 1e-5, 42.0]
    tokens = ['a', ' b', 'c', ' d', '\n']
    page = heatmaps_html([Heatmap([Segment(tokens, values)])])
    spans = _spans(page)
    assert len(spans) == len(tokens)
    expected = ['+0.1235', '-2.5', '+0', '+1e-05', '+42']
    for position, ((lead, background, title, text), value, token, shown) in enumerate(
        zip(spans, values, tokens, expected)
    ):
        assert html.unescape(title) == f'position {position} {display_token(token)!r}: relevance {shown}'
        assert format_relevance(value) == shown
        assert lead + html.unescape(text) == display_token(token)  # the space sits before the box
        assert background == 'rgb({}, {}, {})'.format(*relevance_to_rgb(value, 42.0))
    assert '\u23ce</span><br>' in page


def test_html_header_legend_and_standalone():
    heatmap = Heatmap([Segment(TOKENS, VALUES)], title="explained token ' Paris', logit 12.8419")
    page = heatmaps_html([heatmap], title='Why Paris', subtitle='SmolLM2')
    assert page.startswith('<!DOCTYPE html>')
    assert '<title>Why Paris</title>' in page
    assert '<style>' in page and 'prefers-color-scheme: dark' in page
    assert '<h1>Why Paris</h1>' in page
    assert '<p class="za-sub">SmolLM2</p>' in page
    assert '<div class="za-caption">explained token &#x27; Paris&#x27;, logit 12.8419</div>' in page
    stops = re.search(r'linear-gradient\(to right, ([^)]*\)(?:, rgb\([^)]*\))*)\)', page).group(1)
    assert stops.startswith('rgb({}, {}, {})'.format(*NEGATIVE)) and stops.endswith('rgb({}, {}, {})'.format(*POSITIVE))
    assert 'rgb({}, {}, {})'.format(*NEUTRAL) in stops
    assert '>-3</span>' in page and '>+3</span>' in page  # the legend runs from -max |R| to +max |R|
    assert '6 tokens, relevance sum -0.5;' in page
    assert 'white-space: pre-wrap' in page  # leading spaces of tokens stay visible
    assert not re.search(r'(src|href)=', page)
    assert '<script' not in page
    assert heatmaps_html([heatmap]).count('<title>Token relevance</title>') == 1  # the default title


def test_html_fragment_for_jupyter_and_scales():
    heatmaps = [Heatmap([Segment(TOKENS, VALUES)]), Heatmap([Segment(['a'], [1.0])])]
    fragment = heatmaps_html(heatmaps, standalone=False)
    assert fragment.startswith('<div class="za"><style>') and '<html' not in fragment and '<h1>' not in fragment
    assert re.findall(r'class="za-hi">([^<]*)<', fragment) == ['+3', '+1']  # each its own largest |R|
    shared = heatmaps_html(heatmaps, scale='shared', standalone=False)
    assert re.findall(r'class="za-hi">([^<]*)<', shared) == ['+3', '+3']
    assert _spans(shared)[-1][1] == 'rgb({}, {}, {})'.format(*relevance_to_rgb(1.0, 3.0))
    fixed = heatmaps_html(heatmaps, scale=0.5, standalone=False)
    assert re.findall(r'class="za-hi">([^<]*)<', fixed) == ['+0.5', '+0.5']
    with pytest.raises(ValueError, match="'shared'"):
        heatmaps_html(heatmaps, scale='largest')
