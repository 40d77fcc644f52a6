"""Deprecated path: moved to :py:mod:`zennit_attn.render.image` (this one keeps working for one release)."""
import warnings

from .render.image import *  # noqa: F401,F403

warnings.warn('zennit_attn.viz moved to zennit_attn.render.image', DeprecationWarning, stacklevel=2)
