"""The heatmap renderers: colour scale, terminal output (colour and plain) and HTML output."""
from __future__ import annotations

import html
import io
import math
import re
from types import SimpleNamespace

import pytest
import torch

from zennit_attn.render.colors import LEVELS, color_table, luminance, oklab, relevance_level
from zennit_attn.render.text import (
    NEGATIVE, NEUTRAL, POSITIVE, display_token, format_relevance, from_explanation, relevance_to_rgb, render_html,
    render_terminal, text_color, use_color, write_html,
)

ESC = '\x1b'
TOKENS = ['The', ' E', 'iffel', ' Tower', '\n', ' of']
VALUES = [-1.5, 0.25, 3.0, 0.0, 0.75, -3.0]


class FakeStream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


# colour scale ---------------------------------------------------------------------------------------------------

def _chroma(rgb):
    _, a, b = oklab(rgb)
    return math.hypot(a, b)


@pytest.mark.parametrize('scale', [1.0, 3.0, 0.02, 250.0])
def test_colour_scale_fixed_points(scale):
    assert relevance_to_rgb(0.0, scale) == NEUTRAL
    assert relevance_to_rgb(scale, scale) == POSITIVE
    assert relevance_to_rgb(-scale, scale) == NEGATIVE
    assert relevance_to_rgb(scale / 2, scale) == color_table()[LEVELS + 128]  # 127.5 rounds away from 0
    assert relevance_to_rgb(-scale / 2, scale) == color_table()[LEVELS - 128]
    # red side and blue side, grey in the middle
    r, g, b = POSITIVE
    assert r > 150 and r > 3 * g and r > 3 * b
    r, g, b = NEGATIVE
    assert b > 150 and b > 2 * r and b > g
    assert NEUTRAL[0] == NEUTRAL[1] == NEUTRAL[2]


def test_colour_scale_symmetric_and_perceptually_even():
    """v and -v have the same OKLab lightness and chroma; lightness falls and chroma rises evenly with |v|."""
    previous = None
    for step in range(0, 101):
        value = step / 100
        plus, minus = relevance_to_rgb(value, 1.0), relevance_to_rgb(-value, 1.0)
        assert abs(oklab(plus)[0] - oklab(minus)[0]) < 0.006
        assert abs(_chroma(plus) - _chroma(minus)) < 0.015
        lightness = oklab(plus)[0]
        expected = 0.95 + (0.52 - 0.95) * value  # a straight line in OKLab
        assert abs(lightness - expected) < 0.01
        if previous is not None:
            assert lightness <= previous + 1e-3
        previous = lightness
    assert len(color_table()) == 2 * LEVELS + 1


def test_colour_scale_is_legible_on_light_and_dark_pages():
    """Both ends take white text with WCAG contrast above 4.5, the neutral grey takes black text above 7, and the
    grey stands out from a white and from a dark page."""
    def contrast(first, second):
        high, low = sorted([luminance(first), luminance(second)], reverse=True)
        return (high + 0.05) / (low + 0.05)

    for end in (POSITIVE, NEGATIVE):
        assert text_color(end) == (255, 255, 255) and contrast(end, (255, 255, 255)) > 4.5
        assert contrast(end, (22, 24, 28)) > 2.5  # visible as a box on a dark page
    assert text_color(NEUTRAL) == (0, 0, 0) and contrast(NEUTRAL, (0, 0, 0)) > 7
    assert NEUTRAL != (255, 255, 255) and contrast(NEUTRAL, (22, 24, 28)) > 10


def test_colour_scale_clips_and_degenerate_scales():
    assert relevance_to_rgb(7.0, 2.0) == POSITIVE
    assert relevance_to_rgb(-7.0, 2.0) == NEGATIVE
    assert relevance_to_rgb(float('inf'), 2.0) == POSITIVE
    assert relevance_to_rgb(float('nan'), 2.0) == NEUTRAL
    assert relevance_to_rgb(0.0, 0.0) == NEUTRAL
    assert relevance_to_rgb(1.0, 0.0) == NEUTRAL
    assert relevance_to_rgb(1.0, float('nan')) == NEUTRAL
    assert relevance_level(0.5, 1.0) == 128 and relevance_level(-0.5, 1.0) == -128


