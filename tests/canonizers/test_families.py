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

import contextlib
import functools
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
def _single_thread_and_report():
    # tiny models: one intra-op thread is several times faster than more (which spin against each other on a
    # loaded machine)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    if INPUT_FRACTIONS:
        print('\nAttnLRP input fraction (biases zeroed, float64, eager):')
        for key, value in INPUT_FRACTIONS.items():
            print(f'  {key:<20} {value:.6f}')
    if BF16_CORRELATIONS:
        print('bfloat16 vs float32 Pearson correlation (tokens, tokens without the largest, embedding entries):')
        for key, values in BF16_CORRELATIONS.items():
            print(f'  {key:<20} ' + ' '.join(f'{value:.6f}' for value in values))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest absolute value of ``a``."""
    return float((a.double() - b.double()).abs().max() / a.double().abs().max())


def _forward_kwargs(model) -> dict:
    return {'use_cache': False} if 'use_cache' in inspect.signature(model.forward).parameters else {}


def _select(logits: torch.Tensor, target: int) -> torch.Tensor:
    """The explained logit of row 0: last position for 3-D outputs."""
    return logits[0, target] if logits.dim() == 2 else logits[0, -1, target]


def _attention_sites(model):
    """Per attention layer: ``{role: (module, section of its output)}`` for the query, key and value projections
    and ``'output'``: the output projection, whose *input* is the attention output ``A V``."""
    sites = []
    for module in model.modules():
        if hasattr(module, 'q_proj') and hasattr(module, 'o_proj'):
            sites.append({'query': (module.q_proj, slice(None)), 'key': (module.k_proj, slice(None)),
                          'value': (module.v_proj, slice(None)), 'output': (module.o_proj, None)})
        elif hasattr(module, 'self') and isinstance(getattr(module.self, 'query', None), torch.nn.Linear):
            sites.append({'query': (module.self.query, slice(None)), 'key': (module.self.key, slice(None)),
                          'value': (module.self.value, slice(None)), 'output': (module.output.dense, None)})
        elif isinstance(module, transformers.models.gpt2.modeling_gpt2.GPT2Attention):
            size = module.embed_dim
            sites.append({'query': (module.c_attn, slice(0, size)), 'key': (module.c_attn, slice(size, 2 * size)),
                          'value': (module.c_attn, slice(2 * size, 3 * size)), 'output': (module.c_proj, None)})
    return sites


def _mlp_sites(model):
    """Per gated MLP: ``{'gate', 'up': (projection, section), 'down': (down projection, None)}``."""
    return [
        {'gate': (module.gate_proj, slice(None)), 'up': (module.up_proj, slice(None)), 'down': (module.down_proj, None)}
        for module in model.modules() if hasattr(module, 'gate_proj') and hasattr(module, 'down_proj')
    ]


def _other_embeddings(model):
    word = model.get_input_embeddings()
    return [module for module in model.modules() if isinstance(module, torch.nn.Embedding) and module is not word]


def _manual_run(model, ids, target, composite):
    """Explain ``target`` at the last position by hand, measuring ``sum(x * g)`` of the raw tensors around every
    product, with hooks registered before the composite's (so they see the projections' raw outputs and the
    gradient that arrives there after the operand rules).

    Returns a dict: ``logit``, ``word`` ([s] relevance of the word embeddings), ``other`` (position / segment
    embeddings), ``attention`` (per layer: relevance of query, key, value, output = the input of the output
    projection, probabilities = ``sum(A g_A)``, and ``expected_scores``: what the softmax rule, Prop. 3.1, passes to
    ``Q K^T`` given half of the probabilities' relevance, computed from ``A`` alone), ``mlp`` (per gated MLP: gate,
    up, down = the input of the down projection). Values are 0 where no gradient arrived.
    """
    attention = [{role: 0.0 for role in ('query', 'key', 'value', 'output')} for _ in _attention_sites(model)]
    mlp = [{role: 0.0 for role in ('gate', 'up', 'down')} for _ in _mlp_sites(model)]
    other = {'value': 0.0}
    handles = []

    def accumulate(store, key, tensor, section):
        detached = tensor.detach()

        def hook(grad):
            part = (slice(None),) if section is None else (..., section)
            store[key] += float((detached[part].double() * grad[part].double()).sum())
        tensor.register_hook(hook)

    def watch(sites, stores):
        for site, store in zip(sites, stores):
            for role, (module, section) in site.items():
                if section is None:  # the input of the module
                    handles.append(module.register_forward_pre_hook(
                        lambda module, args, store=store, role=role: accumulate(store, role, args[0], None)))
                else:
                    handles.append(module.register_forward_hook(
                        lambda module, args, output, store=store, role=role, section=section:
                        accumulate(store, role, output, section)))

    watch(_attention_sites(model), attention)
    watch(_mlp_sites(model), mlp)
    for embedding in _other_embeddings(model):
        handles.append(embedding.register_forward_hook(
            lambda module, args, output: accumulate(other, 'value', output, slice(None))))
    try:
        with torch.enable_grad():
            embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
            with composite.context(model) as modified:
                output = modified(inputs_embeds=embeddings, output_attentions=True, **_forward_kwargs(model))
                probabilities = output.attentions
                assert probabilities is not None and len(probabilities) == LAYERS == len(attention) and all(
                    value is not None for value in probabilities), \
                    'output_attentions returned no attention weights in eager mode'
                for value in probabilities:
                    if value.requires_grad:
                        value.retain_grad()
                logit = _select(output.logits, target)
                logit.backward(logit.detach())
    finally:
        for handle in handles:
            handle.remove()
    for store, value in zip(attention, probabilities):
        if value.grad is None:
            store['probabilities'] = store['expected_scores'] = 0.0
            continue
        value, grad = value.detach(), value.grad
        share = 0.5 * value * grad  # the uniform rule (Prop. 3.3): half of R(A V) goes to A
        # Prop. 3.1: R_in = x (R - s sum(R)); its row sum does not change when x shifts by a constant per row,
        # so x = log(s) gives the same sum (masked entries: s = 0 and R = 0, they contribute nothing)
        logs = torch.where(value > 0, value.log(), torch.zeros_like(value))
        rule = logs * (share - value * share.sum(-1, keepdim=True))
        store['probabilities'] = float((value * grad).sum())
        store['expected_scores'] = float(rule.sum())
    return {'logit': float(logit.detach()), 'word': embeddings.grad[0].sum(-1), 'other': other['value'],
            'attention': attention, 'mlp': mlp}


def _close(value, expected, scale, rel=1e-8):
    """``value == expected`` up to ``rel`` relative to ``scale`` (the logit)."""
    return abs(value - expected) <= rel * abs(scale)


@contextlib.contextmanager
def float64_softmax():
    """Keep Hugging Face's eager softmax in float64: the Llama-like families compute it in float32
    (``softmax(..., dtype=torch.float32)``) even for float64 models, which alone moves their eager relevances by
    2e-9 to 1e-7 relative against SDPA (measured on these tiny models)."""
    original = torch.nn.functional.softmax

    def softmax(input, dim=None, _stacklevel=3, dtype=None):
        if dtype is not None and input.dtype == torch.float64:
            dtype = None
        return original(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    torch.nn.functional.softmax = softmax
    try:
        yield
    finally:
        torch.nn.functional.softmax = original


@functools.cache
def _conservation_runs(family, head):
    """Everything the conservation tests look at, computed once per family and head (biases zeroed, float64 also
    in the softmax, eager attention)."""
    model = tiny_model(family, head, torch.float64, 'eager', zero_bias=True)
    ids = token_ids(family, SEQ)
    with float64_softmax():
        attn = explain(model, ids, composite=AttnLRPEpsilon())
        target = int(attn.target[0])
        runs = {
            'model': model, 'ids': ids, 'target': target,
            'explain': {'attnlrp': attn, 'cplrp': explain(model, ids, target=target, composite=CPLRPEpsilon())},
            'report': {name: conservation(model, ids, target=target, composite=composite())
                       for name, composite in (('attnlrp', AttnLRPEpsilon), ('cplrp', CPLRPEpsilon))},
            'manual': {name: _manual_run(model, ids, target, composite())
                       for name, composite in (('attnlrp', AttnLRPEpsilon), ('cplrp', CPLRPEpsilon))},
        }
    return runs


@pytest.mark.parametrize('family, head', FAMILY_HEADS + EXTRA_HEADS)
class TestConservation:
    """Biases zeroed, float64, eager attention: where the relevance goes."""

    def test_bias_free(self, family, head):
        model = _conservation_runs(family, head)['model']
        biases = [name for name, parameter in model.named_parameters() if name.endswith('bias')]
        assert all(float(model.get_parameter(name).detach().abs().max()) == 0 for name in biases)
        if family == 'qwen2':
            assert any(name.endswith('q_proj.bias') for name in biases)

    def test_cp_lrp_conserves_the_logit(self, family, head):
        runs = _conservation_runs(family, head)
        report = runs['report']['cplrp']
        logit = float(report.logit[0])
        assert abs(logit) > 1e-3
        assert float(report.sums[-2:, 0].sum()) == pytest.approx(logit, rel=1e-8, abs=0)
        assert float(report.input_fraction[0]) == pytest.approx(1, rel=1e-8, abs=0)
        # every layer boundary carries the whole logit as well
        torch.testing.assert_close(report.sums[:-2, 0], torch.full((len(report.names) - 2,), logit,
                                                                    dtype=torch.float64), rtol=1e-8, atol=0)
        manual = runs['manual']['cplrp']
        assert float(manual['word'].sum()) + manual['other'] == pytest.approx(logit, rel=1e-8, abs=0)
        torch.testing.assert_close(runs['explain']['cplrp'].relevance[0], manual['word'], rtol=1e-10, atol=1e-14)

    def test_cp_lrp_operands(self, family, head):
        """CP-LRP: query, key and gate get nothing; value and up get all of their product's relevance."""
        run = _conservation_runs(family, head)['manual']['cplrp']
        logit = run['logit']
        for layer in run['attention']:
            assert layer['query'] == 0 and layer['key'] == 0
            assert layer['output'] != 0 and _close(layer['value'], layer['output'], logit)
        for layer in run['mlp']:
            assert layer['gate'] == 0
            assert layer['down'] != 0 and _close(layer['up'], layer['down'], logit)

    def test_attnlrp_absorbs_exactly_the_softmax_bias(self, family, head):
        runs = _conservation_runs(family, head)
        run, reference, report = runs['manual']['attnlrp'], runs['explain']['attnlrp'], runs['report']['attnlrp']
        logit, attention = run['logit'], run['attention']
        absorbed = [0.5 * layer['probabilities'] - (layer['query'] + layer['key']) for layer in attention]
        input_relevance = float(run['word'].sum()) + run['other']
        assert logit == pytest.approx(float(reference.logit[0]), rel=1e-12, abs=0)
        assert input_relevance == pytest.approx(logit - sum(absorbed), rel=1e-8, abs=1e-8 * abs(logit))
        fraction = input_relevance / logit
        INPUT_FRACTIONS[f'{family}-{head}'] = fraction
        assert 0 < fraction < 1.5
        assert abs(fraction - 1) > 1e-4, 'the softmax rule absorbed nothing'
        assert all(abs(value) > 1e-6 * abs(logit) for value in absorbed)
        # explain() and conservation() agree with the hand-made run
        torch.testing.assert_close(reference.relevance[0], run['word'], rtol=1e-10, atol=1e-14)
        assert float(report.sums[-1, 0]) == pytest.approx(run['other'], rel=1e-10, abs=1e-14)
        assert float(report.input_fraction[0]) == pytest.approx(fraction, rel=1e-10, abs=0)
        if family in ('gpt2', 'bert', 'roberta'):
            assert run['other'] != 0, 'position embeddings received no relevance'
        else:
            assert run['other'] == 0 and not _other_embeddings(runs['model'])

    def test_attnlrp_operands(self, family, head):
        """The shares of Props. 3.1-3.3 layer by layer: A V gives half to V and half to A; the softmax rule
        passes ``x (R - s sum(R))`` to ``Q K^T``, which gives half to Q and half to K; act(gate) * up gives half
        to each."""
        run = _conservation_runs(family, head)['manual']['attnlrp']
        logit = run['logit']
        for layer in run['attention']:
            assert layer['output'] != 0
            assert _close(layer['probabilities'], layer['output'], logit)
            assert _close(layer['value'], 0.5 * layer['output'], logit)
            assert _close(layer['query'], layer['key'], logit)
            assert _close(layer['query'] + layer['key'], layer['expected_scores'], logit)
        assert len(run['mlp']) == (LAYERS if family in ('llama', 'mistral', 'qwen2', 'qwen3', 'gemma3') else 0)
        for layer in run['mlp']:
            assert layer['down'] != 0
            assert _close(layer['gate'], 0.5 * layer['down'], logit)
            assert _close(layer['up'], 0.5 * layer['down'], logit)

    def test_attnlrp_differs_from_cp_lrp(self, family, head):
        explanations = _conservation_runs(family, head)['explain']
        attn, cp = explanations['attnlrp'].relevance, explanations['cplrp'].relevance
        assert torch.isfinite(attn).all() and torch.isfinite(cp).all()
        difference = (attn - cp).abs()
        assert difference.max() > 1e-4 * attn.abs().max()
        # one token (usually the explained one) often holds nearly all relevance; the others must differ too
        keep = torch.ones(SEQ, dtype=torch.bool)
        keep[attn[0].abs().argmax()] = False
        assert difference[0, keep].max() > 1e-3 * attn[0, keep].abs().max()


