"""The colour map shared by every format: fixed points, symmetry, perceptual evenness, legibility."""

from __future__ import annotations

import math

import pytest

from zennit_attn.results.render.colors import (
    LEVELS,
    NEGATIVE,
    NEUTRAL,
    POSITIVE,
    color_table,
    luminance,
    oklab,
    relevance_level,
    relevance_to_rgb,
    text_color,
)


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
