"""Blocks that the forward pass runs without their module call: SqueezeBERT's encoder calls ``layer.forward(...)``, so
no hook on its blocks runs. Before, the latent sites, Neuron targets, steering and activation patching by layer read
its stack and failed with an unnamed ``RuntimeError`` ("the forward pass did not reach residual layer 0"; the
attention and FFN sites with "0 attention operations"), and the conservation report read 0.0 at every block boundary
of a logit of 0.22 (a silent wrong answer). Both are now refused by name, saying why (tiny random float64 model).
"""

from __future__ import annotations

import pytest
import torch

from tests.models import zoo_model
from zennit_attn import conservation, explain
from zennit_attn.composites import CPLRPEpsilon
from zennit_attn.latent import Neuron, steer
from zennit_attn.workflows.patching import activation_patching

CALL = 'did not run through their module call'


@pytest.fixture(scope='module')
def squeezebert():
    model, inputs = zoo_model('masked-lm', 'squeezebert')
    return model, inputs['input_ids'][:1]


@pytest.mark.parametrize('site', ['residual', 'mlp', 'attention', 'query'])
def test_latent_sites_are_refused_by_name(squeezebert, site):
    model, ids = squeezebert
    with pytest.raises(ValueError, match=f"SqueezeBertForMaskedLM \\('transformer.encoder.layers'.*{CALL}"):
        explain(model, ids, method='cplrp', latent=site)


def test_neuron_targets_steering_and_patching_are_refused_by_name(squeezebert):
    model, ids = squeezebert
    with pytest.raises(ValueError, match=CALL):
        explain(model, ids, method='cplrp', target=Neuron('residual', 0, 0), position=0)
    with pytest.raises(ValueError, match=CALL), steer(model, {Neuron('residual', 1, 0): 0.0}):
        model(ids)
    corrupted = ids.flip(1)
    with pytest.raises(ValueError, match=CALL):
        activation_patching(model, ids, corrupted, [5], [6], components=('residual',), progress=False)


def test_conservation_report_is_refused_by_name(squeezebert):
    """The report read 0.0 at every boundary (its hooks never ran); the explanation itself conserves."""
    model, ids = squeezebert
    with pytest.raises(ValueError, match='ran none of its transformer blocks'):
        conservation(model, ids, composite=CPLRPEpsilon())
    explanation = explain(model, ids, method='cplrp')
    torch.testing.assert_close(explanation.relevance.sum(), explanation.logit.sum(), rtol=1e-10, atol=1e-10)