@pytest.mark.parametrize('family, head', FAMILY_HEADS)
def test_eager_equals_sdpa(family, head):
    """float64: eager and SDPA attention give the same relevances, for an unpadded row and a padded one (left
    padding for decoders, right padding for encoders), with AttnLRP and CP-LRP."""
    ids = token_ids(family, SEQ, batch=2)
    mask = torch.ones_like(ids)
    if family in DECODERS:
        mask[1, :3] = 0
    else:
        mask[1, -3:] = 0
    models = {impl: tiny_model(family, head, attn_implementation=impl) for impl in ('eager', 'sdpa')}
    for composite in (AttnLRPEpsilon, CPLRPEpsilon):
        for attention_mask in (None, mask):
            with float64_softmax():
                eager, sdpa = (explain(models[impl], ids, attention_mask=attention_mask, composite=composite())
                               for impl in ('eager', 'sdpa'))
            assert torch.equal(eager.target, sdpa.target)
            torch.testing.assert_close(eager.logit, sdpa.logit, rtol=1e-12, atol=0)
            for result in (eager, sdpa):
                assert torch.isfinite(result.embedding_relevance).all()
                if attention_mask is not None:
                    assert float(result.relevance[attention_mask == 0].abs().max()) == 0
            assert _relative(eager.relevance, sdpa.relevance) < 1e-10
            assert _relative(eager.embedding_relevance, sdpa.embedding_relevance) < 1e-10


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten().double(), b.flatten().double()]))[0, 1])


