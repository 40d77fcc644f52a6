"""Deprecated path: moved to :py:mod:`zennit_attn.pretrained` (this one keeps working for one release)."""
import warnings

from .pretrained import *  # noqa: F401,F403

warnings.warn('zennit_attn.models moved to zennit_attn.pretrained', DeprecationWarning, stacklevel=2)
