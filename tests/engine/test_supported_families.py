"""Every method and every composite on every family of ``supported_families()``, on tiny random models.

Each explanation must explain the model's own logit (equal to a plain forward pass), give finite relevance that is not
all zero, and leave the model as it was. The rules themselves are checked against hand computations elsewhere; this
file makes sure that no supported family is left out of a method or composite (the family table is read by one
parser, used by the canonizers, the gamma composites and AtMan alike).
"""

from __future__ import annotations

import pytest
import torch

from tests.models import TABLE_FAMILY, decoder_ids, pixels, tiny_hf_vit, tiny_model, tiny_timm_vit, token_ids
from zennit_attn import explain
from zennit_attn.engine.canonizers import supported_families
from zennit_attn.engine.canonizers.families import family_of
from zennit_attn.engine.composites import AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma
from zennit_attn.engine.modules import output_scores
from zennit_attn.methods.registry import METHODS

#: A builder per family: ``() -> (model, explain keyword arguments, plain logits)``.
HEADS = {'bert': 'seq_cls', 'roberta': 'masked_lm', 'distilbert': 'seq_cls', 't5': 'seq2seq'}
VISION = {'timm-vit': tiny_timm_vit, 'vit': tiny_hf_vit}
#: Small settings for the costly methods.
FAST = {
    'kernelshap': dict(samples=24),
    'integrated_gradients': dict(steps=3),
    'smoothgrad': dict(samples=2),
    'atman': dict(perturbation_batch=64),
}
#: Methods that read attention maps: not defined for encoder-decoder models (a clear NotImplementedError).
ATTENTION_MAPS = ('attention_rollout', 'grad_attention_rollout', 'gradcam')
COMPOSITES = (AttnLRPEpsilon, CPLRPEpsilon, AttnLRPGamma, CPLRPGamma)


def build(family):
    if family in VISION:
        model, x = VISION[family](), pixels()
        return model, dict(input_ids=x), lambda: output_scores(model(x))
    model = tiny_model(family, HEADS.get(family))
    ids = token_ids(family, 6, 2, seed=1)
    kwargs = dict(input_ids=ids)
    if family == 't5':
        kwargs['decoder_input_ids'] = decoder_ids(family, 3, 2)
        return (
            model,
            kwargs,
            lambda: model(input_ids=ids, decoder_input_ids=kwargs['decoder_input_ids'], use_cache=False).logits,
        )
    return model, kwargs, lambda: model(input_ids=ids).logits


def test_every_family_has_a_builder():
    """The tiny models of the tests and the family table name the same families (a family added to the table
    without a tiny model, or a tiny model of a family the table lacks, fails here), and the library recognises
    each family's tiny model as that family: its top module and every module of the table in it."""
    assert set(supported_families()) == set(VISION) | set(TABLE_FAMILY.values())
    for family in supported_families():
        model = build(family)[0]
        assert getattr(family_of(model), 'name', None) == family, (family, type(model).__name__)
        recognised = {found.name for found in map(family_of, model.modules()) if found is not None}
        assert recognised == {family}, (family, recognised)


def check(model, explanation, plain):
    with torch.no_grad():
        logits = plain()
    if logits.dim() == 3:
        expected = logits[torch.arange(logits.shape[0]), explanation.position, explanation.target]
    else:
        expected = logits.gather(1, explanation.target[:, None])[:, 0]
    torch.testing.assert_close(explanation.logit, expected, rtol=1e-6, atol=1e-8)
    assert bool(torch.isfinite(explanation.relevance).all())
    if explanation.method == 'gradcam':  # max(0, .): a random model's map may be all negative
        assert bool((explanation.relevance >= 0).all())
    else:
        assert float(explanation.relevance.abs().sum()) > 0
    torch.testing.assert_close(plain(), logits)  # the model is left as it was


@pytest.mark.parametrize('method', list(METHODS))
@pytest.mark.parametrize('family', supported_families())
def test_method_on_family(family, method):
    model, kwargs, plain = build(family)
    if method in ATTENTION_MAPS and family == 't5':
        with pytest.raises(NotImplementedError, match='encoder-decoder'):
            explain(model, method=method, **kwargs, **FAST.get(method, {}))
        return
    check(model, explain(model, method=method, **kwargs, **FAST.get(method, {})), plain)


@pytest.mark.parametrize('composite', COMPOSITES, ids=lambda composite: composite.__name__)
@pytest.mark.parametrize('family', supported_families())
def test_composite_on_family(family, composite):
    model, kwargs, plain = build(family)
    check(model, explain(model, composite=composite(), **kwargs), plain)
