"""Rendering relevance for people: token heatmaps for the terminal and HTML (:py:mod:`.text`), image heatmaps and
overlays as PNG (:py:mod:`.image`)."""
from .image import heatmap, overlay, save_explanation, save_heatmap, save_overlay
from .text import from_explanation, render_html, render_terminal, relevance_to_rgb, use_color, write_html

__all__ = [
    'render_terminal', 'render_html', 'write_html', 'from_explanation', 'relevance_to_rgb', 'use_color',
    'heatmap', 'overlay', 'save_heatmap', 'save_overlay', 'save_explanation',
]
