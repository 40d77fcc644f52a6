"""Every supported family and head, end to end, on tiny random models (float64 unless stated).

1. Conservation with all biases zeroed: CP-LRP conserves the logit exactly; with AttnLRP the logit minus the
   input relevance equals what the softmax rule's hidden bias absorbs, computed independently of the library from
   the attention probabilities and the query/key projections (mixtures of experts: and from the router's logits
   and routing weights); AttnLRP differs from CP-LRP.
2. Eager and SDPA attention give the same relevances (Gemma 2 has no SDPA attention: soft-capping).
3. bfloat16 models give finite relevances that correlate with the float32 ones.
4. The composite's context restores the model exactly (outputs, gradients, modules, parameters, hooks, the
   attention and experts implementations), also when the block or the forward raises; explaining another model in
   between changes nothing.
5. Models and configurations the former family table refused (Bloom, OPT, Gemma 3 with soft-capping) are explained
   by the engine, exactly.

Encoder-decoder models (T5) are explained at the last position of a fixed decoder input of :py:data:`DECODER_SEQ`
tokens; their input relevance is that of the encoder and the decoder tokens.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import pytest
import torch
import transformers

from tests.models import (
    DECODERS,
    EAGER_ONLY,
    ENCODER_DECODERS,
    FAMILY_HEADS,
    GEMMA2_ATTN_SOFTCAP,
    GEMMA2_FINAL_SOFTCAP,
    HOOK_ATTRIBUTES,
    LAYERS,
    MOE,
    decoder_ids,
    tiny_config,
    tiny_model,
    token_ids,
    zero_biases,
)
from zennit_attn import conservation, explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.methods.propagation import lrp_method
from zennit_attn.rules import Identity

SEQ = 12
#: decoder tokens of encoder-decoder models (the start token and 3 more)
DECODER_SEQ = 4
#: heads beyond the required ones, checked for conservation too
EXTRA_HEADS = (('llama', 'seq_cls'), ('gpt2', 'seq_cls'))
#: families whose position (and segment) embeddings are inputs that receive relevance
POSITION_EMBEDDINGS = ('gpt2', 'bert', 'roberta', 'distilbert')
#: gated MLPs ``act(gate) * up`` found by :py:func:`_mlp_sites`: one per layer (Qwen2-MoE: the shared expert; T5:
#: encoder and decoder); the experts of the mixtures compute theirs from 3-D parameters and are not counted
GATED_MLPS = {
    family: LAYERS
    for family in ('llama', 'mistral', 'qwen2', 'qwen3', 'gemma3', 'olmo2', 'granite', 'gemma2', 'phi3', 'qwen2_moe')
} | {'t5': 2 * LAYERS}
#: measured fractions, printed at the end of the module (run with -s to see them)
INPUT_FRACTIONS: dict[str, float] = {}
#: mixtures of experts: the fraction of the logit that the routers' softmax absorbs
ROUTER_FRACTIONS: dict[str, float] = {}
BF16_CORRELATIONS: dict[str, tuple[float, ...]] = {}


@pytest.fixture(scope='module', autouse=True)
def _report():
    yield
    if INPUT_FRACTIONS:
        print('\nAttnLRP input fraction (biases zeroed, float64, eager):')
        for key, value in INPUT_FRACTIONS.items():
            router = f'  (routers absorb {ROUTER_FRACTIONS[key]:+.6f})' if key in ROUTER_FRACTIONS else ''
            print(f'  {key:<22} {value:.6f}{router}')
    if BF16_CORRELATIONS:
        print('bfloat16 vs float32 Pearson correlation (tokens, tokens without the largest, embedding entries):')
        for key, values in BF16_CORRELATIONS.items():
            print(f'  {key:<22} ' + ' '.join(f'{value:.6f}' for value in values))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest absolute value of ``a``."""
    return float((a.double() - b.double()).abs().max() / a.double().abs().max())


def _forward_kwargs(model) -> dict:
    return {'use_cache': False} if 'use_cache' in inspect.signature(model.forward).parameters else {}


def _decoder_kwargs(family, batch: int = 1) -> dict:
    """``decoder_input_ids`` for :py:func:`explain` and plain forwards of encoder-decoder families, else nothing."""
    return {'decoder_input_ids': decoder_ids(family, DECODER_SEQ, batch)} if family in ENCODER_DECODERS else {}


def _tokens(explanation) -> torch.Tensor:
    """``[batch]`` relevance of all input tokens (encoder and decoder tokens for encoder-decoder models)."""
    total = explanation.relevance.double().sum(1)
    if explanation.decoder_relevance is not None:
        total = total + explanation.decoder_relevance.double().sum(1)
    return total


def _select(logits: torch.Tensor, target: int) -> torch.Tensor:
    """The explained logit of row 0: last position for 3-D outputs."""
    return logits[0, target] if logits.dim() == 2 else logits[0, -1, target]


def _separate(query, key, value, output):
    return {
        'query': (query, slice(None)),
        'key': (key, slice(None)),
        'value': (value, slice(None)),
        'output': (output, None),
    }


