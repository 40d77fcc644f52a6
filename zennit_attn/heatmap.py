"""Deprecated path: moved to :py:mod:`zennit_attn.render.text` (this one keeps working for one release)."""
import warnings

from .render.text import *  # noqa: F401,F403

warnings.warn('zennit_attn.heatmap moved to zennit_attn.render.text', DeprecationWarning, stacklevel=2)
