"""Every method and every composite on every family of the tiny test models (tests/models.py), with the numbers each
must give: the explained logit is the model's own (a plain forward pass), the model is left as it was, and

- CP-LRP (``method='cplrp'`` on the language models, :py:class:`~zennit_attn.composites.CPLRPEpsilon`, and
  :py:class:`~zennit_attn.composites.CPLRPGamma` with exact stabilisers) conserves the logit exactly on the
  models with biases, positions and token types zeroed (float64, 1e-8);
- input x gradient equals ``x * d logit / d x`` computed by plain autograd, without the library;
- the other methods give finite relevance that is not all zero (their formulas are checked by hand in their own
  tests: ``tests/methods/test_registry.py``, ``tests/engine``).
"""

from __future__ import annotations

import pytest
import torch

from tests.models import (
    ENCODER_DECODERS,
    FAMILIES,
    decoder_ids,
    pixels,
    tiny_hf_vit,
    tiny_model,
    tiny_timm_vit,
    token_ids,
)
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.core.modules import output_scores
from zennit_attn.methods.registry import METHODS
from zennit_attn.rules import Gamma

HEADS = {'bert': 'seq_cls', 'roberta': 'masked_lm', 'distilbert': 'seq_cls', 't5': 'seq2seq', 't5_relu': 'seq2seq'}
VISION = {'timm-vit': tiny_timm_vit, 'vit': tiny_hf_vit}
GRID = list(FAMILIES) + list(VISION)
#: Small settings for the costly methods.
FAST = {
    'kernelshap': dict(samples=24),
    'integrated_gradients': dict(steps=3),
    'smoothgrad': dict(samples=2),
    'atman': dict(perturbation_batch=64),
}
#: Methods that read attention maps: not defined for encoder-decoder models (a clear NotImplementedError).
ATTENTION_MAPS = ('attention_rollout', 'grad_attention_rollout', 'gradcam')
#: Families whose positions are no input PA-LRP knows (T5's relative attention bias, the ViTs' position parameters)
NO_POSITIONS = ('t5', 't5_relu')
#: CPLRPGamma with stabilisers far below the arithmetic's precision and the plain gradient on attention projections:
#: exactly conservative on bias-free models
EXACT_GAMMA = dict(
    conv=Gamma(0.25, stabilizer=1e-15), linear=Gamma(0.05, stabilizer=1e-15), attention_in=None, attention_out=None
)
COMPOSITES = {
    'AttnLRPEpsilon': AttnLRPEpsilon,
    'CPLRPEpsilon': CPLRPEpsilon,
    'AttnLRPGamma': AttnLRPGamma,
    'CPLRPGamma': lambda: CPLRPGamma(**EXACT_GAMMA),
}
CONSERVING = ('CPLRPEpsilon', 'CPLRPGamma', 'cplrp')


def build(family):
    """``(model, explain keyword arguments, plain logits, the explained inputs' values)`` of a bias-free tiny model."""
    if family in VISION:
        model, x = VISION[family](zero_bias=True), pixels()
        return model, dict(input_ids=x), lambda: output_scores(model(x))
    model = tiny_model(family, HEADS.get(family), zero_bias=True)
    word = model.get_input_embeddings()
    for module in model.modules():  # positions and token types: constants of the model, like biases
        if isinstance(module, torch.nn.Embedding) and module is not word and module.weight is not word.weight:
            torch.nn.init.zeros_(module.weight)
    ids = token_ids(family, 6, 2, seed=1)
    kwargs = dict(input_ids=ids)
    if family in ENCODER_DECODERS:
        kwargs['decoder_input_ids'] = decoder_ids(family, 3, 2)
        return model, kwargs, lambda: model(**kwargs, use_cache=False).logits
    return model, kwargs, lambda: model(input_ids=ids).logits


