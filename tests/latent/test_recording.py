"""Latent relevance recorded in the one backward pass (``zennit_attn.latent.recording``) and its ranking by
:py:func:`~zennit_attn.latent.top_neurons`, on tiny random float64 models.

Every numeric check is one the math fixes: conservation of the epsilon rule with zero bias (neuron relevances sum
to the MLP output's relevance), the block-boundary sums of ``conservation()``, gradient x input computed
independently with plain autograd.
"""

from __future__ import annotations

import pytest
import torch

from tests.family_table import TABLE
from tests.latent.helpers import TIGHT, build, llama, watch
from tests.models import MOE, tiny_model, token_ids
from zennit_attn import conservation, explain
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.latent import SITES, Neuron, find_sites, top_neurons
from zennit_attn.latent.recording import Recorder
from zennit_attn.latent.sites import SitePoint
from zennit_attn.workflows.architecture_check.check import zero_biases
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config


@pytest.mark.parametrize('method', ['attnlrp', 'cplrp', 'input_x_gradient'])
def test_sums_of_neurons_and_heads(method):
    """Bias-free projections conserve: the FFN neurons of a block sum to the MLP output's relevance, the heads to
    the attention output's (per position)."""
    model, ids = llama(), token_ids('llama', 7, 2)
    store, handles = {}, []
    for layer, block in enumerate(model.model.layers):
        handles += [watch(block.mlp, store, f'mlp{layer}'), watch(block.self_attn, store, f'attn{layer}')]
    try:
        exp = explain(model, ids, method=method, latent=('mlp', 'attention'))
    finally:
        for handle in handles:
            handle.remove()
    for layer in range(2):
        torch.testing.assert_close(exp.latent['mlp'][:, layer].sum(-1), store[f'mlp{layer}']['r'].sum(-1), **TIGHT)
        torch.testing.assert_close(
            exp.latent['attention'][:, layer].sum(-1), store[f'attn{layer}']['r'].sum(-1), **TIGHT
        )
    assert float(exp.latent['mlp'].abs().sum()) > 0


@pytest.mark.parametrize('family', ['llama', 'gpt2', 'bert', 'phi'])
def test_residual_equals_conservation(family):
    model = tiny_model(family)
    ids = token_ids(family, 6, 1)
    exp = explain(model, ids, latent='residual')
    report = conservation(model, ids)
    layers = exp.latent['residual'].shape[1] - 1
    torch.testing.assert_close(exp.latent['residual'][0].sum(-1).flip(0), report.sums[: layers + 1, 0], **TIGHT)


@pytest.mark.parametrize('method', ['attnlrp', 'cplrp', 'input_x_gradient'])
@pytest.mark.parametrize('family', ['llama', 'gpt2', 'qwen2_moe'])
def test_recording_leaves_relevance_bit_identical(family, method):
    model = tiny_model(family)
    ids = token_ids(family, 6, 2)
    plain = explain(model, ids, method=method)
    sites = ('attention', 'residual', 'query', 'key', 'value') + (() if family in MOE else ('mlp',))
    recorded = explain(model, ids, method=method, latent=sites)
    assert torch.equal(plain.relevance, recorded.relevance)
    assert torch.equal(plain.logit, recorded.logit)


def test_latent_reduce_sum_and_padding():
    model = llama()
    ids = token_ids('llama', 6, 2)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    full = explain(model, ids, attention_mask=mask, latent=('mlp', 'residual'))
    reduced = explain(model, ids, attention_mask=mask, latent=('mlp', 'residual'), latent_reduce='sum')
    assert reduced.latent.reduce == 'sum' and reduced.latent['mlp'].shape == (2, 2, 64)
    torch.testing.assert_close(reduced.latent['mlp'], full.latent['mlp'].sum(2), **TIGHT)
    torch.testing.assert_close(reduced.latent['residual'], full.latent['residual'].sum(2), **TIGHT)
    assert float(full.latent['mlp'][1, :, -2:].abs().sum()) == 0  # padding
    assert float(full.latent.activation['mlp'][1, :, -2:].abs().sum()) == 0


