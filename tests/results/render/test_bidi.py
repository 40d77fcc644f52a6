"""Right-to-left text and bidirectional controls in the views, laid out by a real browser: in the plain
``token[relevance]`` text each value stands right of its own token (not of the next Hebrew or Arabic token), and a
token holding a right-to-left override does not turn the tokens after it around; control characters never reach a
terminal raw."""

from __future__ import annotations

import html
import io

import torch

from zennit_attn import Explanation
from zennit_attn.results.render.terminal import render_terminal

#: Latin, Hebrew ('shalom', 'olam'), Arabic ('marhaba') and Latin tokens
TOKENS = [
    'The',
    ' word',
    ' \u05e9\u05dc\u05d5\u05dd',
    ' \u05e2\u05d5\u05dc\u05dd',
    ' \u0645\u0631\u062d\u0628\u0627',
    ' end',
]
VALUES = [0.5, -1.0, 2.0, -3.0, 4.0, 0.25]

#: the left and right edge of every character of the first text node of an element
_EDGES = """(selector) => {
  const node = document.querySelector(selector).firstChild; const out = [];
  for (let i = 0; i < node.length; i++) {
    const range = document.createRange(); range.setStart(node, i); range.setEnd(node, i + 1);
    const box = range.getBoundingClientRect(); out.push([box.left, box.right]);
  }
  return out;
}"""


class _Tokenizer:
    """One text per id (ids 4, 5, ...: ``texts``)."""

    all_special_ids: list[int] = []

    def __init__(self, texts: list[str]):
        self.texts = dict(enumerate(texts, 4)) | {3: 'x'}

    def decode(self, ids, **kwargs):
        return ''.join(self.texts[int(token)] for token in ids)


def _explanation(texts: list[str], values: list[float]) -> Explanation:
    return Explanation(
        relevance=torch.tensor([values], dtype=torch.float64),
        embedding_relevance=None,
        target=torch.tensor([3]),
        logit=torch.tensor([1.0]),
        position=torch.tensor([len(texts) - 1]),
        input_ids=torch.arange(4, 4 + len(texts))[None],
        tokenizer=_Tokenizer(texts),
    )


def test_plain_values_stand_right_of_their_own_right_to_left_tokens(browser):
    text = render_terminal(TOKENS, VALUES, color=False)
    stream = io.StringIO()
    _explanation(TOKENS, VALUES).show(color=False, stream=stream)
    assert stream.getvalue().splitlines()[1] == text
    page = browser.new_page()
    page.set_content(f'<meta charset="utf-8"><pre style="font-size: 20px">{html.escape(text)}</pre>')
    edges = page.evaluate(_EDGES, 'pre')
    page.close()
    shown = []  # (token's characters, its value's characters): their indices in the text
    start = 0
    for _ in VALUES:
        opening = text.index('[', start)
        closing = text.index(']', opening)
        shown.append((range(start, opening), range(opening, closing + 1)))
        start = closing + 1
    for number, (token, value) in enumerate(shown):
        letters = [index for index in token if text[index] not in ' \u2068\u2069']
        token_right = max(edges[index][1] for index in letters)
        value_left, value_right = min(edges[index][0] for index in value), max(edges[index][1] for index in value)
        # before: a Hebrew or Arabic token's value stood left of it, right of the token laid out before it
        assert token_right <= value_left + 0.5, (number, text)
        assert value_left - token_right < 1.0, (number, text)  # adjacent: 'token[value]'
        if number + 1 < len(shown):
            following = [index for index in shown[number + 1][0] if text[index] not in ' \u2068\u2069']
            assert value_right <= min(edges[index][0] for index in following) + 0.5, (number, text)


def test_an_override_token_does_not_turn_the_following_tokens_around(browser):
    texts = ['The', ' \u202e', ' bear', ' lives']
    explanation = _explanation(texts, [1.0, 0.0, -1.0, 0.5])
    page = browser.new_page()
    page.set_content(explanation.to_html())
    lefts = page.evaluate(
        "() => Array.from(document.querySelectorAll('.za-tokens .za-t')).map(s => s.getBoundingClientRect().left)"
    )
    bear = page.evaluate(_EDGES, '.za-tokens .za-t[data-i="2"]')
    page.close()
    assert lefts == sorted(lefts)  # before: the boxes after the override were laid out from right to left
    assert [left for left, _ in bear] == sorted(left for left, _ in bear)  # 'bear', not 'raeb'


def test_control_characters_do_not_reach_the_terminal():
    explanation = _explanation(['a', ' \x9b31m', ' \u202eb'], [1.0, -1.0, 0.5])
    for color in (False, True):
        stream = io.StringIO()
        explanation.show(color=color, stream=stream)
        out = stream.getvalue()
        assert '\x9b' not in out and '\u202e' not in out  # before: the C1 CSI and the override were printed raw
        assert '<U+009B>31m' in out and '<U+202E>b' in out