def _attention_sites(model):
    """Per attention layer, in the order of the attention weights that the model returns: ``{role: (module,
    section of its output)}`` for the query, key and value projections and ``'output'``: the output projection,
    whose *input* is the attention output ``A V``. A section is a slice or an index tensor of the last dimension."""
    sites = []
    for module in model.modules():
        name = type(module).__name__
        if name == 'T5Attention':
            sites.append(_separate(module.q, module.k, module.v, module.o))
        elif name == 'DistilBertSelfAttention':
            sites.append(_separate(module.q_lin, module.k_lin, module.v_lin, module.out_lin))
        elif name == 'Phi3Attention':  # fused: query heads, key heads, value heads
            query = module.config.num_attention_heads * module.head_dim
            key = module.num_key_value_heads * module.head_dim
            sites.append(
                {
                    'query': (module.qkv_proj, slice(0, query)),
                    'key': (module.qkv_proj, slice(query, query + key)),
                    'value': (module.qkv_proj, slice(query + key, None)),
                    'output': (module.o_proj, None),
                }
            )
        elif name == 'GPTNeoXAttention':  # fused and interleaved: per head query, key, value
            index = torch.arange(3 * module.config.hidden_size).view(-1, 3, module.head_size)
            sites.append(
                {
                    role: (module.query_key_value, index[:, part].flatten())
                    for part, role in enumerate(('query', 'key', 'value'))
                }
            )
            sites[-1]['output'] = (module.dense, None)
        elif hasattr(module, 'q_proj') and hasattr(module, 'o_proj'):
            sites.append(_separate(module.q_proj, module.k_proj, module.v_proj, module.o_proj))
        elif hasattr(module, 'q_proj') and hasattr(module, 'dense'):  # Phi
            sites.append(_separate(module.q_proj, module.k_proj, module.v_proj, module.dense))
        elif hasattr(module, 'self') and isinstance(getattr(module.self, 'query', None), torch.nn.Linear):
            sites.append(_separate(module.self.query, module.self.key, module.self.value, module.output.dense))
        elif isinstance(module, transformers.models.gpt2.modeling_gpt2.GPT2Attention):
            size = module.embed_dim
            sites.append(
                {
                    'query': (module.c_attn, slice(0, size)),
                    'key': (module.c_attn, slice(size, 2 * size)),
                    'value': (module.c_attn, slice(2 * size, 3 * size)),
                    'output': (module.c_proj, None),
                }
            )
    return sites


def _mlp_sites(model):
    """Per gated MLP: ``{'gate', 'up': (projection, section), 'down': (down projection, None)}``."""
    sites = []
    for module in model.modules():
        name = type(module).__name__
        if hasattr(module, 'gate_proj') and hasattr(module, 'down_proj'):
            sites.append(
                {
                    'gate': (module.gate_proj, slice(None)),
                    'up': (module.up_proj, slice(None)),
                    'down': (module.down_proj, None),
                }
            )
        elif name == 'Phi3MLP':  # fused: gate, then up
            half = module.gate_up_proj.out_features // 2
            sites.append(
                {
                    'gate': (module.gate_up_proj, slice(0, half)),
                    'up': (module.gate_up_proj, slice(half, None)),
                    'down': (module.down_proj, None),
                }
            )
        elif name == 'T5DenseGatedActDense':
            sites.append(
                {'gate': (module.wi_0, slice(None)), 'up': (module.wi_1, slice(None)), 'down': (module.wo, None)}
            )
    return sites


def _routers(model):
    """The routers of mixtures of experts: they return ``(router logits, routing weights, expert indices)``."""
    return [module for module in model.modules() if type(module).__name__.endswith('TopKRouter')]


def _other_embeddings(model):
    """Embeddings other than the word embeddings (and copies tied to them): position and segment embeddings, and
    T5's relative position bias (added to the attention scores, not an input)."""
    word = model.get_input_embeddings()
    return [
        module
        for module in model.modules()
        if isinstance(module, torch.nn.Embedding) and module is not word and module.weight is not word.weight
    ]


def _attention_weights(output, family):
    """The attention weights that ``output_attentions`` returned, in the order of :py:func:`_attention_sites`."""
    if family not in ENCODER_DECODERS:
        return tuple(output.attentions)
    decoder = [value for pair in zip(output.decoder_attentions, output.cross_attentions) for value in pair]
    return tuple(output.encoder_attentions) + tuple(decoder)


def _accumulate(store: dict, key: str, tensor: torch.Tensor, section) -> None:
    """Add ``sum(x * g)`` of ``tensor`` (its ``section`` of the last dimension; None: all) to ``store[key]`` when its
    gradient arrives."""
    detached = tensor.detach()

    def hook(grad):
        part = (slice(None),) if section is None else (..., section)
        store[key] += float((detached[part].double() * grad[part].double()).sum())

    tensor.register_hook(hook)


