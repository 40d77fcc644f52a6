"""Vision transformer families (timm VisionTransformer / DeiT, Hugging Face ViT) on tiny random models.

1. Variants the former family table refused (timm's attention pooling, gated attention) are explained exactly.
2. The composites restore the model exactly: modules, parameters, buffers, hooks, timm's ``fused_attn`` flags,
   outputs; also when the block raises.
3. Conservation with all biases, class/distillation tokens and position embeddings zeroed (float64): CP-LRP with
   the gamma composite gives the logit exactly at the pixels.
4. timm's fused SDPA path equals its explicit softmax path, and HF's SDPA equals eager.

The builders :py:func:`tiny_timm_vit`, :py:func:`tiny_deit` and :py:func:`tiny_hf_vit` are in ``tests/models.py``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from zennit.attribution import Gradient

# IMAGE, CHANNELS, pixels, tiny_*: still imported from here by other test files (import them from tests.models)
from tests.models import (
    CLASSES,
    HOOK_ATTRIBUTES,
    VISION_BUILDERS,
    pixels,
    tiny_deit,
    tiny_hf_vit,
    tiny_timm_vit,
)
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, AttnLRPGamma, CPLRPGamma
from zennit_attn.core.modules import output_scores
from zennit_attn.methods.propagation import lrp_method
from zennit_attn.rules import Gamma


def _snapshot(model):
    return {
        'modules': [(name, type(module)) for name, module in model.named_modules()],
        'state': {key: value.clone() for key, value in model.state_dict().items()},
        'parameters': [(name, id(parameter)) for name, parameter in model.named_parameters()],
        'hooks': [
            (name, attribute, len(getattr(module, attribute, {})))
            for name, module in model.named_modules()
            for attribute in HOOK_ATTRIBUTES
        ],
        'fused': [(name, module.fused_attn) for name, module in model.named_modules() if hasattr(module, 'fused_attn')],
        'attn': getattr(getattr(model, 'config', None), '_attn_implementation', None),
    }


def _assert_same(before, after):
    assert before['modules'] == after['modules']
    assert before['parameters'] == after['parameters']
    assert before['hooks'] == after['hooks']
    assert before['fused'] == after['fused']
    assert before['attn'] == after['attn']
    assert before['state'].keys() == after['state'].keys()
    for key in before['state']:
        assert torch.equal(before['state'][key], after['state'][key]), key


def _exact_cplrp_ratio(model, x) -> float:
    """Pixel relevance over the logit of CP-LRP with exact gamma rules (stabilisers 1e-15) and the plain gradient
    on the attention projections."""
    exact = CPLRPGamma(
        conv=Gamma(0.25, stabilizer=1e-15), linear=Gamma(0.05, stabilizer=1e-15), attention_in=None, attention_out=None
    )
    explanation = explain(model, x, method='cplrp', composite=exact)
    assert explanation.logit.abs().min() > 1e-6
    return float(explanation.relevance.sum() / explanation.logit.sum())


def test_variants_the_former_table_refused_are_explained():
    """timm's attention pooling (``global_pool='map'``: a latent query attending to the patches) and gated attention
    (the attention output times a sigmoid gate), which the former family table refused, are explained at their
    operations: CP-LRP conserves the logit exactly with the biases, tokens and positions zeroed."""
    pooled = tiny_timm_vit(global_pool='map', zero_bias=True)
    assert _exact_cplrp_ratio(pooled, pixels()) == pytest.approx(1.0, abs=1e-8)
    gated = tiny_timm_vit(zero_bias=True)
    gated.blocks[0].attn.gate = torch.nn.Linear(16, 16, bias=False, dtype=torch.float64).eval()
    assert _exact_cplrp_ratio(gated, pixels()) == pytest.approx(1.0, abs=1e-8)


@pytest.mark.parametrize('kind', VISION_BUILDERS)
def test_canonizers_restore_exactly(kind):
    model = VISION_BUILDERS[kind]()
    x = pixels()
    with torch.no_grad():
        reference = output_scores(model(x)).clone()
    before = _snapshot(model)
    for composite in (AttnLRPGamma(), CPLRPGamma(attention_in=Gamma(0.1)), AttnLRPEpsilon()):
        with composite.context(model) as modified:
            output_scores(modified(x.clone().requires_grad_()))
        _assert_same(before, _snapshot(model))
        with pytest.raises(RuntimeError, match='inside'):
            with composite.context(model):
                raise RuntimeError('inside')
        _assert_same(before, _snapshot(model))
    explain(model, x, method='gradcam')  # switches timm's fused_attn / HF's implementation and back
    _assert_same(before, _snapshot(model))
    with torch.no_grad():
        assert torch.equal(output_scores(model(x)), reference)
    # plain gradients are untouched after the composite
    x1 = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(output_scores(model(x1))[:, 0].sum(), x1)
    fresh = copy.deepcopy(model)
    x2 = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(output_scores(fresh(x2))[:, 0].sum(), x2)
    assert torch.equal(grad, expected)


@pytest.mark.parametrize('kind', VISION_BUILDERS)
def test_cp_gamma_conserves_the_logit(kind):
    """Biases, tokens and position embeddings zeroed: gamma (conv, linear), epsilon (attention projections),
    identity (GELU, LayerNorm), constant attention: the pixel relevance sums to the logit."""
    model = VISION_BUILDERS[kind](zero_bias=True)
    x = pixels()
    exact = CPLRPGamma(
        conv=Gamma(0.25, stabilizer=1e-15), linear=Gamma(0.05, stabilizer=1e-15), attention_in=None, attention_out=None
    )
    explanation = explain(model, x, method='cplrp', composite=exact)
    assert explanation.logit.abs().min() > 1e-3
    torch.testing.assert_close(explanation.relevance.sum((1, 2)), explanation.logit, rtol=1e-8, atol=0)
    # the default composite's stabilisers (1e-6) absorb a little
    default = explain(model, x, target=explanation.target, method='cplrp', composite=CPLRPGamma())
    torch.testing.assert_close(default.relevance.sum((1, 2)), explanation.logit, rtol=1e-2, atol=0)


def test_timm_fused_equals_explicit_attention():
    model = tiny_timm_vit()
    x = pixels()
    for composite in (AttnLRPGamma, CPLRPGamma):
        for module in model.modules():
            if hasattr(module, 'fused_attn'):
                module.fused_attn = True
        fused = explain(model, x, method=lrp_method(composite()), composite=composite())
        for module in model.modules():
            if hasattr(module, 'fused_attn'):
                module.fused_attn = False
        explicit = explain(model, x, target=fused.target, method=fused.method, composite=composite())
        torch.testing.assert_close(fused.pixel_relevance, explicit.pixel_relevance, rtol=1e-9, atol=1e-12)


def test_hf_sdpa_equals_eager():
    x = pixels()
    eager = explain(tiny_hf_vit(attn_implementation='eager'), x)
    sdpa = explain(tiny_hf_vit(attn_implementation='sdpa'), x, target=eager.target)
    torch.testing.assert_close(eager.pixel_relevance, sdpa.pixel_relevance, rtol=1e-6, atol=1e-10)


def test_timm_and_hf_with_the_same_weights_agree():
    """A timm ViT and a Hugging Face ViT holding the same weights give the same relevance."""
    timm_model = tiny_timm_vit(qkv_bias=True)
    hf = tiny_hf_vit()
    t, h = timm_model, hf.vit
    with torch.no_grad():
        h.embeddings.patch_embeddings.projection.load_state_dict(t.patch_embed.proj.state_dict())
        h.embeddings.cls_token.copy_(t.cls_token)
        h.embeddings.position_embeddings.copy_(t.pos_embed)
        for block, layer in zip(t.blocks, h.layers):
            q, k, v = block.attn.qkv.weight.chunk(3)
            qb, kb, vb = block.attn.qkv.bias.chunk(3)
            for linear, weight, bias in (
                (layer.attention.q_proj, q, qb),
                (layer.attention.k_proj, k, kb),
                (layer.attention.v_proj, v, vb),
            ):
                linear.weight.copy_(weight)
                linear.bias.copy_(bias)
            layer.attention.o_proj.load_state_dict(block.attn.proj.state_dict())
            layer.layernorm_before.load_state_dict(block.norm1.state_dict())
            layer.layernorm_after.load_state_dict(block.norm2.state_dict())
            layer.mlp.fc1.load_state_dict(block.mlp.fc1.state_dict())
            layer.mlp.fc2.load_state_dict(block.mlp.fc2.state_dict())
            layer.layernorm_before.eps = layer.layernorm_after.eps = block.norm1.eps
        h.layernorm.load_state_dict(t.norm.state_dict())
        h.layernorm.eps = t.norm.eps
        hf.classifier.load_state_dict(t.head.state_dict())
    hf.config.hidden_act = 'gelu'
    x = pixels()
    with torch.no_grad():
        torch.testing.assert_close(output_scores(hf(x)), timm_model(x), rtol=1e-9, atol=1e-12)
    for composite in (AttnLRPGamma, CPLRPGamma):
        a = explain(timm_model, x, method=lrp_method(composite()), composite=composite())
        b = explain(hf, x, target=a.target, method=a.method, composite=composite())
        torch.testing.assert_close(a.pixel_relevance, b.pixel_relevance, rtol=1e-7, atol=1e-10)


def test_zennit_gradient_attributor_on_deit():
    model = tiny_deit()
    x = pixels()
    one_hot = torch.eye(CLASSES, dtype=x.dtype)[[0, 2]]
    with Gradient(model=model, composite=AttnLRPGamma()) as attributor:
        output, relevance = attributor(x, one_hot)
    assert relevance.shape == x.shape and torch.isfinite(relevance).all()
    explanation = explain(model, x, target=[0, 2])
    torch.testing.assert_close(
        relevance * explanation.logit.view(-1, 1, 1, 1), explanation.pixel_relevance, rtol=1e-9, atol=1e-12
    )
