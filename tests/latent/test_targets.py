"""Neuron targets (``explain(..., target=Neuron(...))``) and conditional relevance (``condition=``), on tiny random
float64 models: the input relevance of a neuron target sums to its activation under CP-LRP with zero biases, the
conditional heatmaps of all units of a site sum to the site's heatmap and at the residual stream (a cut) to the
unconditional one.
"""

from __future__ import annotations

import pytest
import torch

from tests.latent.helpers import TIGHT, build, llama, watch
from tests.models import tiny_model, token_ids
from tests.numbers import assert_close
from zennit_attn import explain
from zennit_attn.composites import CPLRPEpsilon
from zennit_attn.latent import Neuron, find_sites


@pytest.mark.parametrize(
    'site,layer,index', [('mlp', 1, 5), ('mlp', 0, 17), ('attention', 1, 2), ('value', 0, 3), ('residual', 1, 4)]
)
def test_neuron_target_conserves_under_cplrp(site, layer, index):
    """Bias-free random Llama, CP-LRP: the input relevance sums to the neuron's activation (the initial relevance)."""
    model, ids = llama(), token_ids('llama', 6, 2)
    exp = explain(model, ids, target=Neuron(site, layer, index), method='cplrp')
    point = find_sites(model, site)[site][layer]
    store = {}
    handle = watch(point.module, store, 'x', output=point.kind == 'output')
    with torch.no_grad():
        model(ids)
    handle.remove()
    tensor = point.select(store['x']['x'])
    features = point.unit_features(index, tensor.shape[-1])
    activation = tensor[:, -1, features].sum(-1)
    torch.testing.assert_close(exp.logit, activation, **TIGHT)
    torch.testing.assert_close(exp.relevance.sum(-1), activation, **TIGHT)
    assert exp.target.tolist() == [index, index]


def test_neuron_target_with_gradient_methods():
    model, ids = llama(), token_ids('llama', 6, 1)
    neuron = Neuron('mlp', 1, 5)
    gradient = explain(model, ids, target=neuron, method='input_x_gradient')
    lrp = explain(model, ids, target=neuron, method='cplrp')
    torch.testing.assert_close(gradient.logit, lrp.logit, **TIGHT)
    integrated = explain(model, ids, target=neuron, method='integrated_gradients', steps=4)
    torch.testing.assert_close(integrated.logit, lrp.logit, **TIGHT)


# ------------------------------------------------------------------------------------------------ conditions
def test_conditions_sum_to_the_site_and_the_cut():
    model, ids = llama(), token_ids('llama', 5, 1)
    whole = explain(model, ids, latent=('mlp', 'residual'))
    layer = 1
    every = [Neuron('mlp', layer, index) for index in range(64)]
    singles = explain(model, ids, condition=every)
    assert singles.relevance.shape == (64, 5)
    # the relevance each condition receives is the neuron's recorded latent relevance
    torch.testing.assert_close(singles.logit, whole.latent['mlp'][0, layer].sum(0), **TIGHT)
    site = explain(model, ids, condition=[every])
    torch.testing.assert_close(singles.relevance.sum(0), site.relevance[0], **TIGHT)
    # the residual stream is a cut: all its hidden units together give the unconditional heatmap
    for boundary in (1, 2):
        cut = explain(model, ids, condition=[[Neuron('residual', boundary, index) for index in range(32)]])
        torch.testing.assert_close(cut.relevance[0], whole.relevance[0], **TIGHT)
        torch.testing.assert_close(cut.logit[0], whole.latent['residual'][0, boundary].sum(), **TIGHT)


def test_conditions_batch_rows_and_conservation():
    """Two input rows x three conditions; under CP-LRP with zero biases each conditional heatmap sums to the
    relevance its condition receives."""
    model, ids = llama(), token_ids('llama', 5, 2)
    conditions = [Neuron('mlp', 1, 3), [Neuron('mlp', 1, 4), Neuron('mlp', 1, 9)], Neuron('attention', 0, 1)]
    exp = explain(model, ids, method='cplrp', condition=conditions, latent=('mlp', 'attention'))
    assert exp.relevance.shape == (6, 5)
    torch.testing.assert_close(exp.relevance.sum(-1), exp.logit, **TIGHT)
    mlp, attention = exp.latent['mlp'], exp.latent['attention']
    expected = torch.stack(
        [
            torch.stack([mlp[row, 1, :, 3].sum(), mlp[row, 1, :, [4, 9]].sum(), attention[row, 0, :, 1].sum()])
            for row in range(2)
        ]
    ).flatten()
    torch.testing.assert_close(exp.logit, expected, **TIGHT)
    assert exp.input_ids.shape[0] == 6
    reduced = explain(model, ids, method='cplrp', condition=conditions, latent='mlp', latent_reduce='sum')
    torch.testing.assert_close(reduced.relevance, exp.relevance, **TIGHT)
    torch.testing.assert_close(reduced.latent['mlp'], exp.latent['mlp'].sum(2), **TIGHT)  # of the input rows