def test_text_colour_contrast():
    assert text_color((255, 255, 255)) == (0, 0, 0)
    assert text_color((0, 0, 255)) == (255, 255, 255)
    assert text_color((0, 0, 0)) == (255, 255, 255)
    assert text_color((255, 230, 230)) == (0, 0, 0)


def test_display_token():
    assert display_token(' Tower') == ' Tower'
    assert display_token('\n') == '\u23ce'
    assert display_token('a\tb\r') == 'a\u21e5b\u240d'
    assert display_token(ESC + '[31m') == '\u241b[31m'
    assert display_token('') == '\u2205'
    assert display_token('  ') == '\u2423\u2423'


# terminal -------------------------------------------------------------------------------------------------------

def _ansi(background, foreground, text):
    return '{}[48;2;{};{};{}m{}[38;2;{};{};{}m{}{}[0m'.format(ESC, *background, ESC, *foreground, text, ESC)


def test_terminal_colour_mode_has_escape_codes():
    text = render_terminal(TOKENS, torch.tensor(VALUES), color=True)
    # every token opens a background and a foreground colour and resets after itself
    assert text.count(f'{ESC}[48;2;') == len(TOKENS)
    assert text.count(f'{ESC}[38;2;') == len(TOKENS)
    assert text.count(f'{ESC}[0m') == len(TOKENS)
    # the row is normalised by max |R| = 3: 'iffel' saturated red, ' of' saturated blue (white text on both),
    # ' Tower' neutral grey with black text; leading spaces stay outside the coloured box
    assert _ansi(POSITIVE, (255, 255, 255), 'iffel') in text
    assert ' ' + _ansi(NEGATIVE, (255, 255, 255), 'of') in text
    assert ' ' + _ansi(NEUTRAL, (0, 0, 0), 'Tower') in text
    # -1.5 is half of the scale
    assert '{}[48;2;{};{};{}m'.format(ESC, *relevance_to_rgb(-1.5, 3.0)) in text
    # a newline token is shown and also breaks the line
    assert '\u23ce' + f'{ESC}[0m\n' in text


def test_terminal_scale_override():
    text = render_terminal(['a'], [1.0], color=True, scale=2.0)
    assert '{}[48;2;{};{};{}m'.format(ESC, *relevance_to_rgb(0.5, 1.0)) in text
    with pytest.raises(ValueError, match='positive finite'):
        render_terminal(['a'], [1.0], color=True, scale=-1.0)


def test_terminal_plain_mode_has_no_escape_codes():
    text = render_terminal(TOKENS + [ESC + '[2J'], VALUES + [0.5], color=False)
    assert ESC not in text
    assert text.startswith('The[-1.5] E[+0.25]iffel[+3] Tower[+0]\u23ce[+0.75] of[-3]')
    assert '\n' not in text


def test_terminal_auto_colour(monkeypatch):
    monkeypatch.delenv('NO_COLOR', raising=False)
    monkeypatch.setenv('TERM', 'xterm-256color')
    assert use_color(None, FakeStream(tty=True)) is True
    assert use_color(None, FakeStream(tty=False)) is False
    assert ESC in render_terminal(TOKENS, VALUES, stream=FakeStream(tty=True))
    assert ESC not in render_terminal(TOKENS, VALUES, stream=FakeStream(tty=False))
    monkeypatch.setenv('NO_COLOR', '1')
    assert use_color(None, FakeStream(tty=True)) is False
    assert ESC not in render_terminal(TOKENS, VALUES, stream=FakeStream(tty=True))
    # forcing wins over NO_COLOR and over a non-terminal stream
    assert use_color(True, FakeStream(tty=False)) is True
    assert ESC in render_terminal(TOKENS, VALUES, color=True, stream=FakeStream(tty=False))
    monkeypatch.setenv('NO_COLOR', '')
    assert use_color(None, FakeStream(tty=True)) is True