class _Watch:
    """Hooks (registered before the composite's, so they see the projections' raw outputs and the gradient that
    arrives there after the product rules) that measure ``sum(x * g)`` around every product of a model."""

    def __init__(self, model):
        self.attention = [{role: 0.0 for role in ('query', 'key', 'value', 'output')} for _ in _attention_sites(model)]
        self.mlp = [{role: 0.0 for role in ('gate', 'up', 'down')} for _ in _mlp_sites(model)]
        self.routers = [{'logits': 0.0, 'weights': 0.0} for _ in _routers(model)]
        self.other = {'value': 0.0}
        self.handles = []
        self.sites(_attention_sites(model), self.attention)
        self.sites(_mlp_sites(model), self.mlp)
        for router, store in zip(_routers(model), self.routers):
            self.handles.append(router.register_forward_hook(functools.partial(self.router, store=store)))
        for embedding in _other_embeddings(model):
            self.handles.append(embedding.register_forward_hook(self.relevance_leaf))

    def sites(self, sites, stores):
        for site, store in zip(sites, stores):
            for role, (module, section) in site.items():
                if section is None:  # the input of the module
                    self.handles.append(
                        module.register_forward_pre_hook(
                            lambda module, args, store=store, role=role: _accumulate(store, role, args[0], None)
                        )
                    )
                else:
                    self.handles.append(
                        module.register_forward_hook(
                            lambda module, args, output, store=store, role=role, section=section: _accumulate(
                                store, role, output, section
                            )
                        )
                    )

    @staticmethod
    def router(module, args, output, store):
        _accumulate(store, 'logits', output[0], None)
        _accumulate(store, 'weights', output[1], None)

    def relevance_leaf(self, module, args, output):
        # the engine freezes the parameters: the embedding's output is made a leaf to read its relevance at
        leaf = output.detach().requires_grad_()
        _accumulate(self.other, 'value', leaf, slice(None))
        return leaf

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _softmax_shares(attention, probabilities) -> None:
    """Per attention layer: ``probabilities`` = ``sum(A g_A)`` (the half of ``R(A V)`` the product rule gives ``A``) and
    ``expected_scores``, what the softmax rule (Prop. 3.1) passes to its input given it, from ``A`` alone."""
    for store, value in zip(attention, probabilities):
        if value.grad is None:
            store['probabilities'] = store['expected_scores'] = 0.0
            continue
        value, grad = value.detach(), value.grad
        share = value * grad  # the uniform rule (Prop. 3.3) gave A half of R(A V): the gradient at A carries it
        # Prop. 3.1: R_in = x (R - s sum(R)); its row sum does not change when x shifts by a constant per row,
        # so x = log(s) gives the same sum (masked entries: s = 0 and R = 0, they contribute nothing)
        logs = torch.where(value > 0, value.log(), torch.zeros_like(value))
        rule = logs * (share - value * share.sum(-1, keepdim=True))
        store['probabilities'] = float((value * grad).sum())
        store['expected_scores'] = float(rule.sum())


def _explained_run(model, family, ids, target, composite, layers):
    """Run ``model`` on the embeddings of ``ids`` (and a decoder input) in ``composite``'s context and explain
    ``target`` at the last position: ``(logit, attention probabilities, embeddings, decoder embeddings or None)``."""
    with torch.enable_grad():
        word = model.get_input_embeddings()
        embeddings = word(ids).detach().requires_grad_()
        kwargs = dict(inputs_embeds=embeddings, output_attentions=True, **_forward_kwargs(model))
        decoder = None
        if family in ENCODER_DECODERS:
            decoder = word(_decoder_kwargs(family)['decoder_input_ids']).detach().requires_grad_()
            kwargs['decoder_inputs_embeds'] = decoder
        with composite.context(model) as modified:
            output = modified(**kwargs)
            probabilities = _attention_weights(output, family)
            assert len(probabilities) == layers >= LAYERS and all(value is not None for value in probabilities), (
                'output_attentions returned no attention weights in eager mode'
            )
            for value in probabilities:
                if value.requires_grad:
                    value.retain_grad()
            logit = _select(output.logits, target)
            logit.backward(logit.detach())
    return logit, probabilities, embeddings, decoder


def _manual_run(model, family, ids, target, composite):
    """Explain ``target`` at the last position by hand, measuring ``sum(x * g)`` of the raw tensors around every
    product (:py:class:`_Watch`).

    Returns a dict: ``logit``, ``word`` ([s] relevance of the word embeddings; the encoder's for encoder-decoder
    models), ``decoder_word`` ([t] the decoder's, or None), ``other`` (the other embeddings: position / segment
    embeddings, T5's relative position bias), ``attention`` (per layer: relevance of query, key, value, output =
    the input of the output projection, and :py:func:`_softmax_shares`), ``mlp`` (per gated MLP: gate, up, down =
    the input of the down projection), ``routers`` (per router: relevance of its logits and of the routing weights).
    Values are 0 where no gradient arrived.
    """
    watch = _Watch(model)
    try:
        logit, probabilities, embeddings, decoder = _explained_run(
            model, family, ids, target, composite, len(watch.attention)
        )
    finally:
        watch.remove()
    _softmax_shares(watch.attention, probabilities)
    return {
        'logit': float(logit.detach()),
        'word': embeddings.grad[0].sum(-1),
        'decoder_word': None if decoder is None else decoder.grad[0].sum(-1),
        'other': watch.other['value'],
        'attention': watch.attention,
        'mlp': watch.mlp,
        'routers': watch.routers,
    }


