"""The checks of ``zennit_attn.checks`` that every explanation request passes: foreign rule hooks on the model, the
position limit of the model's configuration."""
from __future__ import annotations

import pytest
import torch
from zennit.composites import EpsilonPlusFlat, NameMapComposite
from zennit.rules import Epsilon

from tests.models import tiny_model, token_ids
from zennit_attn import explain
from zennit_attn.checks import check_length, check_model, rule_hooks
from zennit_attn.composites import AttnLRPEpsilon


@pytest.fixture(scope='module')
def ids():
    return token_ids('llama', 6, 1, seed=3)


@pytest.mark.parametrize('composite', [
    lambda: NameMapComposite([(['lm_head'], Epsilon(0.5))]), EpsilonPlusFlat, AttnLRPEpsilon,
], ids=['NameMapComposite', 'EpsilonPlusFlat', 'AttnLRPEpsilon'])
@pytest.mark.parametrize('method', ['attnlrp', 'input_x_gradient', 'random'])
def test_foreign_rule_hooks_are_refused(llama, ids, composite, method):
    """Inside the context of any composite (zennit's own or ours), explain() would compute through its hooks (a
    silent wrong answer); it refuses and names a hooked module. Afterwards the model explains as before."""
    expected = explain(llama, ids, method=method).relevance
    with composite().context(llama):
        assert rule_hooks(llama)
        with pytest.raises(RuntimeError, match=r'LlamaForCausalLM already has zennit rules registered \(.* at '):
            explain(llama, ids, method=method)
    assert rule_hooks(llama) == []
    torch.testing.assert_close(explain(llama, ids, method=method).relevance, expected)


def test_the_refusal_names_the_hooked_module(llama):
    with NameMapComposite([(['lm_head'], Epsilon(0.5))]).context(llama):
        with pytest.raises(RuntimeError, match=r"\(Epsilon at 'lm_head'\).*leave that context"):
            check_model(llama)
    check_model(llama)


def test_a_negative_position_limit_means_none(ids):
    """XLNet's ``max_position_embeddings = -1`` means unlimited (relative positions); so does no limit at all."""
    model = tiny_model('llama')
    model.config.max_position_embeddings = -1
    check_length(model, 10_000, 'input_ids')
    assert explain(model, ids).relevance.shape == ids.shape
    check_length(torch.nn.Linear(2, 2), 10_000, 'input_ids')  # no configuration
    model.config.max_position_embeddings = 4
    with pytest.raises(ValueError, match='input_ids has 6 positions, more than the 4 LlamaForCausalLM was built for'):
        explain(model, ids)
