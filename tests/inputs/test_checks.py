"""The checks of ``zennit_attn.inputs.checks`` that every explanation request passes: foreign rule hooks on the model,
the position limit of the model's configuration, causal models told apart from encoders (left padding), and the facts
of a model kept between calls while the model stays the same."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch
import transformers
from zennit.composites import EpsilonPlusFlat, NameMapComposite
from zennit.rules import Epsilon

from tests.architectures import tiny_architecture
from tests.models import tiny_model, token_ids
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon
from zennit_attn.core.quantization import UnsupportedQuantizationError
from zennit_attn.inputs.checks import (
    check_length,
    check_model,
    is_causal,
    keeps_left_padding,
    model_facts,
    rule_hooks,
    sees_later_tokens,
    split_encoding,
)
from zennit_attn.inputs.lookups import id_tables
from zennit_attn.workflows.architecture_check.configs import tiny_config


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


#: recurrent and hybrid architectures whose sequence mixing reads the attention mask: a left-padded row equals the
#: row alone, to this share of its largest relevance (the gated delta rules compute in float32 also in float64)
KEEPS_LEFT_PADDING = {
    'mamba': 1e-10,
    'falcon_mamba': 1e-10,
    'mamba2': 1e-10,
    'jamba': 1e-10,
    'zamba': 1e-10,
    'zamba2': 1e-10,
    'bamba': 1e-10,
    'falcon_h1': 1e-10,
    'nemotron_h': 1e-10,
    'lfm2': 1e-10,
    'qwen3_next': 1e-6,
    'qwen3_5': 1e-6,
    'kimi_linear': 1e-6,
    'olmo_hybrid': 1e-6,
}
#: recurrent architectures whose sequence mixing does not read the attention mask: RWKV's and xLSTM's recurrences,
#: RecurrentGemma's convolution before its RG-LRU (which resets at position 0)
MIXES_LEFT_PADDING = ('rwkv', 'xlstm', 'recurrent_gemma')


def _recurrent(architecture: str) -> torch.nn.Module:
    model = tiny_architecture(architecture)
    model.config._experts_implementation = 'eager'  # grouped-mm kernels refuse float64
    return model


def _padded(rows: list[torch.Tensor], left: bool, pad: int = 5) -> tuple[torch.Tensor, torch.Tensor, list[slice]]:
    """``(ids, attention_mask, spans)`` of ``rows`` padded with ``pad`` (an ordinary token: its embedding is not zero)
    on the left or right."""
    width = max(len(tokens) for tokens in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    spans = [slice(width - len(tokens), width) if left else slice(0, len(tokens)) for tokens in rows]
    for row, (tokens, span) in enumerate(zip(rows, spans)):
        ids[row, span], mask[row, span] = tokens, 1
    return ids, mask, spans


def _rows_equal_alone(model, rows: list[torch.Tensor], left: bool, tolerance: float) -> None:
    """Each row of a padded batch explains as the row alone (CP-LRP, the same target), and the pads get 0."""
    ids, mask, spans = _padded(rows, left)
    batch = explain(model, ids, attention_mask=mask, method='cplrp', target=7)
    for row, (tokens, span) in enumerate(zip(rows, spans)):
        alone = explain(model, tokens[None], method='cplrp', target=7)
        scale = float(alone.relevance.abs().max())
        assert abs(float(batch.logit[row] - alone.logit[0])) <= tolerance * abs(float(alone.logit[0]))
        assert float((batch.relevance[row, span] - alone.relevance[0]).abs().max()) <= tolerance * scale
        pads = torch.ones(ids.shape[1], dtype=torch.bool)
        pads[span] = False
        assert bool((batch.relevance[row, pads] == 0).all())


def _rows(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 90, (length,), generator=generator) for length in (6, 4, 3)]


@pytest.mark.parametrize('architecture', KEEPS_LEFT_PADDING)
def test_left_padded_rows_of_recurrences_that_read_the_mask_equal_the_rows_alone(architecture):
    model = _recurrent(architecture)
    assert keeps_left_padding(model) is True
    _rows_equal_alone(model, _rows(), left=True, tolerance=KEEPS_LEFT_PADDING[architecture])


@pytest.mark.parametrize('architecture', MIXES_LEFT_PADDING)
def test_left_padding_is_refused_where_the_recurrence_mixes_the_pads_into_the_row(architecture):
    """Before, RWKV's left-padded row had the logit 1.263 where the row alone has 1.378, and its relevance summed to
    1.110; right padding (after the explained token) gives each row's own explanation."""
    model = _recurrent(architecture)
    assert keeps_left_padding(model) is False
    ids, mask, _ = _padded(_rows(), left=True)
    name = type(model).__name__
    with pytest.raises(
        ValueError,
        match=f'pads rows on the left, and {name} does not keep the pads out .* one at a '
        'time, or pad them on the right',
    ):
        explain(model, ids, attention_mask=mask, method='cplrp')
    with pytest.raises(ValueError, match=f'{name} does not keep the pads out'):
        explain(model, ids, attention_mask=mask, method='input_x_gradient')
    _rows_equal_alone(model, _rows(), left=False, tolerance=1e-10)


