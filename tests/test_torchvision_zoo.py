"""torchvision's classifiers: random models (``weights=None``), float64, every bias, running mean, position table and
class token set to zero, so that CP-LRP conserves the explained logit exactly (1e-8) for every row of a batch.

A sweep over 20 of torchvision's classifiers (docs: Models) found all conserving once EfficientNet v2 no longer
crashed: its FusedMBConv adds the residual to an activation's output in place (``result += input``), which the
identity rule kept for the backward pass; it computes it again there now. This slow tier keeps five kinds (residual
and grouped convolutions, the fused inverted residuals, windowed attention, channel shuffles).
"""

from __future__ import annotations

import pytest
import torch

from zennit_attn import explain
from zennit_attn.composites import CPLRPEpsilon

pytestmark = pytest.mark.slow
models = pytest.importorskip('torchvision.models')

#: ``builder -> image side``
ARCHITECTURES = {
    'resnet18': 64,
    'efficientnet_v2_s': 64,
    'swin_t': 64,
    'shufflenet_v2_x0_5': 64,
    'convnext_tiny': 64,
}
#: Names of the constants (biases aside) that absorb relevance by design
CONSTANTS = ('pos_embedding', 'class_token', 'relative_position_bias_table')


def random_model(name: str) -> torch.nn.Module:
    """torchvision's ``name`` with random weights and three classes, without constants, float64, in eval mode."""
    torch.manual_seed(0)
    model = getattr(models, name)(weights=None, num_classes=3).double().eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith('bias') or any(key in parameter_name for key in CONSTANTS):
                parameter.zero_()
            elif not parameter.any():  # zero-initialised layers (classifier heads, layer scales)
                parameter.normal_(0, 0.1)
        for module in model.modules():
            if getattr(module, 'running_mean', None) is not None:
                module.running_mean.zero_()
                module.running_var.fill_(1.0)
    return model


@pytest.mark.parametrize('name', sorted(ARCHITECTURES))
def test_cp_lrp_conserves_every_row(name):
    model, side = random_model(name), ARCHITECTURES[name]
    images = torch.randn(2, 3, side, side, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(images)
    explanation = explain(model, images, target=1, method='cplrp', composite=CPLRPEpsilon())
    torch.testing.assert_close(explanation.logit, logits[:, 1], rtol=1e-10, atol=0)
    torch.testing.assert_close(explanation.pixel_relevance.sum((1, 2, 3)), explanation.logit, rtol=1e-8, atol=0)
