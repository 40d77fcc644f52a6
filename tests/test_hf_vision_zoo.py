"""transformers' image classifiers beyond the ViT: tiny random models from their configurations
(:py:func:`~zennit_attn.workflows.architecture_check.configs.tiny_config`, with the sizes some need), float64, every
bias, running mean, position table, class and mask token and relative position table set to zero, so that CP-LRP
conserves the explained logit exactly (1e-8) for every class and every row of a batch.

A sweep over the 40 image classifiers of transformers' auto mapping that build (docs: Models) found every one
conserving; this slow tier keeps ten of its kinds (windowed attention, convolutions, pooling attention, hierarchical
and mobile hybrids) so that it stays so.
"""

from __future__ import annotations

import pytest
import torch

from tests.models import tiny_hf_vision
from zennit_attn import explain
from zennit_attn.composites import CPLRPEpsilon

pytestmark = pytest.mark.slow

#: ``model class -> configuration values beside the tiny configuration's`` (the sizes the sweep needed)
ARCHITECTURES = {
    'BeitForImageClassification': {},
    'ConvNextForImageClassification': {},
    'Dinov2ForImageClassification': {},
    'HieraForImageClassification': {},
    'LevitForImageClassification': dict(image_size=64, patch_size=16),
    'MobileViTForImageClassification': {},
    'PvtV2ForImageClassification': {},
    'SegformerForImageClassification': dict(hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1], decoder_hidden_size=32),
    'SwinForImageClassification': dict(
        image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4
    ),
    'Data2VecVisionForImageClassification': {},
}


@pytest.mark.parametrize('name', sorted(ARCHITECTURES))
def test_cp_lrp_conserves_for_every_class_and_row(name):
    model, pixels = tiny_hf_vision(name, **ARCHITECTURES[name])
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits
    for target in range(3):
        explanation = explain(model, pixels, target=target, method='cplrp', composite=CPLRPEpsilon())
        torch.testing.assert_close(explanation.logit, logits[:, target], rtol=1e-10, atol=1e-14)
        torch.testing.assert_close(
            explanation.pixel_relevance.sum((1, 2, 3)), explanation.logit, rtol=1e-8, atol=1e-10 * logits.abs().max()
        )
    alone = explain(model, pixels[1:], target=1, method='cplrp', composite=CPLRPEpsilon())
    batch = explain(model, pixels, target=1, method='cplrp', composite=CPLRPEpsilon())
    torch.testing.assert_close(batch.pixel_relevance[1:], alone.pixel_relevance, rtol=1e-9, atol=1e-14)
