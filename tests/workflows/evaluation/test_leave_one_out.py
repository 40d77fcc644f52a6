"""Leave-one-out drops against single forward passes by hand, their agreement with relevance, and the implementation
invariance of the rewrites of a tiny Llama."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from zennit.attribution import Gradient

from tests.models import tiny_model, token_ids
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.workflows.evaluation import LeaveOneOutAgreement, leave_one_out, mean_sem, token_drops
from zennit_attn.workflows.evaluation.invariance import (
    REWRITES,
    fused_projections,
    implementation_invariance,
    repeated_key_value_heads,
    scaled_query_key,
)


@pytest.fixture(scope='module')
def llama():
    return tiny_model('llama', attn_implementation='sdpa')


@pytest.fixture(scope='module')
def padded(llama):
    """Two rows of 7 tokens, the second right-padded to 5, explained by input x gradient."""
    ids = token_ids('llama', 7, 2)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return explain(llama, ids, attention_mask=mask, method='input_x_gradient')


def by_hand(model, ids, target):
    """``(zeroed, deleted)`` drops of one unpadded row, one forward pass per token; the last position explained."""
    embedding = model.get_input_embeddings()
    with torch.no_grad():
        full = model(input_ids=ids[None]).logits[0, -1, target]
        zeroed, deleted = [], []
        for token in range(len(ids)):
            inputs = embedding(ids[None]).clone()
            inputs[0, token] = 0
            zeroed.append(float(full - model(inputs_embeds=inputs).logits[0, -1, target]))
            if token < len(ids) - 1:
                shorter = torch.cat([ids[:token], ids[token + 1 :]])
                deleted.append(float(full - model(input_ids=shorter[None]).logits[0, -1, target]))
    return torch.tensor(zeroed, dtype=torch.float64), torch.tensor(deleted + [math.nan], dtype=torch.float64)


def test_drops_equal_single_forward_passes(llama, padded):
    drops = token_drops(llama, padded, progress=False)
    assert len(drops) == 2
    for row, length in ((0, 7), (1, 5)):
        ids = padded.input_ids[row, :length]
        zeroed, deleted = by_hand(llama, ids, int(padded.target[row]))
        torch.testing.assert_close(drops[row].drops['zeroed'][:length], zeroed, rtol=0, atol=1e-12)
        torch.testing.assert_close(drops[row].drops['deleted'][:length], deleted, rtol=0, atol=1e-12, equal_nan=True)
        assert bool(drops[row].drops['zeroed'][length:].isnan().all())  # padding takes no part
        assert drops[row].score['zeroed'] == pytest.approx(float(padded.logit[row]), abs=1e-12)
    # chunked forward passes give the same drops
    chunked = token_drops(llama, padded, batch_size=2, progress=False)
    for one, other in zip(drops, chunked):
        for mode in ('zeroed', 'deleted'):
            torch.testing.assert_close(one.drops[mode], other.drops[mode], rtol=0, atol=1e-13, equal_nan=True)


def test_deletion_and_zeroing_differ_where_they_must(llama):
    """A token whose word embedding is already zero: zeroing it changes nothing (drop exactly 0), deleting it shortens
    the sequence and moves every later token's position (a rotary model's output changes)."""
    model = copy.deepcopy(llama)
    ids = token_ids('llama', 6)
    with torch.no_grad():
        model.get_input_embeddings().weight[int(ids[0, 2])] = 0
    drops = token_drops(model, explain(model, ids, method='random'), progress=False)[0]
    assert drops.drops['zeroed'][2] == 0
    assert abs(float(drops.drops['deleted'][2])) > 1e-6
    assert math.isnan(drops.drops['deleted'][5]) and not math.isnan(drops.drops['zeroed'][5])  # the explained token


def test_relevance_equal_to_the_drops_agrees_perfectly(llama, padded):
    drops = token_drops(llama, padded, progress=False)
    first = drops[0].agreement(drops[0].drops['zeroed'].nan_to_num(0.0))
    assert first.spearman['zeroed'] == pytest.approx(1.0) and first.pearson['zeroed'] == pytest.approx(1.0)
    assert first.tokens == {'zeroed': 7, 'deleted': 6}
    second = drops[1].agreement(-drops[1].drops['deleted'].nan_to_num(0.0))
    assert second.spearman['deleted'] == pytest.approx(-1.0) and second.pearson['deleted'] == pytest.approx(-1.0)
    constant = drops[0].agreement(torch.ones(7))
    assert math.isnan(constant.spearman['zeroed']) and math.isnan(constant.pearson['deleted'])
    summary = LeaveOneOutAgreement.of([first, second, constant])
    expected = mean_sem([first.pearson['deleted'], second.pearson['deleted']])
    assert summary.pearson['deleted'] == pytest.approx(expected)
    assert summary.count == {'zeroed': 2, 'deleted': 2}
    # leave_one_out scores each row's own relevance
    result = leave_one_out(llama, padded, progress=False)
    own = [drops[row].agreement(padded.relevance[row]) for row in range(2)]
    assert result.spearman['zeroed'] == pytest.approx(mean_sem([a.spearman['zeroed'] for a in own]))


def test_other_explanations_and_refusals(llama, padded):
    drops = token_drops(llama, padded, modes='zeroed', progress=False)
    assert drops[0].modes == ('zeroed',)
    other = explain(llama, padded.input_ids[:1], method='random')
    assert drops[0].agreement_of(other).spearman['zeroed'] == pytest.approx(
        drops[0].agreement(other.relevance[0]).spearman['zeroed']
    )
    wrong = explain(llama, padded.input_ids[:1], target=int(padded.target[0]) + 1, method='random')
    with pytest.raises(ValueError, match='target'):
        drops[0].agreement_of(wrong)
    contrast = explain(llama, padded.input_ids[:1], target=int(padded.target[0]), contrast=3, method='random')
    with pytest.raises(ValueError, match='objective'):
        drops[0].agreement_of(contrast)
    with pytest.raises(ValueError, match='modes'):
        token_drops(llama, padded, modes='removed', progress=False)
    pairs = explain(llama, padded.input_ids[:1], target=[(4, 5), (6, 7)], method='random')
    with pytest.raises(ValueError, match='pairs'):
        token_drops(llama, pairs, modes='deleted', progress=False)


@pytest.fixture(scope='module')
def small_llama():
    return tiny_model('llama')


def test_rewrites_are_exact_and_change_the_weights(small_llama):
    scaled = scaled_query_key(small_llama, 3.0)
    original, other = small_llama.model.layers[0].self_attn, scaled.model.layers[0].self_attn
    torch.testing.assert_close(other.q_proj.weight, 3.0 * original.q_proj.weight, rtol=0, atol=0)
    torch.testing.assert_close(other.k_proj.weight, original.k_proj.weight * (1 / 3.0), rtol=0, atol=0)
    fused = fused_projections(small_llama)
    assert type(fused).__name__ == 'Phi3ForCausalLM'
    repeated = repeated_key_value_heads(small_llama)
    heads, shared = small_llama.config.num_attention_heads, small_llama.config.num_key_value_heads
    assert repeated.config.num_key_value_heads == heads > shared
    value = small_llama.model.layers[1].self_attn.v_proj.weight.reshape(shared, -1, small_llama.config.hidden_size)
    repeated_value = repeated.model.layers[1].self_attn.v_proj.weight.reshape(heads, -1, small_llama.config.hidden_size)
    assert torch.equal(repeated_value[heads // shared], value[1])  # query head 2's key/value head is shared head 1
    ids = token_ids('llama', 6)
    with torch.no_grad():
        reference = small_llama(ids).logits
        for model in (scaled, fused, repeated):
            torch.testing.assert_close(model(ids).logits, reference, rtol=0, atol=1e-10)


def test_invariance_of_gradient_x_input_and_of_the_lrp_rules(small_llama):
    """Input x gradient depends on the function alone: no difference under any exact rewrite. The rewrites change
    linear maps only, which zennit-attn's LRP passes by the plain gradient: AttnLRP, CP-LRP and AttnLRP with constant
    attention in the later blocks are invariant too."""
    results = implementation_invariance(small_llama, token_ids('llama', 6), factor=3.0)
    assert [result.rewrite for result in results] == list(REWRITES) and len(REWRITES) == 4
    for result in results:
        assert result.output_difference <= 1e-10
        assert result.difference['input_x_gradient'] <= 1e-12 * result.scale['input_x_gradient']
        assert result.scale['attnlrp'] > 0 and all(result.invariant.values())
        assert set(result.invariant) == {'attnlrp', 'cplrp', 'attnlrp_late', 'input_x_gradient'}
    with pytest.raises(ValueError, match='float64'):
        implementation_invariance(tiny_model('llama', dtype=torch.float32), token_ids('llama', 4))
    with pytest.raises(TypeError, match='Llama-style'):
        implementation_invariance(tiny_model('gpt2'), token_ids('gpt2', 4), rewrites=['folded_scaling'])


def test_encoder_deletion_keeps_the_explained_position_and_reindexes_token_types():
    """A BERT encoder explained at [CLS] (position 0) by a function of its last hidden state: every other token takes
    part (no causal mask), the explained position is never deleted, and per-token arguments (token_type_ids) lose the
    deleted token's entry."""
    model = tiny_model('bert', head='base')
    ids = token_ids('bert', 6)
    types = torch.tensor([[0, 0, 0, 1, 1, 1]])
    direction = torch.linspace(-1, 1, model.config.hidden_size, dtype=torch.float64)

    def score(hidden):
        return hidden @ direction

    explanation = explain(model, ids, target=score, position=0, method='random', model_kwargs={'token_type_ids': types})
    drops = token_drops(model, explanation, progress=False, model_kwargs={'token_type_ids': types})[0]
    with torch.no_grad():
        full = model(input_ids=ids, token_type_ids=types).last_hidden_state[0, 0] @ direction
        for token in range(1, 6):
            keep = [index for index in range(6) if index != token]
            shorter = model(input_ids=ids[:, keep], token_type_ids=types[:, keep]).last_hidden_state[0, 0] @ direction
            assert float(drops.drops['deleted'][token]) == pytest.approx(float(full - shorter), abs=1e-12)
    assert math.isnan(drops.drops['deleted'][0]) and bool(drops.drops['zeroed'].isfinite().all())


