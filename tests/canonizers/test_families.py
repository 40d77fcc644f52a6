"""Every supported family and head, end to end, on tiny random models (float64 unless stated).

1. Conservation with all biases zeroed: CP-LRP conserves the logit exactly; with AttnLRP the logit minus the
   input relevance equals what the softmax rule's hidden bias absorbs, computed independently of the library from
   the attention probabilities and the query/key projections; AttnLRP differs from CP-LRP.
2. Eager and SDPA attention give the same relevances.
3. bfloat16 models give finite relevances that correlate with the float32 ones.
4. The composite's context restores the model exactly (outputs, gradients, modules, parameters, hooks), also when
   the block or the forward raises; explaining another model in between changes nothing.
5. Unsupported models and configurations are refused with the offending classes / options named.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import transformers

from tests.conftest import DECODERS, FAMILY_HEADS, LAYERS, tiny_config, tiny_model, token_ids
from zennit_attn import conservation, explain
from zennit_attn.canonizers import UnsupportedModelError, canonizers_for
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon

SEQ = 12
#: heads beyond the required ones, checked for conservation too
EXTRA_HEADS = (('llama', 'seq_cls'), ('gpt2', 'seq_cls'))
HOOK_ATTRIBUTES = (
    '_forward_hooks', '_forward_pre_hooks', '_backward_hooks', '_backward_pre_hooks', '_forward_hooks_with_kwargs',
    '_forward_pre_hooks_with_kwargs', '_forward_hooks_always_called',
)
#: measured fractions, printed at the end of the module (run with -s to see them)
INPUT_FRACTIONS: dict[str, float] = {}
BF16_CORRELATIONS: dict[str, tuple[float, ...]] = {}


@pytest.fixture(scope='module', autouse=True)
def _report():
    yield
    if INPUT_FRACTIONS:
        print('\nAttnLRP input fraction (biases zeroed, float64, eager):')
        for key, value in INPUT_FRACTIONS.items():
            print(f'  {key:<20} {value:.6f}')
    if BF16_CORRELATIONS:
        print('bfloat16 vs float32 Pearson correlation (tokens, tokens without the largest, embedding entries):')
        for key, values in BF16_CORRELATIONS.items():
            print(f'  {key:<20} ' + ' '.join(f'{value:.6f}' for value in values))


def _id(pair):
    return '-'.join(pair)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest absolute value of ``a``."""
    return float((a.double() - b.double()).abs().max() / a.double().abs().max())


def _forward_kwargs(model) -> dict:
    return {'use_cache': False} if 'use_cache' in inspect.signature(model.forward).parameters else {}


def _select(logits: torch.Tensor, target: int) -> torch.Tensor:
    """The explained logit of row 0: last position for 3-D outputs."""
    return logits[0, target] if logits.dim() == 2 else logits[0, -1, target]


def _query_key_projections(model):
    """``(projection module, slice of its output's last dimension)`` for every query and key projection."""
    found = []
    for module in model.modules():
        if hasattr(module, 'q_proj') and hasattr(module, 'k_proj'):
            found += [(module.q_proj, slice(None)), (module.k_proj, slice(None))]
        elif isinstance(getattr(module, 'query', None), torch.nn.Linear) and isinstance(
                getattr(module, 'key', None), torch.nn.Linear):
            found += [(module.query, slice(None)), (module.key, slice(None))]
        elif isinstance(module, transformers.models.gpt2.modeling_gpt2.GPT2Attention):
            found.append((module.c_attn, slice(0, 2 * module.embed_dim)))
    return found


def _other_embeddings(model):
    word = model.get_input_embeddings()
    return [module for module in model.modules() if isinstance(module, torch.nn.Embedding) and module is not word]