def test_escape_in_token_cannot_inject_terminal_codes():
    text = render_terminal([ESC + '[2J'], [1.0], color=True)
    assert f'{ESC}[2J' not in text
    assert '\u241b[2J' in text


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match='2 tokens but 3'):
        render_terminal(['a', 'b'], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        render_html(['a', 'b'], torch.zeros(3))
    with pytest.raises(ValueError):
        render_html(['a', 'b'], torch.zeros(2, 2))


# HTML -----------------------------------------------------------------------------------------------------------

def _spans(page: str) -> list[tuple[str, str, str, str]]:
    """(leading spaces, background, tooltip, shown text) of every token box."""
    return re.findall(r'( *)<span class="za-t[^"]*" data-i="\d+"[^>]*? style="background: (rgb\([^)]*\));[^"]*" '
                      r'title="([^"]*)">([^<]*)</span>', page)


def test_html_escapes_tokens_and_text():
    page = render_html(['<script>alert(1)</script>', ' & "x"'], [1.0, -1.0], title='<b>t</b>',
                       subtitle='<i>s</i>', target='<script>', logit=1.5)
    assert '<script' not in page
    assert '&lt;script&gt;alert(1)&lt;/script&gt;' in page
    assert '&amp; &quot;x&quot;' in page
    assert '<b>' not in page and '<i>' not in page
    assert '&lt;b&gt;t&lt;/b&gt;' in page


def test_html_tooltips_carry_each_relevance():
    values = [0.123456, -2.5, 0.0, 1e-5, 42.0]
    tokens = ['a', ' b', 'c', ' d', '\n']
    page = render_html(tokens, torch.tensor(values, dtype=torch.float64))
    spans = _spans(page)
    assert len(spans) == len(tokens)
    expected = ['+0.1235', '-2.5', '+0', '+1e-05', '+42']
    for position, ((lead, background, title, text), value, token, shown) in enumerate(
            zip(spans, values, tokens, expected)):
        assert html.unescape(title) == f'position {position} {display_token(token)!r}: relevance {shown}'
        assert format_relevance(value) == shown
        assert lead + html.unescape(text) == display_token(token)  # the space sits before the box
        assert background == 'rgb({}, {}, {})'.format(*relevance_to_rgb(value, 42.0))
    assert '\u23ce</span><br>' in page


def test_html_header_legend_and_standalone():
    page = render_html(TOKENS, VALUES, title='Why Paris', subtitle='SmolLM2', target=' Paris', logit=12.84185)
    assert page.startswith('<!DOCTYPE html>')
    assert '<style>' in page and 'prefers-color-scheme: dark' in page
    assert '<h1>Why Paris</h1>' in page
    assert 'SmolLM2' in page
    assert '&#x27; Paris&#x27;' in page
    assert '12.8419' in page
    stops = re.search(r'linear-gradient\(to right, ([^)]*\)(?:, rgb\([^)]*\))*)\)', page).group(1)
    assert stops.startswith('rgb({}, {}, {})'.format(*NEGATIVE)) and stops.endswith('rgb({}, {}, {})'.format(*POSITIVE))
    assert 'rgb({}, {}, {})'.format(*NEUTRAL) in stops
    assert '>-3</span>' in page and '>+3</span>' in page
    assert 'white-space: pre-wrap' in page  # leading spaces of tokens stay visible
    assert not re.search(r'(src|href)=', page)
    assert '<script' not in page


def test_write_html(tmp_path):
    path = write_html(tmp_path / 'out.html', TOKENS, VALUES, target=' Paris', logit=1.0)
    assert path == tmp_path / 'out.html'
    assert path.read_text(encoding='utf-8') == render_html(TOKENS, VALUES, target=' Paris', logit=1.0)


def test_from_explanation_drops_padding():
    class Tokenizer:  # a tokenizer that writes each id as <id>
        def decode(self, ids):
            return ''.join(f'<{token}>' for token in ids)

    explanation = SimpleNamespace(
        input_ids=torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]]),
        relevance=torch.tensor([[0.0, 0.0, 1.0, -1.0], [1.0, 2.0, 3.0, 4.0]]),
        attention_mask=torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]),
    )
    tokens, relevance = from_explanation(explanation, Tokenizer(), row=0)
    assert tokens == ['<5>', '<6>']
    assert relevance.tolist() == [1.0, -1.0]
    tokens, relevance = from_explanation(explanation, Tokenizer(), row=1)
    assert tokens == ['<7>', '<8>', '<9>', '<10>']