def test_cplrp_query_and_key_get_no_relevance():
    model = llama()
    exp = explain(model, token_ids('llama', 6, 1), method='cplrp', latent=('query', 'key', 'value'))
    assert float(exp.latent['query'].abs().sum()) == 0 and float(exp.latent['key'].abs().sum()) == 0
    assert float(exp.latent['value'].abs().sum()) > 0


@pytest.mark.parametrize('family', [family for family in TABLE if family != 't5_relu'])
def test_every_family_records_every_site_it_has(family):
    """Each site is recorded with the right shape and equals activation x gradient computed with plain autograd
    (method input_x_gradient); MoE families have no 'mlp' site, T5 (encoder-decoder) none at all: clear errors."""
    model, kwargs = build(family)
    if family == 't5':
        with pytest.raises(ValueError, match='encoder-decoder'):
            explain(model, latent='residual', **kwargs)
        return
    sites = [site for site in SITES if not (site == 'mlp' and family in MOE)]
    if family in MOE:
        with pytest.raises(ValueError, match=f'{family}.*mixture of experts'):
            explain(model, latent='mlp', **kwargs)
    points = find_sites(model, sites)
    store, handles = {}, []
    for site in sites:
        for point in points[site]:
            handles.append(watch(point.module, store, (site, point.layer), output=point.kind == 'output'))
    try:
        exp = explain(model, method='input_x_gradient', latent=sites, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    layers = len(points['attention'])
    for site in sites:
        values = exp.latent[site]
        assert values.shape[1] == layers + (site == 'residual')
        assert bool(torch.isfinite(values).all())
        for point in points[site]:
            raw = point.select(store[(site, point.layer)]['r'])
            expected = point.reduce(raw)
            if expected.dim() == values.dim() - 1 and values.dim() >= 3:
                torch.testing.assert_close(values[:, point.layer], expected.to(values.dtype), rtol=1e-5, atol=1e-7)
    assert float(exp.latent['attention'].abs().sum()) > 0


def plant(model, ids, target, layer=1, neuron=7, strength=20.0):
    """Make FFN neuron ``neuron`` of ``layer`` carry the logit of ``target`` at the last position."""
    mlp = model.model.layers[layer].mlp
    with torch.no_grad():
        mlp.gate_proj.weight[neuron] *= 4
        mlp.up_proj.weight[neuron] *= 4
        store = {}
        handle = watch(mlp.down_proj, store, 'x', output=False)
        model(ids)
        handle.remove()
        sign = float(torch.sign(store['x']['x'][0, -1, neuron]))
        mlp.down_proj.weight[:, neuron] = sign * strength * model.lm_head.weight[target]
    return model


@pytest.mark.parametrize('method', ['attnlrp', 'cplrp', 'input_x_gradient'])
def test_planted_neuron_ranks_first(method):
    ids = token_ids('llama', 6, 1)
    model = plant(llama(), ids, target=42)
    exp = explain(model, ids, target=42, method=method, latent='mlp')
    best = top_neurons(exp, k=3)
    assert (best[0].layer, best[0].index) == (1, 7)
    if method != 'input_x_gradient':  # LRP conserves: the planted neuron carries most of the logit
        assert best[0].relevance > 0.5 * float(exp.logit[0])
    assert top_neurons(exp, k=1, absolute=True)[0][:2] == (1, 7)


def test_top_neurons_refuses_layers_out_of_range_and_drops_repeats():
    """A 2-layer model: layer 2 (or -3) does not wrap around to another layer, and a repeated layer lists each
    neuron once."""
    model, ids = llama(), token_ids('llama', 6, 1)
    exp = explain(model, ids, latent='mlp')
    for layers in ([2], [-3], [0, 5]):
        with pytest.raises(ValueError, match=r'layers of the mlp site, 0 to 1 \(or -2 to -1 from the end\)'):
            top_neurons(exp, layers=layers)
    expected = exp.latent['mlp'][0, 1].sum(0).topk(5).indices.tolist()  # [units] of layer 1, summed over positions
    for layers in ([1], [1, 1], [-1, 1]):
        assert [(item.layer, item.index) for item in top_neurons(exp, k=5, layers=layers)] == [
            (1, index) for index in expected
        ]
    every = top_neurons(exp, k=1000, layers=[0, 0, 1])
    assert len(every) == 2 * 64 and len({(item.layer, item.index) for item in every}) == 2 * 64


def test_top_neurons_rows_of_a_conditional_explanation():
    """With ``condition=`` row ``r * C + c`` is input row ``r`` under condition ``c``; its latent relevance is the
    input row's (the prediction's own backward pass)."""
    model, ids = llama(), token_ids('llama', 5, 2)
    conditions = [Neuron('mlp', 1, 3), Neuron('mlp', 1, 4), Neuron('attention', 0, 1)]
    exp = explain(model, ids, condition=conditions, latent='mlp')
    plain = explain(model, ids, latent='mlp')
    assert exp.relevance.shape[0] == 6
    for row in range(6):
        assert top_neurons(exp, k=5, row=row) == top_neurons(plain, k=5, row=row // 3)
    assert top_neurons(exp, k=5, row=-1) == top_neurons(plain, k=5, row=1)
    with pytest.raises(ValueError, match=r'row 6 is out of range for 6 explained rows \(0 to 5\)'):
        top_neurons(exp, row=6)


def test_top_neurons_errors():
    model, ids = llama(), token_ids('llama', 5, 1)
    with pytest.raises(ValueError, match='no latent relevance'):
        top_neurons(explain(model, ids))
    exp = explain(model, ids, latent=('mlp', 'residual'))
    with pytest.raises(KeyError, match='was not recorded'):
        exp.latent['attention']
    with pytest.raises(ValueError, match='no neurons to rank'):
        top_neurons(exp, site='residual')
    with pytest.raises(ValueError, match='k must be a positive integer'):
        top_neurons(exp, k=0)


def test_sites_that_hold_other_positions_than_the_tokens_are_refused_per_position():
    """CPM-Ant runs its blocks over 32 prompt positions in front of the tokens (38 positions for 6 tokens): the
    recorded latent relevance had 38 positions where ``[batch, layers, seq]`` names the tokens, and a Neuron target
    read its position among them. Per position both are refused, naming the site and both lengths; the sum over
    positions (``latent_reduce='sum'``) is recorded, and under CP-LRP the MLP neurons of a layer sum to the logit
    (float64, no biases)."""
    model_type, config_type = model_class('causal-lm', 'cpmant')
    torch.manual_seed(0)
    model = model_type(tiny_config(config_type)).double().eval()
    zero_biases(model)
    ids = token_ids('llama', 6)
    with pytest.raises(ValueError, match='mlp layer 0 holds 38 positions where the input has 6 tokens'):
        explain(model, ids, method='cplrp', latent='mlp')
    with pytest.raises(UnsupportedModelError, match='has 38 positions for an input of 6 tokens'):
        explain(model, ids, method='cplrp', target=Neuron('mlp', 0, 1))
    exp = explain(model, ids, method='cplrp', latent='residual', latent_reduce='sum')
    sums = exp.latent['residual'][0]
    assert sums.shape == (3,) and torch.allclose(sums, exp.logit.expand(3), rtol=1e-9, atol=0)


def test_a_site_changed_in_place_after_it_is_read_as_given_out_or_refused():
    """A module output the forward pass changes in place after the site (Falcon adds the attention output to its
    MLP's output in place): the kept tensor and its relevance are those of the value the module gave out, x * g with
    g the gradient of that value; without a kept copy the relevance is refused (it read the changed tensor)."""

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3, bias=False, dtype=torch.float64)

        def forward(self, x):
            y = self.linear(x)
            y += 1.0
            return (y * y).sum()

    torch.manual_seed(0)
    toy, x = Toy(), torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    point = SitePoint('value', 0, toy.linear, 'output')
    given = toy.linear(x).detach()
    recorder = Recorder({'value': [point]}, keep={('value', 0)})
    with recorder.recording(toy):
        toy(x).backward()
    torch.testing.assert_close(recorder.tensors[('value', 0)], given, rtol=0, atol=0)
    torch.testing.assert_close(recorder.gradients[('value', 0)], 2 * (given + 1), rtol=0, atol=0)
    torch.testing.assert_close(recorder.latent()['value'][:, 0], given * 2 * (given + 1), rtol=0, atol=0)
    recorder = Recorder({'value': [point]})
    with recorder.recording(toy), pytest.raises(RuntimeError, match='changed in place'):
        toy(x).backward()
