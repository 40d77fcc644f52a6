"""The HTML pages in a real headless browser: screenshots show the tokens in their colours (light and dark page),
and on the page of a generated answer, clicking a generated token switches the heatmap.

Set ``ZENNIT_ATTN_SCREENSHOTS=<folder>`` to keep the screenshots for a look.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.models import tiny_model
from tests.results.render.conftest import CHROMIUM_FLAGS
from zennit_attn import explain, explain_generation
from zennit_attn.results.render.colors import NEUTRAL, POSITIVE, css_rgb, relevance_to_rgb, text_color
from zennit_attn.results.render.layout import split_space

PROMPT = 'Question: where does the ice bear live? Answer:'
TEXT = 'The ice bear lives in the Arctic, the polar bear lives in the north.\nCaf\u00e9 au lait is a drink.'


def _keep(path: Path) -> None:
    folder = os.environ.get('ZENNIT_ATTN_SCREENSHOTS')
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(folder) / path.name)


@pytest.fixture(scope='module')
def generation(tokenizer):
    return explain_generation(
        tiny_model('llama'), tokenizer, PROMPT, max_new_tokens=6, generate_kwargs={'suppress_tokens': [0, 1, 2, 3]}
    )


@pytest.fixture(scope='module')
def explanation(tokenizer):
    return explain(tiny_model('llama'), TEXT, tokenizer=tokenizer)


def _screenshot(chromium: str, page: Path, out: Path, size=(1000, 600)) -> np.ndarray:
    with tempfile.TemporaryDirectory() as profile:
        command = [
            chromium,
            '--headless',
            *CHROMIUM_FLAGS,
            f'--user-data-dir={profile}',
            f'--screenshot={out}',
            f'--window-size={size[0]},{size[1]}',
            page.resolve().as_uri(),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and out.exists(), result.stderr[-2000:]
    _keep(out)
    with Image.open(out) as image:
        assert image.size == size
        return np.asarray(image.convert('RGB')).astype(int)


def _has(pixels: np.ndarray, color, tolerance: int = 2) -> int:
    """How many pixels have ``color`` (within ``tolerance`` per channel)."""
    return int((np.abs(pixels - np.asarray(color)).max(-1) <= tolerance).sum())


def test_screenshot_of_an_explanation_page(chromium, explanation, tmp_path):
    page = tmp_path / 'explanation.html'
    page.write_text(explanation.to_html(), encoding='utf-8')
    pixels = _screenshot(chromium, page, tmp_path / 'explanation-screenshot.png')
    # the most relevant token's box is the saturated red of the map; neutral tokens are grey on a white page
    assert explanation.relevance[0].max() == explanation.relevance[0].abs().max()
    assert _has(pixels, POSITIVE) > 100
    assert _has(pixels, NEUTRAL) > 100
    assert _has(pixels, (255, 255, 255)) > pixels.shape[0] * pixels.shape[1] // 2  # a light page
    # the white text on the red box is there too (the token is drawn, not just its box)
    top = int(explanation.relevance[0].argmax())
    assert text_color(POSITIVE) == (255, 255, 255) and top >= 0


def test_screenshot_of_the_answer_page(chromium, generation, tmp_path):
    page = tmp_path / 'answer.html'
    generation.save(page)
    pixels = _screenshot(chromium, page, tmp_path / 'answer-screenshot.png')
    assert _has(pixels, POSITIVE) > 50  # the script ran and coloured the answer view (its most relevant token)


def _backgrounds(page) -> list[str]:
    return page.eval_on_selector_all('.za-tokens .za-t', 'spans => spans.map(s => getComputedStyle(s).backgroundColor)')


def _expected(values, scale) -> list[str]:
    return [css_rgb(relevance_to_rgb(value, scale)) for value in values]


@pytest.mark.parametrize('scheme', ['light', 'dark'])
def test_clicking_a_generated_token_switches_the_heatmap(browser, generation, tmp_path, scheme):
    path = tmp_path / 'answer.html'
    generation.save(path)
    context = browser.new_context(viewport={'width': 1000, 'height': 560}, color_scheme=scheme)
    page = context.new_page()
    errors = []
    page.on('pageerror', lambda error: errors.append(str(error)))
    page.goto(path.resolve().as_uri())
    tokens = generation.tokens()
    # every token is visible, with its text
    boxes = page.eval_on_selector_all(
        '.za-tokens .za-t',
        'spans => spans.map(s => [s.textContent, s.getBoundingClientRect().width, s.getBoundingClientRect().height])',
    )
    assert [text for text, _, _ in boxes] == [split_space(token)[1] for token in tokens]
    assert all(width > 3 and height > 10 for _, width, height in boxes)
    # first the whole answer, in exactly the colours of the other formats
    answer = generation.answer_relevance.tolist()
    assert _backgrounds(page) == _expected(answer, max(abs(value) for value in answer))
    assert page.get_attribute('button.za-answer', 'aria-pressed') == 'true'
    generated = page.query_selector_all('.za-gen')
    assert len(generated) == generation.relevance.shape[0]
    for index in (0, 3, len(generated) - 1):
        generated[index].click()
        row = generation.relevance[index].tolist()
        assert _backgrounds(page) == _expected(row, max(abs(value) for value in row))
        assert 'za-selected' in generated[index].get_attribute('class')
        later = page.eval_on_selector_all(
            '.za-tokens .za-t', 'spans => spans.map(s => s.classList.contains("za-later"))'
        )
        assert later == [column >= generation.answer_start + index for column in range(len(tokens))]
        info = page.inner_text('.za-info')
        assert info.startswith(f'generated token {index + 1} of {len(generated)}') and 'most relevant' in info
    if scheme == 'dark':
        background = page.evaluate('getComputedStyle(document.body).backgroundColor')
        assert background == 'rgb(22, 24, 28)'
    shot = tmp_path / f'answer-clicked-{scheme}.png'
    page.screenshot(path=str(shot))
    _keep(shot)
    # hovering shows another token's heatmap, leaving it shows the clicked one again
    generated[1].hover()
    row = generation.relevance[1].tolist()
    assert _backgrounds(page) == _expected(row, max(abs(value) for value in row))
    page.mouse.move(5, 5)
    last = generation.relevance[-1].tolist()
    assert _backgrounds(page) == _expected(last, max(abs(value) for value in last))
    # the arrow keys step through the answer; the button brings the whole answer back
    generated[2].focus()
    page.keyboard.press('ArrowRight')
    row = generation.relevance[3].tolist()
    assert _backgrounds(page) == _expected(row, max(abs(value) for value in row))
    page.click('button.za-answer')
    assert _backgrounds(page) == _expected(answer, max(abs(value) for value in answer))
    assert not errors
    context.close()
