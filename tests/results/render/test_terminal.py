"""Terminal output: 24-bit colour boxes or plain ``token[relevance]`` text, and when colour is used."""

from __future__ import annotations

import io

import pytest
import torch

from zennit_attn.results.render.colors import NEGATIVE, NEUTRAL, POSITIVE, relevance_to_rgb
from zennit_attn.results.render.layout import Heatmap, Segment
from zennit_attn.results.render.terminal import render_terminal, terminal_heatmap, use_color

ESC = '\x1b'
TOKENS = ['The', ' E', 'iffel', ' Tower', '\n', ' of']
VALUES = [-1.5, 0.25, 3.0, 0.0, 0.75, -3.0]


class FakeStream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


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
    with pytest.raises(ValueError, match='2 tokens but 3'):
        render_terminal(['a', 'b'], torch.zeros(3))
    with pytest.raises(ValueError, match=r'one row \[seq\], got shape \(2, 2\)'):
        render_terminal(['a', 'b'], torch.zeros(2, 2))


def test_terminal_heatmap_has_caption_labels_and_scale():
    heatmap = Heatmap(
        [Segment(['a', ' b'], [2.0, -1.0], label='encoder'), Segment(['c'], [0.5], label='decoder')],
        title='row 0: target token',
        scale=4.0,
    )
    assert terminal_heatmap(heatmap, color=False) == 'row 0: target token\nencoder: a[+2] b[-1]\ndecoder: c[+0.5]'
    lines = terminal_heatmap(heatmap, color=True).split('\n')
    assert lines[0] == 'row 0: target token' and lines[1].startswith('encoder: ')
    assert '{}[48;2;{};{};{}m'.format(ESC, *relevance_to_rgb(0.5, 1.0)) in lines[1]  # 2 of the scale 4
    assert lines[-1] == 'colour scale: blue -4 .. grey 0 .. red +4'