def test_the_left_padding_probe_pads_with_an_ordinary_token():
    """RecurrentGemma's padding_idx 0 has a zero embedding, which its convolution would carry into the row unseen: the
    probe pads with other tokens; the facts keep its answer (one probe per model)."""
    model = _recurrent('recurrent_gemma')
    assert model.get_input_embeddings().padding_idx == 0
    probes = []
    model.base_model.register_forward_pre_hook(lambda module, args, kwargs: probes.append(kwargs), with_kwargs=True)
    assert keeps_left_padding(model) is False and keeps_left_padding(model) is False
    assert len(probes) == 3
    assert all(int(kwargs['input_ids'][0, 0]) != 0 for kwargs in probes[1:])


# ------------------------------------------------------------------------------------------------ facts of a model
def test_the_causality_probe_runs_once_until_the_model_changes():
    """The probe is a forward pass of the model: it runs once while the model stays the same, and again after a change
    of its configuration (BERT's ``is_decoder`` makes its mask causal; the attention implementation) or of a module."""
    model = tiny_model('bert', 'masked_lm')
    probes = []
    model.base_model.register_forward_pre_hook(lambda module, args, kwargs: probes.append(1), with_kwargs=True)
    answers = [is_causal(model), is_causal(model), sees_later_tokens(model), is_causal(model)]
    assert answers == [False, False, True, False]
    assert len(probes) == 1
    model.config.is_decoder = True
    assert is_causal(model) and sees_later_tokens(model) is False and len(probes) == 2
    model.config.is_decoder = False
    assert not is_causal(model) and len(probes) == 3
    facts = model_facts(model)
    assert model_facts(model) is facts
    model.config._attn_implementation = 'sdpa'
    assert model_facts(model) is not facts
    assert not is_causal(model) and len(probes) == 4
    model.bert.encoder.layer[0].output.dropout = torch.nn.Dropout(0.0).eval()  # a module replaced
    assert not is_causal(model) and len(probes) == 5
    assert not is_causal(model) and len(probes) == 5


def test_a_weight_changed_in_place_is_checked_again():
    """Quantized layers and weights on the meta device are checked once per model, and again when a weight is cast in
    place (as bitsandbytes quantizes on a move: same parameter, new dtype) or replaced."""
    model = tiny_model('llama', dtype=torch.float32)
    check_model(model)
    weight = model.model.layers[0].mlp.down_proj.weight
    weight.requires_grad_(False)
    weight.data = weight.data.to(torch.int8)
    with pytest.raises(
        UnsupportedQuantizationError, match=r"at model\.layers\.0\.mlp\.down_proj\): its 'weight' holds"
    ):
        check_model(model)
    model = tiny_model('llama', dtype=torch.float32)
    check_model(model)
    model.model.norm.weight = torch.nn.Parameter(torch.empty(model.model.norm.weight.shape, device='meta'))
    with pytest.raises(ValueError, match="tensors on the meta device \\(e.g. 'model.norm.weight'\\)"):
        check_model(model)


def test_a_weight_replaced_while_the_old_one_lives_gives_new_facts():
    """The key holds each tensor by its id and a weak reference: a weight replaced by an equal one while the old one is
    alive gives new facts (and compares no tensors: two tensors compare element by element)."""
    model = tiny_model('llama')
    facts = check_model(model)
    kept = [model.model.norm.weight]  # the replaced weights stay alive
    for replacement in (kept[0].detach().clone(), kept[0].detach()[:1].clone()):  # the same values; one element
        model.model.norm.weight = torch.nn.Parameter(replacement)
        assert check_model(model) is not facts
        facts = check_model(model)
        assert check_model(model) is facts
        kept.append(model.model.norm.weight)


def test_the_checks_in_every_call_are_not_kept():
    """Training mode and rule hooks can change without a change of the model's facts: each call checks them."""
    model = tiny_model('llama')
    facts = check_model(model)
    model.model.layers[0].mlp.train()
    with pytest.raises(ValueError, match="submodule 'model.layers.0.mlp'.*training mode"):
        check_model(model)
    model.eval()
    with NameMapComposite([(['lm_head'], Epsilon(0.5))]).context(model):
        with pytest.raises(RuntimeError, match=r"\(Epsilon at 'lm_head'\)"):
            check_model(model)
    assert check_model(model) is facts


def test_the_facts_keep_no_model_alive(ids):
    """The facts are held by a weak reference to the model and name its modules instead of holding them."""
    model = tiny_model('llama')
    explain(model, ids)
    assert is_causal(model) and id_tables(model, model.get_input_embeddings()) == []
    reference = weakref.ref(model)
    del model
    gc.collect()
    assert reference() is None


def test_a_field_given_twice_must_agree():
    """The attention mask given as an argument and in the input mapping must agree, and so must any other field given
    in model_kwargs and in the mapping (before, model_kwargs' token_type_ids won without a word)."""
    encoding = {'input_ids': torch.tensor([[5, 6, 7]]), 'token_type_ids': torch.tensor([[0, 0, 1]])}
    ids, mask, kwargs = split_encoding(encoding, None, {'token_type_ids': torch.tensor([[0, 0, 1]])})
    assert mask is None and torch.equal(kwargs['token_type_ids'], encoding['token_type_ids'])
    with pytest.raises(ValueError, match='token_type_ids was given twice'):
        split_encoding(encoding, None, {'token_type_ids': torch.tensor([[0, 1, 1]])})
    with pytest.raises(ValueError, match='attention_mask was given twice'):
        split_encoding(dict(encoding, attention_mask=torch.ones(1, 3)), torch.tensor([[1, 1, 0]]))
