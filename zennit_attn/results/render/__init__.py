"""Rendering relevance for people, in one place: the colour map (:py:mod:`.colors`), token texts and words
(:py:mod:`.tokens`), what every renderer draws (:py:mod:`.layout`), terminal output (:py:mod:`.terminal`), HTML pages
and the interactive page of a generated answer (:py:mod:`.html`), matplotlib figures (:py:mod:`.figure`: PNG, SVG,
PDF), LaTeX snippets (:py:mod:`.latex`), image heatmaps and overlays (:py:mod:`.image`), and the glue from
explanations to all of them and to files (:py:mod:`.views`: the one output-path check and the save functions)."""

from .colors import NEGATIVE, NEUTRAL, POSITIVE, relevance_to_rgb, text_color
from .image import heatmap, overlay
from .layout import Heatmap, Segment
from .terminal import render_terminal, use_color
from .tokens import display_token, merge_words, token_texts
from .views import (
    IMAGE_SUFFIXES,
    SUFFIXES,
    check_output,
    save_heatmaps,
    save_image,
    save_image_explanation,
    shared_scale,
)

__all__ = [
    'relevance_to_rgb',
    'text_color',
    'POSITIVE',
    'NEGATIVE',
    'NEUTRAL',
    'token_texts',
    'merge_words',
    'display_token',
    'Heatmap',
    'Segment',
    'render_terminal',
    'use_color',
    'save_heatmaps',
    'shared_scale',
    'SUFFIXES',
    'IMAGE_SUFFIXES',
    'check_output',
    'heatmap',
    'overlay',
    'save_image',
    'save_image_explanation',
]