def _input_relevance(run, family) -> float:
    """Relevance of the inputs of a :py:func:`_manual_run`: tokens, and position / segment embeddings."""
    total = float(run['word'].sum())
    if run['decoder_word'] is not None:
        total += float(run['decoder_word'].sum())
    return total + (run['other'] if family in POSITION_EMBEDDINGS else 0.0)


def _close(value, expected, scale, rel=1e-8):
    """``value == expected`` up to ``rel`` relative to ``scale`` (the logit)."""
    return abs(value - expected) <= rel * abs(scale)


@contextlib.contextmanager
def float64_softmax():
    """Keep Hugging Face's eager softmax in float64: the Llama-like families (and the routers of Qwen2-MoE,
    Qwen3-MoE and OLMoE) compute it in float32 (``softmax(..., dtype=torch.float32)``) even for float64 models,
    which alone moves their eager relevances by 2e-9 to 1e-7 relative against SDPA (measured on these tiny
    models). Mixtral's router (``softmax(logits.float())``) stays in float32."""
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
    extra = _decoder_kwargs(family)
    with float64_softmax():
        attn = explain(model, ids, composite=AttnLRPEpsilon(), **extra)
        target = int(attn.target[0])
        runs = {
            'model': model,
            'ids': ids,
            'target': target,
            'explain': {
                'attnlrp': attn,
                'cplrp': explain(model, ids, target=target, method='cplrp', composite=CPLRPEpsilon(), **extra),
            },
            'manual': {
                name: _manual_run(model, family, ids, target, composite())
                for name, composite in (('attnlrp', AttnLRPEpsilon), ('cplrp', CPLRPEpsilon))
            },
        }
        if family not in ENCODER_DECODERS:  # conservation() does not handle them (test_conservation_report_t5)
            runs['report'] = {
                name: conservation(model, ids, target=target, composite=composite())
                for name, composite in (('attnlrp', AttnLRPEpsilon), ('cplrp', CPLRPEpsilon))
            }
    return runs


