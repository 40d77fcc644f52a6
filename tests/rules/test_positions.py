"""PA-LRP's positions (:py:mod:`zennit_attn.rules.positions`): the position encodings as explained inputs."""

import pytest
import torch

from tests.models import tiny_model
from tests.numbers import assert_close
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.rules.positions import PositionInputs
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config

TOKENS = torch.tensor([[5, 17, 3, 28, 9, 14, 22], [30, 4, 11, 7, 25, 6, 19]])


@pytest.mark.parametrize('family', ['llama', 'gpt_neox', 'qwen3_moe', 'gemma3'])
def test_rotary_positions_take_what_the_tokens_give_up(family):
    """RoPE multiplies the token path by the positions' cos and sin: with both carrying relevance the uniform rule
    gives each factor half. In one layer every other rule on the way from the rotation to the tokens conserves
    (linear maps without bias, the normalisation's identity rule), so the tokens and the positions of PA-LRP together
    hold exactly the tokens' relevance of AttnLRP, row by row, and the positions hold a share of it."""
    model = tiny_model(family, num_hidden_layers=1)
    attnlrp = explain(model, TOKENS, method='attnlrp')
    palrp = explain(model, TOKENS, method='palrp')
    positions = palrp.position_relevance
    assert positions.shape == TOKENS.shape
    assert_close(palrp.relevance.sum(-1) + positions.sum(-1), attnlrp.relevance.sum(-1), 1e-12)
    assert float(positions.abs().sum()) > 1e-6 * float(attnlrp.relevance.abs().sum())
    assert not torch.allclose(palrp.relevance, attnlrp.relevance, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ('family', 'table'),
    [('gpt2', lambda model: model.transformer.wpe), ('bert', lambda model: model.bert.embeddings.position_embeddings)],
)
def test_learned_positions_take_what_a_constant_absorbed(family, table):
    """A learned table is added to the word embeddings: the sum's relevance is shared in proportion to the addends
    (Eq. 8), so the tokens keep AttnLRP's relevance exactly and the positions get ``p * g`` with the same modified
    gradient ``g`` at the sum (read off the tokens' own relevance, ``e * g``)."""
    model = tiny_model(family)
    attnlrp = explain(model, TOKENS, method='attnlrp')
    palrp = explain(model, TOKENS, method='palrp')
    assert_close(palrp.relevance, attnlrp.relevance, 1e-12)
    embeddings = model.get_input_embeddings()(TOKENS).detach()
    gradient = palrp.embedding_relevance / embeddings
    expected = (table(model).weight.detach()[: TOKENS.shape[1]] * gradient).sum(-1)
    assert_close(palrp.position_relevance, expected, 1e-9)
    assert float(expected.abs().sum()) > 0


def test_rows_are_explained_as_alone():
    """Encodings computed once for all rows are repeated per row: each row's positions get its own relevance."""
    model = tiny_model('llama')
    both = explain(model, TOKENS, method='palrp')
    for row in range(2):
        alone = explain(model, TOKENS[row : row + 1], method='palrp')
        assert_close(both.position_relevance[row], alone.position_relevance[0], 1e-12)
        assert_close(both.relevance[row], alone.relevance[0], 1e-12)


def test_constant_gates_give_the_rotations_nothing():
    """CP-LRP holds the attention probabilities constant: the queries and keys, and with them the rotations, carry no
    relevance."""
    model = tiny_model('llama')
    explanation = explain(model, TOKENS, method='cplrp', composite=CPLRPEpsilon(positions=True))
    assert float(explanation.position_relevance.abs().max()) == 0
    assert_close(explanation.relevance, explain(model, TOKENS, method='cplrp').relevance, 1e-12)