def _manual_attnlrp(model, ids, target):
    """Run AttnLRP by hand and collect everything needed to check conservation independently of the library.

    Returns ``(logit, word relevance [s], other-embedding relevance, absorbed by the softmax rule per layer)``.
    """
    query_key, others = [], []
    handles = []

    def watch(store, section=slice(None)):
        def hook(module, input, output):
            detached = output.detach()
            output.register_hook(lambda grad: store.append(float((detached[..., section] * grad[..., section]).sum())))
        return hook

    # registered before the composite: these hooks see the raw projection outputs (before the Operand modules)
    for projection, section in _query_key_projections(model):
        handles.append(projection.register_forward_hook(watch(query_key, section)))
    for embedding in _other_embeddings(model):
        handles.append(embedding.register_forward_hook(watch(others)))
    try:
        with torch.enable_grad():
            embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
            with AttnLRPEpsilon().context(model) as modified:
                output = modified(inputs_embeds=embeddings, output_attentions=True, **_forward_kwargs(model))
                attentions = output.attentions
                assert attentions is not None and len(attentions) == LAYERS and all(
                    attention is not None and attention.requires_grad for attention in attentions), \
                    'output_attentions returned no attention weights in eager mode'
                for attention in attentions:
                    attention.retain_grad()
                logit = _select(output.logits, target)
                logit.backward(logit.detach())
    finally:
        for handle in handles:
            handle.remove()
    attention_relevance = [0.5 * float((attention * attention.grad).sum()) for attention in attentions]
    assert len(query_key) == len(_query_key_projections(model)) > 0
    # one value per projection, in backward order: sum per layer is not needed, only the total
    absorbed = sum(attention_relevance) - sum(query_key)
    return float(logit), embeddings.grad[0].sum(-1), sum(others), absorbed, attention_relevance


@pytest.mark.parametrize('family, head', FAMILY_HEADS + EXTRA_HEADS, ids=_id)
class TestConservation:
    """Biases zeroed, float64, eager attention: where the relevance goes."""

    @pytest.fixture
    def setup(self, family, head):
        model = tiny_model(family, head, torch.float64, 'eager', zero_bias=True)
        ids = token_ids(family, SEQ)
        return model, ids

    def test_bias_free(self, setup):
        model, _ = setup
        biases = [name for name, parameter in model.named_parameters() if name.endswith('bias')]
        assert all(float(model.get_parameter(name).abs().max()) == 0 for name in biases)

    def test_cp_lrp_conserves_the_logit(self, setup):
        model, ids = setup
        report = conservation(model, ids, composite=CPLRPEpsilon())
        logit = float(report.logit[0])
        assert abs(logit) > 1e-3
        total = float(report.sums[-2:, 0].sum())
        assert total == pytest.approx(logit, rel=1e-8, abs=0)
        # every layer boundary carries the whole logit as well
        torch.testing.assert_close(report.sums[:, 0][:-2], torch.full((len(report.names) - 2,), logit,
                                                                       dtype=torch.float64), rtol=1e-8, atol=0)

    def test_attnlrp_absorbs_exactly_the_softmax_bias(self, family, head, setup):
        model, ids = setup
        reference = explain(model, ids, composite=AttnLRPEpsilon())
        target = int(reference.target[0])
        logit, word, other, absorbed, attention_relevance = _manual_attnlrp(model, ids, target)
        input_relevance = float(word.sum()) + other
        assert logit == pytest.approx(float(reference.logit[0]), rel=1e-12, abs=0)
        assert input_relevance == pytest.approx(logit - absorbed, rel=1e-8, abs=1e-8 * abs(logit))
        fraction = input_relevance / logit
        INPUT_FRACTIONS[_id((family, head))] = fraction
        assert 0 < fraction < 1.5
        assert abs(fraction - 1) > 1e-4, 'the softmax rule absorbed nothing'
        assert all(value != 0 for value in attention_relevance)
        # explain() and conservation() agree with the hand-made run
        torch.testing.assert_close(reference.relevance[0], word, rtol=1e-10, atol=1e-14)
        report = conservation(model, ids, composite=AttnLRPEpsilon())
        assert float(report.sums[-1, 0]) == pytest.approx(other, rel=1e-10, abs=1e-14)
        assert float(report.input_fraction[0]) == pytest.approx(fraction, rel=1e-10, abs=0)
        if family in ('gpt2', 'bert', 'roberta'):
            assert other != 0, 'position embeddings received no relevance'
        else:
            assert other == 0 and not _other_embeddings(model)

    def test_attnlrp_differs_from_cp_lrp(self, setup):
        model, ids = setup
        attn = explain(model, ids, composite=AttnLRPEpsilon())
        cp = explain(model, ids, target=attn.target, composite=CPLRPEpsilon())
        assert torch.isfinite(attn.relevance).all() and torch.isfinite(cp.relevance).all()
        difference = (attn.relevance - cp.relevance).abs().max()
        assert difference > 1e-3 * attn.relevance.abs().max()


