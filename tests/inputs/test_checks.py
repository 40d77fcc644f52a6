"""The checks of ``zennit_attn.inputs.checks`` that every explanation request passes: foreign rule hooks on the model, the
position limit of the model's configuration, causal models told apart from encoders (left padding)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import transformers
from zennit.composites import EpsilonPlusFlat, NameMapComposite
from zennit.rules import Epsilon

from tests.models import tiny_model, token_ids
from zennit_attn import explain
from zennit_attn.engine.composites import AttnLRPEpsilon
from zennit_attn.inputs.checks import check_length, check_model, is_causal, rule_hooks, sees_later_tokens
from zennit_attn.zoo import tiny_config


@pytest.fixture(scope='module')
def ids():
    return token_ids('llama', 6, 1, seed=3)


@pytest.mark.parametrize(
    'composite',
    [
        lambda: NameMapComposite([(['lm_head'], Epsilon(0.5))]),
        EpsilonPlusFlat,
        AttnLRPEpsilon,
    ],
    ids=['NameMapComposite', 'EpsilonPlusFlat', 'AttnLRPEpsilon'],
)
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


#: causal language models whose modules have no ``is_causal`` attribute (they mask in their own code):
#: (configuration class, model class)
MASKED_IN_THEIR_CODE = {
    'openai-gpt': ('OpenAIGPTConfig', 'OpenAIGPTLMHeadModel'),
    'doge': ('DogeConfig', 'DogeForCausalLM'),
    'gpt_neox_japanese': ('GPTNeoXJapaneseConfig', 'GPTNeoXJapaneseForCausalLM'),
    'xglm': ('XGLMConfig', 'XGLMForCausalLM'),
    'git': ('GitConfig', 'GitForCausalLM'),
    'lfm3': ('Lfm3Config', 'Lfm3ForCausalLM'),
}


@contextlib.contextmanager
def _float64_default():
    """XGLM makes its mask in torch's default dtype from float64 values (an overflow in float32)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize('architecture', MASKED_IN_THEIR_CODE)
def test_left_padded_rows_equal_their_own_explanation_without_an_is_causal_attribute(architecture):
    """These models were refused as "not causal" with left padding (no module has ``is_causal``); asked directly,
    they are causal, and each left-padded row explains exactly as the row alone."""
    config_name, model_name = MASKED_IN_THEIR_CODE[architecture]
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(tiny_config(getattr(transformers, config_name))).double().eval()
    assert not any(getattr(module, 'is_causal', False) is True for module in model.modules())
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(4, 90, (length,), generator=generator) for length in (6, 4, 3)]  # 96 ids, 0-3 special
    ids = torch.zeros(3, 6, dtype=torch.long)
    mask = torch.zeros(3, 6, dtype=torch.long)
    for row, tokens in enumerate(rows):
        ids[row, 6 - len(tokens) :], mask[row, 6 - len(tokens) :] = tokens, 1
    with _float64_default() if architecture == 'xglm' else contextlib.nullcontext():
        assert is_causal(model) and sees_later_tokens(model) is False
        batch = explain(model, ids, attention_mask=mask, method='input_x_gradient')
        for row, tokens in enumerate(rows):
            alone = explain(model, tokens[None], method='input_x_gradient')
            torch.testing.assert_close(batch.logit[row], alone.logit[0], rtol=1e-12, atol=1e-13)
            torch.testing.assert_close(
                batch.relevance[row, 6 - len(tokens) :], alone.relevance[0], rtol=1e-10, atol=1e-13
            )
            assert bool((batch.relevance[row, : 6 - len(tokens)] == 0).all())


@pytest.mark.parametrize('family, head', [('bert', 'seq_cls'), ('bert', 'masked_lm'), ('distilbert', 'masked_lm')])
def test_encoders_are_not_causal_and_left_padding_is_refused(family, head):
    model = tiny_model(family, head)
    assert sees_later_tokens(model) is True and not is_causal(model)
    ids = token_ids(family, 4, 2)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match='is not causal .* would give left-padded rows shifted positions'):
        explain(model, ids, attention_mask=mask, method='input_x_gradient')
