"""The gradient baselines where torch's own gradient is wrong: the backward of ``batch_norm`` with running statistics on
the CPU returns a wrong input gradient for a batch of one whose gradient is channels-last with a batch stride other
than ``C H W`` (``flatten(2).transpose(1, 2)`` after the norm sends it back); the baselines make that gradient
contiguous, as the engine does for LRP."""

from __future__ import annotations

import pytest
import torch

from tests.models import pixels, tiny_timm_vit
from tests.operations.test_registry import _PatchEmbedding
from zennit_attn import explain


@pytest.mark.parametrize('method', ['input_x_gradient', 'integrated_gradients', 'smoothgrad'])
def test_gradient_x_input_of_a_linear_patch_embedding_is_its_output(method):
    """A bias-free convolution, BatchNorm2d with running statistics, patches as tokens, mean and a linear head is
    linear: gradient x input sums to its output, and so do Integrated Gradients from 0 and SmoothGrad's mean gradient
    times the input (a linear map has one gradient at every noisy input) (1e-10; before, gradient x input summed to
    1.948 times the output)."""
    model = _PatchEmbedding().double().eval()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    explanation = explain(model, x, target=0, method=method)
    torch.testing.assert_close(explanation.relevance.sum(), explanation.logit[0], rtol=1e-10, atol=0)


def test_integrated_gradients_is_the_riemann_sum_in_the_inputs_precision():
    """Integrated Gradients of a float64 vision transformer equal the right Riemann sum over the points ``k / n`` of
    the path computed by hand in float64 (1e-13; zennit's float32 fractions put it 2e-7 off)."""
    model = tiny_timm_vit()
    x = pixels(batch=1)
    steps = 20
    total = torch.zeros_like(x)
    for step in range(1, steps + 1):
        point = (step / steps * x).requires_grad_()
        (gradient,) = torch.autograd.grad(model(point)[:, 0].sum(), point)
        total += gradient / steps
    explanation = explain(model, x, target=0, method='integrated_gradients', steps=steps)
    torch.testing.assert_close(explanation.pixel_relevance, total * x, rtol=1e-13, atol=1e-16)