class Product(torch.nn.Module):
    """``x1 x2 x3``, associated to the left ``(x1 x2) x3`` or to the right ``x1 (x2 x3)``."""

    def __init__(self, left: bool):
        super().__init__()
        self.left = left

    def forward(self, x):
        first, second, third = x.unbind(-1)
        return ((first * second) * third if self.left else first * (second * third))[:, None]


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_the_papers_three_factor_product_is_invariant(composite):
    """Figure 1 of arXiv 2510.18810: a uniform rule that halves the relevance at each product of two input-dependent
    factors gives y = 24 at x = (2, 3, 4) the relevance (6, 6, 12) associated to the left and (12, 6, 6) to the right
    (as the engine did before). A product of products is one product of all their factors (Prop. 3.2 for N factors;
    CP-LRP keeps the uniform rule for products that are no gate): (8, 8, 8) both ways."""
    x = torch.tensor([[2.0, 3.0, 4.0]], dtype=torch.float64)
    relevance = {}
    for left in (True, False):
        with Gradient(Product(left), composite()) as attributor:
            _, relevance[left] = attributor(x.clone().requires_grad_(True), lambda output: output)
        torch.testing.assert_close(relevance[left], torch.tensor([[8.0, 8.0, 8.0]], dtype=torch.float64))