@pytest.mark.parametrize('family, head', FAMILY_HEADS + EXTRA_HEADS)
class TestConservation:
    """Biases zeroed, float64, eager attention: where the relevance goes."""

    def test_bias_free(self, family, head):
        model = _conservation_runs(family, head)['model']
        biases = [name for name, parameter in model.named_parameters() if name.endswith('bias')]
        assert all(float(model.get_parameter(name).detach().abs().max()) == 0 for name in biases)
        if family in ('qwen2', 'qwen2_moe'):
            assert any(name.endswith('q_proj.bias') for name in biases)
        if family in ('phi', 'gpt_neox', 'distilbert'):
            assert any(name.endswith('dense.bias') or name.endswith('lin.bias') for name in biases)

    def test_cp_lrp_conserves_the_logit(self, family, head):
        runs = _conservation_runs(family, head)
        manual = runs['manual']['cplrp']
        logit = manual['logit']
        assert abs(logit) > 1e-3
        assert _input_relevance(manual, family) == pytest.approx(logit, rel=1e-8, abs=0)
        explanation = runs['explain']['cplrp']
        assert float(explanation.logit[0]) == pytest.approx(logit, rel=1e-12, abs=0)
        torch.testing.assert_close(explanation.relevance[0], manual['word'], rtol=1e-10, atol=1e-14)
        if family in ENCODER_DECODERS:
            torch.testing.assert_close(explanation.decoder_relevance[0], manual['decoder_word'], rtol=1e-10, atol=1e-14)
            assert float(explanation.relevance.abs().sum()) > 0 and float(explanation.decoder_relevance.abs().sum()) > 0
            assert float(_tokens(explanation)[0]) == pytest.approx(logit, rel=1e-8, abs=0)
            return
        report = runs['report']['cplrp']
        assert float(report.logit[0]) == pytest.approx(logit, rel=1e-12, abs=0)
        assert float(report.sums[-2:, 0].sum()) == pytest.approx(logit, rel=1e-8, abs=0)
        assert float(report.input_fraction[0]) == pytest.approx(1, rel=1e-8, abs=0)
        # every layer boundary carries the whole logit as well
        torch.testing.assert_close(
            report.sums[:-2, 0], torch.full((len(report.names) - 2,), logit, dtype=torch.float64), rtol=1e-8, atol=0
        )

    def test_cp_lrp_operands(self, family, head):
        """CP-LRP: query, key, gate and the routers get nothing; value and up get all of their product's
        relevance."""
        run = _conservation_runs(family, head)['manual']['cplrp']
        logit = run['logit']
        for layer in run['attention']:
            assert layer['query'] == 0 and layer['key'] == 0
            assert layer['output'] != 0 and _close(layer['value'], layer['output'], logit)
        assert len(run['mlp']) == GATED_MLPS.get(family, 0)
        for layer in run['mlp']:
            assert layer['gate'] == 0
            assert layer['down'] != 0 and _close(layer['up'], layer['down'], logit)
        assert len(run['routers']) == (LAYERS if family in MOE else 0)
        for router in run['routers']:
            assert router['logits'] == 0 and router['weights'] == 0

    def test_attnlrp_absorbs_exactly_the_softmax_bias(self, family, head):
        """The logit minus the input relevance is what the softmax rules absorb: in attention ``R(A) - R(Q) - R(K)``
        per layer (``A`` holds its half of ``R(A V)``; T5: including the share of the relative position bias, which is
        no input), in the routers of mixtures of experts ``R(routing weights) - R(router logits)``."""
        runs = _conservation_runs(family, head)
        run, reference = runs['manual']['attnlrp'], runs['explain']['attnlrp']
        logit, attention = run['logit'], run['attention']
        absorbed = [layer['probabilities'] - (layer['query'] + layer['key']) for layer in attention]
        routing = [router['weights'] - router['logits'] for router in run['routers']]
        input_relevance = _input_relevance(run, family)
        assert logit == pytest.approx(float(reference.logit[0]), rel=1e-12, abs=0)
        assert input_relevance == pytest.approx(logit - sum(absorbed) - sum(routing), rel=1e-8, abs=1e-8 * abs(logit))
        fraction = input_relevance / logit
        INPUT_FRACTIONS[f'{family}-{head}'] = fraction
        if routing:
            ROUTER_FRACTIONS[f'{family}-{head}'] = sum(routing) / logit
        assert 0 < fraction < 1.5
        assert abs(fraction - 1) > 1e-4, 'the softmax rule absorbed nothing'
        assert all(abs(value) > 1e-6 * abs(logit) for value in absorbed + routing)
        # explain() and conservation() agree with the hand-made run
        torch.testing.assert_close(reference.relevance[0], run['word'], rtol=1e-10, atol=1e-14)
        if family in ENCODER_DECODERS:
            torch.testing.assert_close(reference.decoder_relevance[0], run['decoder_word'], rtol=1e-10, atol=1e-14)
        else:
            report = runs['report']['attnlrp']
            assert float(report.sums[-1, 0]) == pytest.approx(run['other'], rel=1e-10, abs=1e-14)
            assert float(report.input_fraction[0]) == pytest.approx(fraction, rel=1e-10, abs=0)
        if family in POSITION_EMBEDDINGS or family in ENCODER_DECODERS:
            assert run['other'] != 0, 'position embeddings / the position bias received no relevance'
        else:
            assert run['other'] == 0 and not _other_embeddings(runs['model'])

    def test_attnlrp_operands(self, family, head):
        """The shares of Props. 3.1-3.3 layer by layer: A V gives half to V and half to A; the softmax rule
        passes ``x (R - s sum(R))`` to ``Q K^T``, which gives half to Q and half to K; act(gate) * up gives half
        to each. T5 adds its relative position bias ``c`` (an embedding of the query-key distance) to ``Q K^T``
        in its self-attention layers: there ``Q K^T`` gets its share ``Q K^T / z`` of the softmax input ``z``'s
        relevance and the bias its share ``c / z`` (the gradient at ``z`` carries the half of ``A``), so summed over
        the layers ``R(z) - R(Q) - R(K)`` is what the bias embedding receives. Cross-attention has no position
        bias."""
        run = _conservation_runs(family, head)['manual']['attnlrp']
        logit = run['logit']
        # T5: encoder self-attention, then per decoder block self- and cross-attention; cross-attention has no
        # position bias
        biased = [
            family in ENCODER_DECODERS and (index < LAYERS or (index - LAYERS) % 2 == 0)
            for index in range(len(run['attention']))
        ]
        bias_shares = []
        for layer, has_bias in zip(run['attention'], biased):
            assert layer['output'] != 0
            assert _close(layer['probabilities'], 0.5 * layer['output'], logit)
            assert _close(layer['value'], 0.5 * layer['output'], logit)
            assert _close(layer['query'], layer['key'], logit)
            if has_bias:
                bias_shares.append(layer['expected_scores'] - (layer['query'] + layer['key']))
            else:
                assert _close(layer['query'] + layer['key'], layer['expected_scores'], logit)
        if family in ENCODER_DECODERS:
            assert len(bias_shares) == 2 * LAYERS and all(abs(share) > 1e-6 * abs(logit) for share in bias_shares)
            assert _close(sum(bias_shares), run['other'], logit)
        assert len(run['mlp']) == GATED_MLPS.get(family, 0)
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