def test_bad_input_gets_clear_errors():
    model, ids = llama(), token_ids('llama', 5, 1)
    with pytest.raises(ValueError, match='unknown latent site'):
        explain(model, ids, latent=('mlp', 'neurons'))
    with pytest.raises(ValueError, match='layer 5 is out of range'):
        explain(model, ids, target=Neuron('mlp', 5, 1))
    with pytest.raises(ValueError, match='64 units; index 64 is out of range'):
        explain(model, ids, target=Neuron('mlp', 1, 64))
    with pytest.raises(ValueError, match='index 4 is out of range'):
        explain(model, ids, condition=[Neuron('attention', 1, 4)])
    with pytest.raises(ValueError, match='mixtral family has no "mlp" site'):
        explain(tiny_model('mixtral'), ids, latent='mlp')
    with pytest.raises(ValueError, match='cannot explain a Neuron target'):
        explain(model, ids, target=Neuron('mlp', 1, 1), method='atman')
    with pytest.raises(ValueError, match='one backward pass'):
        explain(model, ids, latent='mlp', method='integrated_gradients')
    with pytest.raises(ValueError, match='latent_reduce'):
        explain(model, ids, latent='mlp', latent_reduce='mean')
    with pytest.raises(ValueError, match='share site and layer'):
        explain(model, ids, condition=[[Neuron('mlp', 1, 1), Neuron('mlp', 0, 1)]])
    assert not any(module._forward_hooks for module in model.modules())  # nothing left behind by the refusals


@pytest.mark.parametrize('family', ['timm-vit', 'vit'])
def test_vision_transformers_cut_and_neuron_target(family):
    """ViTs: the residual stream is a cut (conditional on all hidden units = the unconditional pixel heatmap), and a
    neuron target explains the neuron's activation."""
    model, kwargs = build(family)
    whole = explain(model, latent='mlp', **kwargs)
    hidden = model.embed_dim if family == 'timm-vit' else model.config.hidden_size
    cut = explain(model, condition=[[Neuron('residual', 1, index) for index in range(hidden)]], **kwargs)
    torch.testing.assert_close(cut.relevance, whole.relevance, rtol=1e-9, atol=1e-12)
    target = explain(model, target=Neuron('mlp', 1, 3), method='input_x_gradient', **kwargs)
    point = find_sites(model, 'mlp')['mlp'][1]
    store = {}
    handle = watch(point.module, store, 'x', output=False)
    with torch.no_grad():
        model(kwargs['input_ids'])
    handle.remove()
    torch.testing.assert_close(target.logit, store['x']['x'][:, -1, 3], **TIGHT)


def test_conditional_relevance_of_pa_lrp_has_the_conditions_positions():
    """PA-LRP (a composite with ``positions=True``) with ``condition=``: each condition's row has its own positions'
    relevance, so that (CP-LRP, bias-free GPT-2) its tokens and positions sum to its explained value, and the
    conditions that split the units of a cut after the table (the residual stream after block 0) sum to the
    unconditional positions. Before: the first pass's (unconditional) positions were kept, ``[1, seq]`` beside
    ``[conditions, seq]`` tokens (one condition: tokens -0.00025 + positions 0.0569 for a value of -0.0001)."""
    model = tiny_model('gpt2', zero_bias=True)
    ids = torch.tensor([[5, 17, 3, 28, 9, 14, 22]])
    plain = explain(model, ids, composite=CPLRPEpsilon(positions=True))
    one = explain(model, ids, composite=CPLRPEpsilon(positions=True), condition=Neuron('mlp', 0, 3))
    assert one.position_relevance.shape == one.relevance.shape
    assert_close(one.relevance.sum(1) + one.position_relevance.sum(1), one.logit, 1e-12)
    width = model.config.n_embd
    halves = [[Neuron('residual', 1, unit) for unit in range(start, width, 2)] for start in (0, 1)]
    split = explain(model, ids, composite=CPLRPEpsilon(positions=True), condition=halves)
    assert split.position_relevance.shape == (2, ids.shape[1])
    assert_close(split.position_relevance.sum(0), plain.position_relevance[0], 1e-12)
    assert_close(split.relevance.sum(0), plain.relevance[0], 1e-12)
