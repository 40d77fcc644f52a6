"""Deprecated path: moved to :py:mod:`zennit_attn.module_kinds` (this one keeps working for one release)."""
import warnings

from .module_kinds import *  # noqa: F401,F403

warnings.warn('zennit_attn.types moved to zennit_attn.module_kinds', DeprecationWarning, stacklevel=2)
