"""Explaining pixel inputs: ``explain()`` dispatch, the zennit ``Gradient`` attributor path, and the image baselines
on tiny timm, DeiT and Hugging Face ViTs (float64)."""

from __future__ import annotations

import pytest
import torch
from zennit.attribution import Gradient

from tests.models import CHANNELS, CLASSES, IMAGE, VISION_BUILDERS, pixels, tiny_hf_vit, tiny_timm_vit
from zennit_attn import ImageExplanation, explain
from zennit_attn.composites import AttnLRPGamma, CPLRPGamma
from zennit_attn.core.modules import Logits, output_scores
from zennit_attn.inputs.task import ImageTask
from zennit_attn.methods.attention import attention_maps
from zennit_attn.methods.propagation import lrp_method
from zennit_attn.methods.registry import METHODS

#: PA-LRP refuses the ViTs (their positions are parameters, no input it knows), and 'attnlrp_late' without a composite
#: (measured on language models): tests/methods/test_family_grid.py
BASELINES = [method for method in METHODS if method not in ('attnlrp', 'cplrp', 'palrp', 'attnlrp_late')]
FAST = {'integrated_gradients': {'steps': 4}, 'smoothgrad': {'samples': 3}, 'kernelshap': {'samples': 64}}


@pytest.mark.parametrize('kind', VISION_BUILDERS)
@pytest.mark.parametrize('composite', [AttnLRPGamma, CPLRPGamma])
def test_gradient_attributor_equals_explain(kind, composite):
    """``with Gradient(model=vit, composite=...) as attributor: out, relevance = attributor(x, one_hot)`` gives
    pixel relevance; with the logit as output relevance it equals explain()."""
    model = VISION_BUILDERS[kind]()
    x = pixels()
    explanation = explain(model, x, method=lrp_method(composite()), composite=composite())
    assert isinstance(explanation, ImageExplanation)
    if kind == 'hf':  # zennit's Gradient needs a tensor output: read the logits
        model = Logits(model)
    with Gradient(model=model, composite=composite()) as attributor:
        output, relevance = attributor(x, lambda out: torch.eye(CLASSES, dtype=x.dtype)[explanation.target] * out)
    torch.testing.assert_close(output.gather(1, explanation.target[:, None])[:, 0], explanation.logit)
    torch.testing.assert_close(relevance, explanation.pixel_relevance, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(explanation.relevance, explanation.pixel_relevance.sum(1))


def test_explain_dispatch_and_arguments():
    model = tiny_timm_vit()
    x = pixels(3)
    explanation = explain(model, x, target=1)
    assert explanation.pixel_relevance.shape == (3, CHANNELS, IMAGE, IMAGE)
    assert explanation.relevance.shape == (3, IMAGE, IMAGE)
    assert explanation.target.tolist() == [1, 1, 1] and explanation.method == 'attnlrp'
    torch.testing.assert_close(explanation.logit, model(x)[:, 1].detach())
    single = explain(model, x[0])  # [C, H, W] is a batch of one
    assert single.relevance.shape == (1, IMAGE, IMAGE)
    assert explain(model, x, method='cplrp').method == 'cplrp'
    torch.testing.assert_close(
        explain(model, x, method='cplrp').pixel_relevance,
        explain(model, x, method='cplrp', composite=CPLRPGamma()).pixel_relevance,
    )
    with pytest.raises(ValueError, match='Unknown method'):
        explain(model, x, method='nope')
    with pytest.raises(ValueError, match='target'):
        explain(model, x, target=CLASSES)
    with pytest.raises(TypeError, match='composite'):
        explain(model, x, steps=3)
    model.train()
    with pytest.raises(ValueError, match='training mode'):
        explain(model, x)


@pytest.mark.parametrize('kind', VISION_BUILDERS)
@pytest.mark.parametrize('method', BASELINES)
def test_baselines(kind, method):
    model = VISION_BUILDERS[kind]()
    x = pixels()
    params = FAST.get(method, {})
    explanation = explain(model, x, target=[0, 2], method=method, **params)
    assert explanation.pixel_relevance.shape == x.shape and torch.isfinite(explanation.pixel_relevance).all()
    assert explanation.target.tolist() == [0, 2] and explanation.method == method
    torch.testing.assert_close(
        explanation.logit, output_scores(model(x))[:, [0, 2]].diagonal().detach(), rtol=1e-9, atol=1e-12
    )
    if method in ('attention_rollout', 'grad_attention_rollout', 'gradcam', 'atman', 'kernelshap'):  # per patch
        patch = explanation.relevance[:, :4, :4]
        assert torch.allclose(patch, patch[:, :1, :1].expand_as(patch))
    if method == 'attention_rollout':  # rows of the rollout sum to 1: patches get at most that
        assert float(explanation.relevance.sum((1, 2)).max()) <= 1 + 1e-9


def test_input_x_gradient_and_integrated_gradients_formulas():
    model = tiny_timm_vit()
    x = pixels()
    x1 = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(model(x1)[:, 0].sum(), x1)
    torch.testing.assert_close(explain(model, x, target=0, method='input_x_gradient').pixel_relevance, x * grad)
    ig = explain(model, x, target=0, method='integrated_gradients', steps=64)
    completeness = ig.relevance.sum((1, 2))
    baseline = model(torch.zeros_like(x))[:, 0].detach()
    torch.testing.assert_close(completeness, ig.logit - baseline, rtol=2e-2, atol=1e-4)


def test_attention_maps_restore_and_see_every_layer():
    model = tiny_timm_vit()
    assert all(block.attn.fused_attn for block in model.blocks)
    task = ImageTask(model, pixels())
    with attention_maps(task, task.inputs) as (_, maps):
        assert not any(block.attn.fused_attn for block in model.blocks)  # kept for a backward pass inside
    assert len(maps) == len(model.blocks) and maps[0].shape == (2, 2, 5, 5)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(2, 2, 5, dtype=maps[0].dtype))
    assert all(block.attn.fused_attn for block in model.blocks)
    hf = tiny_hf_vit(attn_implementation='sdpa')
    task = ImageTask(hf, pixels())
    with attention_maps(task, task.inputs) as (_, maps):
        assert hf.config._attn_implementation == 'eager'
    assert len(maps) == 2 and hf.config._attn_implementation == 'sdpa'
    torch.testing.assert_close(maps[1].sum(-1), torch.ones(2, 2, 5, dtype=maps[1].dtype))