@pytest.fixture
def float64_softmax(monkeypatch):
    """Keep Hugging Face's eager softmax in float64: the Llama-like families compute it in float32
    (``softmax(..., dtype=torch.float32)``) even for float64 models, which alone moves the relevances by up to
    ~1e-7 relative against SDPA."""
    original = torch.nn.functional.softmax

    def softmax(input, dim=None, _stacklevel=3, dtype=None):
        if dtype is not None and input.dtype == torch.float64:
            dtype = None
        return original(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    monkeypatch.setattr(torch.nn.functional, 'softmax', softmax)


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda c: c.__name__)
@pytest.mark.parametrize('family, head', FAMILY_HEADS, ids=_id)
def test_eager_equals_sdpa(family, head, composite, float64_softmax):
    ids = token_ids(family, SEQ, batch=2)
    eager = explain(tiny_model(family, head, attn_implementation='eager'), ids, composite=composite())
    sdpa = explain(tiny_model(family, head, attn_implementation='sdpa'), ids, composite=composite())
    assert torch.equal(eager.target, sdpa.target)
    torch.testing.assert_close(eager.logit, sdpa.logit, rtol=1e-12, atol=0)
    assert _relative(eager.relevance, sdpa.relevance) < 1e-10
    assert _relative(eager.embedding_relevance, sdpa.embedding_relevance) < 1e-10


@pytest.mark.parametrize('family, head', FAMILY_HEADS, ids=_id)
def test_eager_equals_sdpa_padded(family, head, float64_softmax):
    """A padded batch (left padding for decoders, right padding for encoders): same relevances, 0 at padding."""
    ids = token_ids(family, SEQ, batch=2)
    mask = torch.ones_like(ids)
    if family in DECODERS:
        mask[1, :3] = 0
    else:
        mask[1, -3:] = 0
    results = [
        explain(tiny_model(family, head, attn_implementation=impl), ids, attention_mask=mask)
        for impl in ('eager', 'sdpa')
    ]
    eager, sdpa = results
    for result in results:
        assert torch.isfinite(result.relevance).all()
        assert float(result.relevance[mask == 0].abs().max()) == 0
    assert _relative(eager.relevance, sdpa.relevance) < 1e-10


@pytest.mark.parametrize('family, head', [pair for pair in FAMILY_HEADS if pair[0] in DECODERS], ids=_id)
def test_eager_float32_softmax_is_close_to_sdpa(family, head):
    """Without the float64 softmax the eager relevances of float64 models differ from SDPA only by float32
    rounding of the attention probabilities."""
    ids = token_ids(family, SEQ)
    eager = explain(tiny_model(family, head, attn_implementation='eager'), ids)
    sdpa = explain(tiny_model(family, head, attn_implementation='sdpa'), ids)
    assert _relative(eager.relevance, sdpa.relevance) < 1e-6


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten().double(), b.flatten().double()]))[0, 1])


@pytest.mark.parametrize('attn_implementation', ['eager', 'sdpa'])
@pytest.mark.parametrize('family, head', FAMILY_HEADS, ids=_id)
def test_bfloat16(family, head, attn_implementation):
    ids = token_ids(family, SEQ)
    full = explain(tiny_model(family, head, torch.float32, attn_implementation), ids)
    model = tiny_model(family, head, torch.bfloat16, attn_implementation)
    assert all(parameter.dtype == torch.bfloat16 for parameter in model.parameters())
    half = explain(model, ids, target=full.target)
    assert torch.isfinite(half.relevance).all() and torch.isfinite(half.embedding_relevance).all()
    assert half.relevance.abs().max() > 0
    tokens = _correlation(full.relevance, half.relevance)
    # the explained token often dominates; the rest must agree too
    keep = torch.ones(SEQ, dtype=torch.bool)
    keep[full.relevance[0].abs().argmax()] = False
    rest = _correlation(full.relevance[0, keep], half.relevance[0, keep])
    entries = _correlation(full.embedding_relevance, half.embedding_relevance)
    BF16_CORRELATIONS[f'{_id((family, head))}-{attn_implementation}'] = (tokens, rest, entries)
    assert tokens > 0.9
    assert rest > 0.9
    assert entries > 0.9
    # bfloat16 actually changed something: the comparison is not between identical computations
    assert not torch.equal(full.relevance, half.relevance)