@pytest.mark.parametrize('family, head', FAMILY_HEADS)
def test_bfloat16(family, head):
    """A bfloat16 model (default SDPA attention) gives finite relevances that correlate with the float32 ones."""
    ids = token_ids(family, SEQ)
    full = explain(tiny_model(family, head, torch.float32, 'sdpa'), ids)
    model = tiny_model(family, head, torch.bfloat16, 'sdpa')
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
    BF16_CORRELATIONS[f'{family}-{head}'] = (tokens, rest, entries)
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
        'config': model.config.to_dict(),
    }


def _assert_restored(model, family, before):
    after = _snapshot(model, family)
    assert after['state_dict'] == before['state_dict']
    assert after['modules'] == before['modules']
    assert after['training'] == before['training']
    assert after['config'] == before['config']
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


#: AttnLRP on every family and head; CP-LRP (same canonizers, other rules) on one model per kind of attention
RESTORE_CASES = [(family, head, AttnLRPEpsilon) for family, head in FAMILY_HEADS] + [
    (family, head, CPLRPEpsilon) for family, head in (('llama', 'causal_lm'), ('gpt2', 'causal_lm'),
                                                      ('roberta', 'seq_cls'))]


@pytest.mark.parametrize('family, head, composite', RESTORE_CASES,
                         ids=[f'{family}-{head}-{composite.__name__}' for family, head, composite in RESTORE_CASES])
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


