"""Deprecated path: moved to :py:mod:`zennit_attn.composites.search` (this one keeps working for one release)."""
import warnings

from .composites.search import *  # noqa: F401,F403

warnings.warn('zennit_attn.search moved to zennit_attn.composites.search', DeprecationWarning, stacklevel=2)