# ---------------------------------------------------------------------------------------------------------- restore

def _snapshot(model, family):
    """Logits and parameter gradients of a plain forward + backward, and the model's structure."""
    ids = token_ids(family, 8, seed=1)
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        logits = model(input_ids=ids, **_forward_kwargs(model)).logits
        (logits * torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)).sum().backward()
    gradients = {name: parameter.grad.clone() for name, parameter in model.named_parameters()
                 if parameter.grad is not None}
    model.zero_grad(set_to_none=True)
    return {
        'logits': logits.detach(),
        'gradients': gradients,
        'state_dict': list(model.state_dict()),
        'modules': [(name, type(module)) for name, module in model.named_modules()],
        'parameters': {name: parameter.detach().clone() for name, parameter in model.named_parameters()},
        'training': [module.training for module in model.modules()],
    }


def _assert_restored(model, family, before):
    after = _snapshot(model, family)
    assert after['state_dict'] == before['state_dict']
    assert after['modules'] == before['modules']
    assert after['training'] == before['training']
    assert set(after['parameters']) == set(before['parameters'])
    assert all(torch.equal(after['parameters'][name], value) for name, value in before['parameters'].items())
    assert torch.equal(after['logits'], before['logits'])
    assert set(after['gradients']) == set(before['gradients']) and after['gradients']
    assert all(torch.equal(after['gradients'][name], value) for name, value in before['gradients'].items())
    leftovers = [(name, attribute) for name, module in model.named_modules() for attribute in HOOK_ATTRIBUTES
                 if len(getattr(module, attribute))]
    assert not leftovers
    assert not any(name.rsplit('.', 1)[-1].startswith('attnlrp_') for name, _ in model.named_modules())
    assert torch._C._len_torch_function_stack() == 0
    for tensor in model.parameters():
        assert not tensor._backward_hooks


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda c: c.__name__)
@pytest.mark.parametrize('family, head', FAMILY_HEADS, ids=_id)
class TestRestore:

    def test_after_explain(self, family, head, composite):
        model = tiny_model(family, head)
        before = _snapshot(model, family)
        explain(model, token_ids(family, SEQ), composite=composite())
        _assert_restored(model, family, before)

    def test_inside_context_changes_model(self, family, head, composite):
        """Sanity check of the snapshot: inside the context the structure does differ."""
        model = tiny_model(family, head)
        before = [name for name, _ in model.named_modules()]
        with composite().context(model) as modified:
            assert modified is model
            inside = [name for name, _ in model.named_modules()]
            hooked = sum(len(module._forward_hooks) for module in model.modules())
        assert len(inside) > len(before) and hooked > 0

    def test_after_exception_in_block(self, family, head, composite):
        model = tiny_model(family, head)
        before = _snapshot(model, family)
        ids = token_ids(family, SEQ)
        with pytest.raises(KeyError, match='raised in the block'):
            with torch.enable_grad(), composite().context(model) as modified:
                embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
                output = modified(inputs_embeds=embeddings, **_forward_kwargs(model))
                raise KeyError('raised in the block')
        del output
        _assert_restored(model, family, before)

    def test_after_exception_in_forward(self, family, head, composite):
        """An exception deep inside the forward pass (in the head, where the inline activations of RoBERTa are
        routed through modules) leaves nothing behind."""
        model = tiny_model(family, head)
        before = _snapshot(model, family)
        linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
        last = linears[-1]

        def fail(module, input, output):
            raise KeyError('raised in the forward')

        handle = last.register_forward_hook(fail)
        try:
            with pytest.raises(KeyError, match='raised in the forward'):
                explain(model, token_ids(family, SEQ), composite=composite())
        finally:
            handle.remove()
        _assert_restored(model, family, before)