def test_second_context_on_the_same_model_is_refused_and_harmless():
    """Entering a second composite on a model that is inside one raises, and neither the outer context's
    explanation nor the model afterwards is changed by the attempt."""
    model = tiny_model('roberta', 'seq_cls')
    before = _snapshot(model, 'roberta')
    ids = token_ids('roberta', SEQ)
    reference = explain(model, ids)
    outer = AttnLRPEpsilon()
    with torch.enable_grad(), outer.context(model) as modified:
        with pytest.raises(RuntimeError, match='already has an attribute'):
            with CPLRPEpsilon().context(model):
                pass  # pragma: no cover
        embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
        logit = modified(inputs_embeds=embeddings).logits[0, reference.target[0]]
        logit.backward(logit.detach())
    torch.testing.assert_close(embeddings.grad.sum(-1), reference.relevance, rtol=1e-12, atol=0)
    _assert_restored(model, 'roberta', before)


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


def _unsupported_bloom():
    return transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=100, hidden_size=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2))


def _unsupported_opt():
    return transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=32, bos_token_id=1, eos_token_id=2, pad_token_id=0))


@pytest.mark.parametrize('build, package', [(_unsupported_bloom, 'bloom'), (_unsupported_opt, 'opt')],
                         ids=['bloom', 'opt'])