#: every family and head with an SDPA attention in transformers
SDPA_FAMILY_HEADS = tuple((family, head) for family, head in FAMILY_HEADS if family not in EAGER_ONLY)


@pytest.mark.parametrize('family, head', SDPA_FAMILY_HEADS)
def test_eager_equals_sdpa(family, head):
    """float64: eager and SDPA attention give the same relevances, for an unpadded row and a padded one (left
    padding for decoders, right padding of the encoder input for encoders and encoder-decoders), with AttnLRP and
    CP-LRP. Mixtures of experts run their experts as the eager loop (float64)."""
    ids = token_ids(family, SEQ, batch=2)
    extra = _decoder_kwargs(family, batch=2)
    mask = torch.ones_like(ids)
    if family in DECODERS:
        mask[1, :3] = 0
    else:
        mask[1, -3:] = 0
    models = {impl: tiny_model(family, head, attn_implementation=impl) for impl in ('eager', 'sdpa')}
    assert all(config._attn_implementation == impl for impl, model in models.items() for config in _configs(model))
    for composite in (AttnLRPEpsilon, CPLRPEpsilon):
        for attention_mask in (None, mask):
            with float64_softmax():
                eager, sdpa = (
                    explain(
                        models[impl],
                        ids,
                        attention_mask=attention_mask,
                        method=lrp_method(composite()),
                        composite=composite(),
                        **extra,
                    )
                    for impl in ('eager', 'sdpa')
                )
            assert torch.equal(eager.target, sdpa.target)
            torch.testing.assert_close(eager.logit, sdpa.logit, rtol=1e-12, atol=0)
            for result in (eager, sdpa):
                assert torch.isfinite(result.embedding_relevance).all()
                if attention_mask is not None:
                    assert float(result.relevance[attention_mask == 0].abs().max()) == 0
            assert _relative(eager.relevance, sdpa.relevance) < 1e-10
            assert _relative(eager.embedding_relevance, sdpa.embedding_relevance) < 1e-10
            if family in ENCODER_DECODERS:
                assert _relative(eager.decoder_relevance, sdpa.decoder_relevance) < 1e-10
                assert _relative(eager.decoder_embedding_relevance, sdpa.decoder_embedding_relevance) < 1e-10


def _configs(model):
    """The distinct configuration objects of ``model`` and its submodules."""
    return list(
        {
            id(config): config
            for config in (getattr(module, 'config', None) for module in model.modules())
            if config is not None
        }.values()
    )


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten().double(), b.flatten().double()]))[0, 1])


@pytest.mark.parametrize('family, head', FAMILY_HEADS)
def test_bfloat16(family, head):
    """A bfloat16 model (SDPA attention, eager for Gemma 2; mixtures of experts with transformers' default
    experts implementation outside the context) gives finite relevances that correlate with the float32 ones."""
    ids = token_ids(family, SEQ)
    extra = _decoder_kwargs(family)
    attention = 'eager' if family in EAGER_ONLY else 'sdpa'
    full = explain(tiny_model(family, head, torch.float32, attention), ids, **extra)
    model = tiny_model(family, head, torch.bfloat16, attention)
    assert all(parameter.dtype == torch.bfloat16 for parameter in model.parameters())
    half = explain(model, ids, target=full.target, **extra)
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
    if family in ENCODER_DECODERS:
        assert torch.isfinite(half.decoder_relevance).all()
        assert _correlation(full.decoder_relevance, half.decoder_relevance) > 0.9
    # bfloat16 actually changed something: the comparison is not between identical computations
    assert not torch.equal(full.relevance, half.relevance)


# ---------------------------------------------------------------------------------------------------------- restore

#: configuration values that the composites may change for the time of the context (``to_dict()`` leaves them out)
PRIVATE_CONFIG = ('_attn_implementation', '_experts_implementation')


def _restore_model(family, head):
    """The model of the restore tests: float64, except mixtures of experts: float32 with transformers' default
    experts implementation (``grouped_mm``; float64 would need the eager loop, which the composites set)."""
    if family in MOE:
        model = tiny_model(family, head, torch.float32)
        assert model.config._experts_implementation not in (None, 'eager')
        return model
    return tiny_model(family, head)


def _snapshot(model, family):
    """Logits and parameter gradients of a plain forward + backward, and the model's structure."""
    ids = token_ids(family, 8, seed=1)
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        logits = model(input_ids=ids, **_decoder_kwargs(family), **_forward_kwargs(model)).logits
        (logits * torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)).sum().backward()
    gradients = {
        name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.grad is not None
    }
    model.zero_grad(set_to_none=True)
    return {
        'logits': logits.detach(),
        'gradients': gradients,
        'state_dict': list(model.state_dict()),
        'modules': [(name, type(module)) for name, module in model.named_modules()],
        'parameters': {name: parameter.detach().clone() for name, parameter in model.named_parameters()},
        'training': [module.training for module in model.modules()],
        'config': model.config.to_dict(),
        'private': [{key: getattr(config, key, None) for key in PRIVATE_CONFIG} for config in _configs(model)],
    }


