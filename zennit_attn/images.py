"""Deprecated path: image explanation is part of :py:func:`zennit_attn.explain` (this module keeps working for one
release)."""
import warnings

from .explain import explain as explain_image
from .layers import Logits, output_scores as image_logits
from .methods import METHODS as IMAGE_METHODS
from .task import ImageExplanation

__all__ = ['explain_image', 'Logits', 'image_logits', 'IMAGE_METHODS', 'ImageExplanation']

warnings.warn('zennit_attn.images moved: use zennit_attn.explain, zennit_attn.task.ImageExplanation and '
              'zennit_attn.layers.Logits', DeprecationWarning, stacklevel=2)