def test_unsupported_model(build, package):
    """Models without a family entry (Bloom: ALiBi attention and its own GELU module; OPT) are refused, every
    module class of theirs that is not a known leaf (linear, embedding, LayerNorm) named in the message. (Mixtral
    and T5, the examples of the brief, have family entries by now.)"""
    torch.manual_seed(0)
    model = build().eval()
    leaves = (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)
    expected = sorted({
        f'{type(module).__module__}.{type(module).__qualname__}' for module in model.modules()
        if type(module).__module__.startswith(f'transformers.models.{package}.') and not isinstance(module, leaves)})
    assert len(expected) >= 4
    message = _assert_refused(model, expected)
    assert 'torch.nn.modules' not in message


class LlamaMLP(transformers.models.llama.modeling_llama.LlamaMLP):
    """A class of a supported name that is not the one transformers defines: its forward could be anything."""
    def forward(self, x):
        return self.down_proj(torch.relu(self.gate_proj(x)) ** 2 * self.up_proj(x))


def test_unsupported_class_with_a_supported_name():
    model = tiny_model('llama')
    original = model.model.layers[1].mlp
    replacement = LlamaMLP(model.config).to(torch.float64)
    replacement.load_state_dict(original.state_dict())
    model.model.layers[1].mlp = replacement
    _assert_refused(model, [f'{__name__}.LlamaMLP (at model.layers.1.mlp)'])


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


@pytest.mark.parametrize('family, head', FAMILY_HEADS + EXTRA_HEADS)
def test_supported_families_are_accepted(family, head):
    assert canonizers_for(tiny_model(family, head))


def test_tiny_config_shapes():
    """The builders give what the tests assume: 2 layers, 4 heads, 2 key/value heads for GQA families."""
    for family in ('llama', 'mistral', 'qwen2', 'qwen3', 'gemma3'):
        config = tiny_config(family)
        assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                config.num_key_value_heads, config.intermediate_size) == (32, 2, 4, 2, 64)