def test_explaining_another_model_in_between_changes_nothing():
    llama = tiny_model('llama', 'causal_lm')
    bert = tiny_model('bert', 'masked_lm')
    roberta = tiny_model('roberta', 'seq_cls')
    ids = token_ids('llama', SEQ)
    first = explain(llama, ids)
    between = explain(bert, token_ids('bert', SEQ))
    explain(roberta, token_ids('roberta', SEQ), composite=CPLRPEpsilon())
    second = explain(llama, ids)
    assert torch.equal(first.relevance, second.relevance)
    assert torch.equal(first.embedding_relevance, second.embedding_relevance)
    assert torch.equal(first.logit, second.logit)
    again = explain(bert, token_ids('bert', SEQ))
    assert torch.equal(between.relevance, again.relevance)


def test_same_composite_instance_on_two_models():
    """One composite instance used for two models in turn gives the same as fresh instances."""
    composite = AttnLRPEpsilon()
    llama, gpt2 = tiny_model('llama'), tiny_model('gpt2')
    ids = token_ids('llama', SEQ)
    a = explain(llama, ids, composite=composite)
    b = explain(gpt2, ids, composite=composite)
    c = explain(llama, ids, composite=composite)
    assert torch.equal(a.relevance, c.relevance)
    assert torch.equal(b.relevance, explain(gpt2, ids).relevance)


# ------------------------------------------------------------------------------------------------------ unsupported

def _assert_refused(model, names):
    with pytest.raises(UnsupportedModelError) as info:
        canonizers_for(model)
    message = str(info.value)
    missing = [name for name in names if name not in message]
    assert not missing, f'{missing} not named in:\n{message}'
    # the composite refuses too, and leaves the model untouched
    modules = [name for name, _ in model.named_modules()]
    with pytest.raises(UnsupportedModelError):
        with AttnLRPEpsilon().context(model):
            pass  # pragma: no cover
    assert [name for name, _ in model.named_modules()] == modules
    assert not any(len(getattr(module, attribute)) for module in model.modules() for attribute in HOOK_ATTRIBUTES)
    return message


def test_unsupported_mixtral():
    config = transformers.MixtralConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    classes = {type(module).__name__ for module in model.modules()}
    expected = sorted(name for name in classes if name.startswith('Mixtral') and not name.endswith('RMSNorm'))
    assert 'MixtralSparseMoeBlock' in expected
    message = _assert_refused(model, expected)
    assert 'MixtralRMSNorm' not in message and 'SiLU' not in message and 'torch.nn' not in message


def test_unsupported_t5():
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    classes = {type(module).__name__ for module in model.modules()}
    expected = sorted(name for name in classes if name.startswith('T5'))
    assert 'T5LayerNorm' in expected and 'T5Attention' in expected
    _assert_refused(model, expected)


@pytest.mark.parametrize('option, value', [('final_logit_softcapping', 30.0), ('attn_logit_softcapping', 50.0)])
def test_unsupported_gemma3_softcapping(option, value):
    model = tiny_model('gemma3', 'causal_lm', **{option: value})
    assert getattr(model.config, option) == value
    message = _assert_refused(model, [option, repr(value)])
    # only the option is refused: every module class is known
    assert 'Gemma3' not in message.split('Supported families')[0].split('handles')[-1]


def test_supported_gemma3_without_softcapping():
    model = tiny_model('gemma3', 'causal_lm')
    assert model.config.final_logit_softcapping is None
    assert canonizers_for(model)


@pytest.mark.parametrize('family, head', FAMILY_HEADS + EXTRA_HEADS, ids=_id)
def test_supported_families_are_accepted(family, head):
    assert canonizers_for(tiny_model(family, head))


def test_tiny_config_shapes():
    """The builders give what the tests assume: 2 layers, 4 heads, 2 key/value heads for GQA families."""
    for family in ('llama', 'mistral', 'qwen2', 'qwen3', 'gemma3'):
        config = tiny_config(family)
        assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                config.num_key_value_heads, config.intermediate_size) == (32, 2, 4, 2, 64)