def test_models_without_a_known_encoding_and_composites_without_positions_are_refused():
    model = tiny_model('t5')  # relative position biases: no input of the explanation
    hooks = {name: dict(module._forward_hooks) for name, module in model.named_modules()}
    with pytest.raises(ValueError, match='T5ForConditionalGeneration has no position encoding'):
        explain(model, TOKENS[:1], method='palrp')
    assert hooks == {name: dict(module._forward_hooks) for name, module in model.named_modules()}
    with pytest.raises(ValueError, match=r"method='palrp' .* needs positions=True"):
        explain(tiny_model('llama'), TOKENS, method='palrp', composite=AttnLRPEpsilon())


def _zoo_model(architecture: str) -> torch.nn.Module:
    """The architecture check's tiny random model of ``architecture`` (a causal LM), in float64."""
    model_type, config_type = model_class('causal-lm', architecture)
    torch.manual_seed(0)
    return model_type(tiny_config(config_type)).double().eval()


def test_rotations_as_complex_numbers_are_refused():
    """DeepSeek-V2 and Llama 4 compute their rotary embeddings as complex numbers (``freqs_cis``), which are no
    floating-point input: PA-LRP would pass them as constants and give the positions nothing (before: no position
    relevance, without a word)."""
    model = _zoo_model('llama4_text')
    with pytest.raises(ValueError, match='model.rotary_emb returns its rotations as complex numbers'):
        explain(model, TOKENS[:1, :5], method='palrp')


def test_an_encoding_that_does_not_run_is_refused():
    """LFM3's tiny configuration has convolutions only: its rotary embedding is never called, so there is no
    position relevance to read (before: none, without a word)."""
    model = _zoo_model('lfm3')
    assert set(model.config.layer_types) == {'conv'}
    with pytest.raises(ValueError, match=r'no position encoding of the model ran .*model.rotary_emb found, not'):
        explain(model, TOKENS[:1, :5], method='palrp')


def test_the_encodings_are_restored_after_the_explanation():
    model = tiny_model('llama')
    rotary = model.model.rotary_emb
    before = (dict(rotary._forward_hooks), dict(model._forward_pre_hooks))
    composite = AttnLRPEpsilon(positions=True)
    explain(model, TOKENS, composite=composite, method='palrp')
    assert (dict(rotary._forward_hooks), dict(model._forward_pre_hooks)) == before
    assert 'positions: PA-LRP' in composite.describe()


class _SharedTable(torch.nn.Module):
    """A toy model whose position table gives one ``[seq, hidden]`` tensor for all rows (no batch dimension)."""

    def __init__(self):
        super().__init__()
        self.wpe = torch.nn.Embedding(8, 4)

    def forward(self, embeddings):
        return embeddings + self.wpe(torch.arange(embeddings.shape[1]))


def test_a_table_without_rows_is_read_for_one_row_and_refused_for_several():
    model = _SharedTable().double()
    positions = PositionInputs()
    handles = positions.register(model, list(model.named_modules()))
    try:
        embeddings = torch.randn(1, 5, 4, dtype=torch.float64, requires_grad=True)
        output = model(embeddings)
        (leaf,) = [leaf for _, _, leaf in positions.recorded]
        (relevance,) = torch.autograd.grad(output, [leaf], torch.ones_like(output))
        assert_close(positions.per_position([relevance]), model.wpe.weight[:5].detach().sum(-1)[None], 1e-12)
        with pytest.raises(ValueError, match=r'one \[5, 4\] tensor for all rows of the batch'):
            model(torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True))
    finally:
        handles.remove()
    assert not model.wpe._forward_hooks and not model._forward_pre_hooks


def test_views_of_position_token_pairs():
    model = tiny_model('llama')
    explanation = explain(model, TOKENS, method='palrp')
    pairs = explanation.with_positions()
    assert torch.equal(pairs.relevance, explanation.relevance + explanation.position_relevance)
    assert pairs.top(1)[0][0] == int(pairs.relevance[0].argmax())
    with pytest.raises(ValueError, match="has no position relevance: explain with method='palrp'"):
        explain(model, TOKENS, method='attnlrp').with_positions()