def explained_logit(explanation, logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() == 3:
        return logits[torch.arange(logits.shape[0]), explanation.position, explanation.target]
    return logits.gather(1, explanation.target[:, None])[:, 0]


def total(explanation) -> torch.Tensor:
    """``[batch]`` relevance of every explained input (pixels; encoder and decoder tokens)."""
    values = explanation.relevance.flatten(1).sum(1)
    if getattr(explanation, 'decoder_relevance', None) is not None:
        values = values + explanation.decoder_relevance.sum(1)
    return values


def input_x_gradient(model, kwargs, explanation) -> torch.Tensor:
    """``x * d logit / d x`` of the explained logits, by plain autograd on the model (no library code)."""
    if 'decoder_input_ids' not in kwargs and not kwargs['input_ids'].is_floating_point():
        embeddings = model.get_input_embeddings()(kwargs['input_ids']).detach().requires_grad_()
        logits = output_scores(model(inputs_embeds=embeddings))
        (grad,) = torch.autograd.grad(explained_logit(explanation, logits).sum(), embeddings)
        return (embeddings * grad).sum(-1).detach()
    if kwargs['input_ids'].is_floating_point():
        x = kwargs['input_ids'].clone().requires_grad_()
        (grad,) = torch.autograd.grad(explained_logit(explanation, output_scores(model(x))).sum(), x)
        return (x * grad).sum(1).detach()
    return None  # encoder-decoder: checked by the method's own tests


def check(name: str, model, kwargs, plain, explanation) -> None:
    with torch.no_grad():
        logits = plain()
    torch.testing.assert_close(explanation.logit, explained_logit(explanation, logits), rtol=1e-6, atol=1e-8)
    assert bool(torch.isfinite(explanation.relevance).all())
    if name in CONSERVING and not (name == 'cplrp' and kwargs['input_ids'].is_floating_point()):  # ViT: stabilisers
        torch.testing.assert_close(total(explanation), explanation.logit, rtol=1e-8, atol=1e-12)
    elif name == 'input_x_gradient' and (expected := input_x_gradient(model, kwargs, explanation)) is not None:
        torch.testing.assert_close(explanation.relevance, expected, rtol=1e-10, atol=1e-12)
    elif name == 'gradcam':  # max(0, .): a random model's map may be all negative
        assert bool((explanation.relevance >= 0).all())
    else:
        assert float(explanation.relevance.abs().sum()) > 0
    torch.testing.assert_close(plain(), logits)  # the model is left as it was


@pytest.mark.parametrize('method', list(METHODS))
@pytest.mark.parametrize('family', GRID)
def test_method_on_family(family, method):
    model, kwargs, plain = build(family)
    if method in ATTENTION_MAPS and family in ENCODER_DECODERS:
        with pytest.raises(NotImplementedError, match='encoder-decoder'):
            explain(model, method=method, **kwargs, **FAST.get(method, {}))
        return
    if method == 'palrp' and family in NO_POSITIONS:
        with pytest.raises(ValueError, match='no position encoding that PA-LRP gives relevance'):
            explain(model, method=method, **kwargs)
        return
    if method == 'palrp' and family in VISION:  # the table held as a parameter: one image at a time
        with pytest.raises(ValueError, match='explain one image at a time'):
            explain(model, method=method, **kwargs)
        return
    if method == 'attnlrp_late' and family in VISION:
        with pytest.raises(ValueError, match='measured on language models'):
            explain(model, method=method, **kwargs)
        return
    check(method, model, kwargs, plain, explain(model, method=method, **kwargs, **FAST.get(method, {})))


#: The families whose routers and experts compute linear maps with parameters of modules that are not layers (a
#: mixture of experts' router weight, its fused experts' weights): a gamma rule of linear layers cannot apply to them,
#: and the gamma composites refuse them by name.
INLINE_LAYERS = ('mixtral', 'qwen2_moe', 'qwen3_moe', 'olmoe')


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('family', GRID)
def test_composite_on_family(family, composite):
    model, kwargs, plain = build(family)
    method = 'cplrp' if composite.startswith('CPLRP') else 'attnlrp'
    if composite.endswith('Gamma') and family in INLINE_LAYERS:
        with torch.no_grad():
            logits = plain()
        with pytest.raises(UnsupportedModelError, match=r"a linear map with the parameter '.*' of \w+, not a layer"):
            explain(model, method=method, composite=COMPOSITES[composite](), **kwargs)
        torch.testing.assert_close(plain(), logits)  # the model is left as it was
        return
    check(composite, model, kwargs, plain, explain(model, method=method, composite=COMPOSITES[composite](), **kwargs))