def _assert_restored(model, family, before):
    after = _snapshot(model, family)
    assert after['state_dict'] == before['state_dict']
    assert after['modules'] == before['modules']
    assert after['training'] == before['training']
    assert after['config'] == before['config']
    assert after['private'] == before['private']
    assert set(after['parameters']) == set(before['parameters'])
    assert all(torch.equal(after['parameters'][name], value) for name, value in before['parameters'].items())
    assert torch.equal(after['logits'], before['logits'])
    assert set(after['gradients']) == set(before['gradients']) and after['gradients']
    assert all(torch.equal(after['gradients'][name], value) for name, value in before['gradients'].items())
    leftovers = [
        (name, attribute)
        for name, module in model.named_modules()
        for attribute in HOOK_ATTRIBUTES
        if len(getattr(module, attribute))
    ]
    assert not leftovers
    assert not any(name.rsplit('.', 1)[-1].startswith('attnlrp_') for name, _ in model.named_modules())
    assert torch._C._len_torch_function_stack() == 0
    for tensor in model.parameters():
        assert not tensor._backward_hooks


#: AttnLRP on every family and head; CP-LRP (same canonizers, other rules) on one model per kind of attention
RESTORE_CASES = [(family, head, AttnLRPEpsilon) for family, head in FAMILY_HEADS] + [
    (family, head, CPLRPEpsilon)
    for family, head in (
        ('llama', 'causal_lm'),
        ('gpt2', 'causal_lm'),
        ('roberta', 'seq_cls'),
        ('mixtral', 'causal_lm'),
        ('t5', 'seq2seq'),
    )
]


@pytest.mark.parametrize(
    'family, head, composite',
    RESTORE_CASES,
    ids=[f'{family}-{head}-{composite.__name__}' for family, head, composite in RESTORE_CASES],
)
class TestRestore:
    def test_after_explain(self, family, head, composite):
        model = _restore_model(family, head)
        before = _snapshot(model, family)
        explain(
            model,
            token_ids(family, SEQ),
            method=lrp_method(composite()),
            composite=composite(),
            **_decoder_kwargs(family),
        )
        _assert_restored(model, family, before)

    def test_inside_context_changes_model(self, family, head, composite):
        """Sanity check of the snapshot: inside the context the model does differ (hooks, frozen parameters; the
        grouped experts of transformers stay, the engine sees their products)."""
        model = _restore_model(family, head)
        implementations = [getattr(config, '_experts_implementation', None) for config in _configs(model)]
        with composite().context(model) as modified:
            assert modified is model
            hooked = sum(len(module._forward_hooks) + len(module._forward_pre_hooks) for module in model.modules())
            frozen = not any(parameter.requires_grad for parameter in model.parameters())
            assert [getattr(config, '_experts_implementation', None) for config in _configs(model)] == implementations
        assert hooked > 0 and frozen
        assert all(parameter.requires_grad for parameter in model.parameters())

    def test_after_exception_in_block(self, family, head, composite):
        model = _restore_model(family, head)
        before = _snapshot(model, family)
        ids = token_ids(family, SEQ)
        with pytest.raises(KeyError, match='raised in the block'):
            with torch.enable_grad(), composite().context(model) as modified:
                embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
                output = modified(inputs_embeds=embeddings, **_decoder_kwargs(family), **_forward_kwargs(model))
                raise KeyError('raised in the block')
        del output
        _assert_restored(model, family, before)

    def test_after_exception_in_forward(self, family, head, composite):
        """An exception deep inside the forward pass (in the head, where the inline activations of RoBERTa are
        routed through modules) leaves nothing behind."""
        model = _restore_model(family, head)
        before = _snapshot(model, family)
        linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
        last = linears[-1]

        def fail(module, input, output):
            raise KeyError('raised in the forward')

        handle = last.register_forward_hook(fail)
        try:
            with pytest.raises(KeyError, match='raised in the forward'):
                explain(
                    model,
                    token_ids(family, SEQ),
                    method=lrp_method(composite()),
                    composite=composite(),
                    **_decoder_kwargs(family),
                )
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
        with pytest.raises(RuntimeError, match='already has AttnLRPEpsilon registered'):
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
    explain(roberta, token_ids('roberta', SEQ), method='cplrp', composite=CPLRPEpsilon())
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


# ---------------------------------------------------------------------------------------- beyond the former table


def _cplrp_ratio(model, ids) -> float:
    """CP-LRP's input relevance over the explained logit (float64, the model's biases zeroed by the caller)."""
    explanation = explain(model, ids, method='cplrp')
    return float(explanation.relevance.sum() / explanation.logit.sum())


def _bloom():
    return transformers.BloomForCausalLM(
        transformers.BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2)
    )


def _opt():
    return transformers.OPTForCausalLM(
        transformers.OPTConfig(
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=2,
            ffn_dim=64,
            num_attention_heads=4,
            max_position_embeddings=64,
            pad_token_id=0,
        )
    )


