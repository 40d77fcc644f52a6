"""Rendering relevance for people, in one place: the colour map (:py:mod:`.colors`), token texts and words
(:py:mod:`.tokens`), terminal output (:py:mod:`.text`), HTML pages and the interactive page of a generated answer
(:py:mod:`.html`), matplotlib figures (:py:mod:`.figure`: PNG, SVG, PDF), LaTeX snippets (:py:mod:`.latex`), image
heatmaps and overlays (:py:mod:`.image`), and the glue from explanations to all of them (:py:mod:`.views`)."""
from .colors import NEGATIVE, NEUTRAL, POSITIVE, relevance_to_rgb, text_color
from .image import heatmap, overlay, save_explanation, save_heatmap, save_image_explanation, save_overlay
from .layout import Heatmap, Segment
from .text import from_explanation, render_html, render_terminal, use_color, write_html
from .tokens import display_token, merge_words, token_texts
from .views import SUFFIXES, save_heatmaps, shared_scale

__all__ = [
    'relevance_to_rgb', 'text_color', 'POSITIVE', 'NEGATIVE', 'NEUTRAL', 'token_texts', 'merge_words',
    'display_token', 'Heatmap', 'Segment', 'render_terminal', 'render_html', 'write_html', 'from_explanation',
    'use_color', 'save_heatmaps', 'shared_scale', 'SUFFIXES', 'heatmap', 'overlay', 'save_heatmap', 'save_overlay',
    'save_explanation', 'save_image_explanation',
]