@pytest.mark.parametrize('build', [_bloom, _opt], ids=['bloom', 'opt'])
def test_models_the_former_table_refused_are_explained(build):
    """Bloom (ALiBi attention, its own GELU module) and OPT had no family entry and were refused; the engine explains
    them at their operations: CP-LRP conserves the logit exactly with their biases zeroed (OPT's learned positions
    are an input-independent bias, so zeroed as well)."""
    torch.manual_seed(0)
    model = zero_biases(build().double().eval())
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module is not model.get_input_embeddings():
            torch.nn.init.zeros_(module.weight)
    ratio = _cplrp_ratio(model, torch.tensor([[5, 17, 42, 9, 63, 21]]))
    assert ratio == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize('option, value', [('final_logit_softcapping', 30.0), ('attn_logit_softcapping', 50.0)])
def test_gemma3_softcapping_is_explained(option, value):
    """Gemma 3 with soft-capping (refused by the former table): the tanh gets the identity rule, CP-LRP conserves."""
    model = zero_biases(tiny_model('gemma3', 'causal_lm', attn_implementation='eager', **{option: value}))
    assert getattr(model.config, option) == value
    assert _cplrp_ratio(model, token_ids('gemma3', SEQ)) == pytest.approx(1.0, abs=1e-10)


def test_tiny_config_shapes():
    """The builders give what the tests assume: 2 layers, 4 heads, 2 key/value heads for GQA families; mixtures
    of experts with 4 experts, 2 per token; T5 in both feed-forward variants."""
    for family in ('llama', 'mistral', 'qwen2', 'qwen3', 'gemma3', 'olmo2', 'granite', 'gemma2', 'phi3'):
        config = tiny_config(family)
        assert (
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.intermediate_size,
        ) == (32, 2, 4, 2, 64)
    for family in MOE:
        config = tiny_config(family)
        assert (
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.num_experts_per_tok,
        ) == (32, 2, 4, 2, 2)
        assert getattr(config, 'num_local_experts', getattr(config, 'num_experts', None)) == 4
    assert tiny_config('qwen2_moe').norm_topk_prob is False and tiny_config('qwen3_moe').norm_topk_prob is True
    assert tiny_config('t5').is_gated_act and tiny_config('t5').dense_act_fn == 'gelu_new'
    assert not tiny_config('t5_relu').is_gated_act and tiny_config('t5_relu').dense_act_fn == 'relu'
    assert type(tiny_model('t5').encoder.block[0].layer[1].DenseReluDense).__name__ == 'T5DenseGatedActDense'
    assert type(tiny_model('t5_relu').encoder.block[0].layer[1].DenseReluDense).__name__ == 'T5DenseActDense'


class CountedIdentity(Identity):
    """The identity rule, counting the element-wise functions the engine applies it to and their smallest ratio
    ``f(x) / x`` (a composite's activation rule applies to functions computed inline too)."""

    calls: list = []

    @staticmethod
    def elementwise(input, output, gate=True):
        CountedIdentity.calls.append(float((output / input).detach().min()))
        return Identity.elementwise(input, output, gate)


class CountingComposite(AttnLRPEpsilon):
    """AttnLRP whose activation rule counts the element-wise functions computed inline (the activation modules get
    the plain identity rule)."""

    activation_rule = CountedIdentity

    def mapping(self, ctx, name, module):
        rule = super().mapping(ctx, name, module)
        return Identity() if isinstance(rule, CountedIdentity) else rule


def test_gemma2_softcapping_goes_through_the_identity_rule():
    """The tiny Gemma 2 soft-caps its attention scores and its logits well away from the identity (tanh(x) / x
    down to below 0.9); the engine applies the composite's activation rule (the identity rule) to every soft-capping
    tanh (one per attention layer, one after the LM head), so that the conservation tests above cover the identity
    rule on it."""
    model = tiny_model('gemma2', zero_bias=True)
    assert model.config.attn_logit_softcapping == GEMMA2_ATTN_SOFTCAP
    assert model.config.final_logit_softcapping == GEMMA2_FINAL_SOFTCAP
    CountedIdentity.calls = []
    embeddings = model.get_input_embeddings()(token_ids('gemma2', SEQ)).detach().requires_grad_(True)
    with CountingComposite().context(model):
        model(inputs_embeds=embeddings, use_cache=False)
    capped = [ratio for ratio in CountedIdentity.calls if ratio < 0.9]
    assert len(capped) == LAYERS + 1, CountedIdentity.calls


def test_conservation_report_t5():
    """What conservation() should report for an encoder-decoder model: with CP-LRP (biases zeroed) the encoder and
    decoder tokens together carry the whole logit."""
    model = tiny_model('t5', zero_bias=True)
    report = conservation(model, token_ids('t5', SEQ), composite=CPLRPEpsilon(), **_decoder_kwargs('t5'))
    assert float(report.input_fraction[0]) == pytest.approx(1, rel=1e-8, abs=0)
