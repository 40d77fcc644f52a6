"""The engine (:py:mod:`zennit_attn.canonizers.operations`): one relevance whatever attention implementation
or experts implementation a model runs, exact rules on hand-checkable modules, and named refusals.

(When the engine became the only one, issue 30, its relevance on the 21 language-model families of the former family
table, eager and SDPA, AttnLRP and CP-LRP, and on both ViTs equalled the table's to 3.5e-19; the naive references of
``tests/composites/test_reference.py``, ``test_t5_reference.py`` and ``test_moe_reference.py`` pin it since.)"""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import repeat_kv

from tests.by_hand import assert_same_relevance, attributed, by_hand, identity, scaled
from tests.models import FAMILIES, MOE, decoder_ids, tiny_model, token_ids
from tests.naive_rules import lrp
from zennit_attn import explain
from zennit_attn.canonizers import OperationCanonizer
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.core import UnsupportedModelError
from zennit_attn.core.kinds import norm_kind
from zennit_attn.rules import NormIdentity

HEADS = {'bert': 'seq_cls', 'roberta': 'masked_lm', 'distilbert': 'seq_cls', 't5': 'seq2seq', 't5_relu': 'seq2seq'}


def relevance(model, composite, inputs: dict) -> list[torch.Tensor]:
    """Relevance at every float input for relevance 1 at the largest last-position score."""
    leaves = {
        key: value.detach().clone().requires_grad_(True)
        for key, value in inputs.items()
        if isinstance(value, torch.Tensor) and value.is_floating_point()
    }
    rest = {key: value for key, value in inputs.items() if key not in leaves}
    with composite.context(model) as modified:
        output = modified(**leaves, **rest)
        scores = output.logits if hasattr(output, 'logits') else output
        scores = scores[0, -1] if scores.dim() == 3 else scores[0]
        scores[scores.argmax()].backward()
    return [leaf.grad for leaf in leaves.values()]


def family_inputs(family: str, model) -> dict:
    ids = token_ids(family, 7, 1, seed=2)
    inputs = {'inputs_embeds': model.get_input_embeddings()(ids)}
    if family.startswith('t5'):
        decoder = model.get_decoder().get_input_embeddings()
        inputs['decoder_inputs_embeds'] = decoder(decoder_ids(family, 3, 1))
        inputs['use_cache'] = False
    return inputs


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
@pytest.mark.parametrize('family', FAMILIES)
def test_attention_implementations_agree(family, composite):
    """Eager attention (products and a softmax) and SDPA (the engine's rule on its two products) give one relevance
    on every family, to the precision of eager attention's float32 softmax (1e-5 of the largest relevance; a share
    of 1/2 instead of 1/4 for query and key changes it by tens of percent); the parameters are trainable again after
    each context."""
    model = tiny_model(family, HEADS.get(family))
    inputs = family_inputs(family, model)
    found = {}
    soft_capped = getattr(model.config, 'attn_logit_softcapping', None) is not None  # Gemma 2: eager only
    for implementation in ('eager', 'eager' if soft_capped else 'sdpa'):
        model.config._attn_implementation = implementation
        found[implementation] = relevance(model, composite(), inputs)
        assert all(parameter.requires_grad for parameter in model.parameters())
    for eager, sdpa in zip(found['eager'], found['eager' if soft_capped else 'sdpa']):
        torch.testing.assert_close(sdpa, eager, rtol=0, atol=1e-5 * float(eager.abs().max()))


def sigmoid_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """An attention of one's own (pure torch): sigmoid weights of the shifted scores instead of a softmax."""
    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    scores = query @ key.transpose(-1, -2) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    weights = torch.sigmoid(scores - 2.0)
    return (weights @ value).transpose(1, 2).contiguous(), weights


def test_an_attention_function_of_ones_own_is_explained_as_it_is(monkeypatch):
    """An attention function registered with transformers (``AttentionInterface``) is what the model computes: the
    engine runs it (it was replaced by SDPA, and a sigmoid attention's logit explained as SDPA's: 0.166 where the model
    gave 0.201); CP-LRP conserves it exactly. A kernel (flash attention) still runs as SDPA inside the context, its
    setting restored after."""
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, 'zennit_test_sigmoid', sigmoid_attention)
    model = tiny_model('llama')
    model.config._attn_implementation = 'zennit_test_sigmoid'
    ids = token_ids('llama', 6)
    with torch.no_grad():
        logits = model(ids).logits[:, -1]
    explanation = explain(model, ids, method='cplrp')
    expected = logits[torch.arange(len(ids)), explanation.target]
    torch.testing.assert_close(explanation.logit, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(explanation.relevance.sum(-1), expected, rtol=1e-10, atol=1e-12)
    model.config._attn_implementation = 'flash_attention_2'
    with AttnLRPEpsilon().context(model):
        inside = model.config._attn_implementation
    assert inside == 'sdpa' and model.config._attn_implementation == 'flash_attention_2'


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
@pytest.mark.parametrize('implementation', ['grouped_mm', 'batched_mm'])
@pytest.mark.parametrize('family', MOE)
def test_grouped_experts_equal_the_loop(family, implementation, composite):
    """The engine keeps transformers' grouped and batched matrix products of the experts (the default
    ``grouped_mm`` is faster than the loop the table needs): products with frozen expert weights, linear in the
    tokens. Their relevance is the loop's (float32, 1e-5), and the experts run so inside the context."""
    model = tiny_model(family, dtype=torch.float32, experts_implementation=implementation)
    inputs = family_inputs(family, model)
    with composite().context(model):
        inside = model.config._experts_implementation
    grouped = relevance(model, composite(), inputs)
    model.config._experts_implementation = 'eager'
    loop = relevance(model, composite(), inputs)
    assert inside == implementation and grouped[0].abs().sum() > 0
    torch.testing.assert_close(grouped[0], loop[0], rtol=1e-5, atol=1e-5 * float(loop[0].abs().max()))


class Gated(torch.nn.Module):
    """``down(silu(gate(x)) * up(x)) / ||x||`` computed inline, with an inline softmax mixing of positions."""

    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x):
        mixed = torch.softmax(x @ x.transpose(-1, -2), -1) @ x
        return self.down(torch.nn.functional.silu(self.gate(mixed)) * self.up(mixed)) / x.norm()


def test_rules_by_hand():
    """The inline operations get AttnLRP's rules: computed here by hand in the gradient formulation."""
    torch.manual_seed(0)
    model = Gated().double()
    x = torch.randn(3, 4, dtype=torch.float64)
    for composite, gate_factor in ((AttnLRPEpsilon(), 0.5), (CPLRPEpsilon(), 0.0)):
        leaf = x.clone().requires_grad_(True)
        with composite.context(model) as modified:
            modified(leaf).sum().backward()
        # by hand: the output relevance 1 per element; norm constant; products by the uniform rule (CP: the
        # gate and the softmax output constant); silu by the identity rule; softmax plain gradient
        xx = x.clone().requires_grad_(True)
        norm = x.norm()
        scores_in = xx if gate_factor else xx.detach()
        scores = torch.softmax(scaled(scores_in, gate_factor) @ scaled(scores_in, gate_factor).transpose(-1, -2), -1)
        mixed = scaled(scores, gate_factor) @ scaled(xx, 0.5 if gate_factor else 1.0)
        gate = model.gate(mixed)
        activated = identity(gate, torch.nn.functional.silu(gate))
        out = model.down(scaled(activated, gate_factor) * scaled(model.up(mixed), 0.5 if gate_factor else 1.0)) / norm
        with_relevance = out.detach()
        (out * (1 / with_relevance)).sum().backward()
        torch.testing.assert_close(leaf.grad, xx.grad * x, rtol=1e-10, atol=1e-12)


class Exponential(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.exp(self.linear(x))


class Kernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class Custom(Exponential):
    def forward(self, x):
        return self.linear(Kernel.apply(x))


class TupleNorm(torch.nn.Module):
    def forward(self, x):
        return x * 2


class MambaMixer(Exponential):
    pass


class Block(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.mixer = inner

    def forward(self, x):
        return self.mixer(x)


@pytest.mark.parametrize(
    'model, match',
    [
        (Exponential(), r'exp in the model \(Exponential\)'),
        (Custom(), r'Kernel in .*custom autograd function'),
        (Block(MambaMixer()), r"exp in 'mixer' \(MambaMixer\).*MambaMixer is not softmax attention"),
    ],
)
def test_refusals_name_op_and_module(model, match):
    """An operation without a rule, a custom kernel and a state-space layer are refused, naming what and where; the
    model is left as it was."""
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(UnsupportedModelError, match=match):
        with AttnLRPEpsilon().context(model) as modified:
            modified(x)
    assert all(parameter.requires_grad for parameter in model.parameters())
    assert not model._forward_hooks and not model._forward_pre_hooks


class ScaledNorm(torch.nn.Module):
    """Named like a normalisation, but not one."""

    def forward(self, x):
        return x * 3


class CenteredNorm(torch.nn.Module):
    """A LayerNorm written by hand over dimension ``dim`` (no torch class): ``dim=1`` of ``[batch, channels, length]``
    is the channels-first layout of GotOcr2's and SqueezeBERT's norms."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim
        self.weight = torch.nn.Parameter(torch.rand(5) + 0.5)
        self.bias = torch.nn.Parameter(torch.zeros(5))

    def forward(self, x):
        centered = x - x.mean(self.dim, keepdim=True)
        shape = (-1,) + (1,) * (x.dim() - 1 - self.dim % x.dim())
        scale = torch.rsqrt(centered.pow(2).mean(self.dim, keepdim=True) + 1e-5)
        return centered * scale * self.weight.view(shape) + self.bias.view(shape)


class NoNorm(torch.nn.Module):
    """MobileBERT's ``NoNorm``: named like a normalisation, an element-wise affine map."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(5) + 0.5)
        self.bias = torch.nn.Parameter(torch.zeros(5))

    def forward(self, x):
        return x * self.weight + self.bias


class Transposed(torch.nn.Module):
    """``module`` applied to ``[batch, channels, length]`` (transposed in and out)."""

    def __init__(self, module):
        super().__init__()
        self.inner = module

    def forward(self, x):
        return self.inner(x.transpose(1, 2)).transpose(1, 2)


def norm_relevance(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Relevance at ``x`` (the engine, AttnLRP) for relevance 1 at three outputs of ``Block(module)``."""
    leaf = x.detach().clone().requires_grad_(True)
    with AttnLRPEpsilon().context(Block(module)) as modified:
        modified(leaf)[..., :3].sum().backward()
    return leaf.grad


def test_modules_named_like_norms_get_the_rules_of_what_they_compute():
    """Under the engine a module only named like a normalisation is classified inside: a hand-written
    LayerNorm, also over the channels of a channels-first layout, gets the LayerNorm rule (Prop. 3.4: equal to
    torch's LayerNorm under :py:class:`~zennit_attn.rules.NormIdentity`), an element-wise affine ``NoNorm`` and a
    scaling the epsilon rule of a diagonal linear map (``R_i = x_i w_i R_i / z_i``: all of the relevance)."""
    x = torch.randn(2, 5, dtype=torch.float64)
    norm = CenteredNorm().double()
    layer = torch.nn.LayerNorm(5, eps=1e-5).double()
    with torch.no_grad():
        layer.weight.copy_(norm.weight)
    expected = norm_relevance(layer, x)
    torch.testing.assert_close(norm_relevance(norm, x), expected, rtol=1e-10, atol=1e-12)
    channels = torch.randn(2, 5, 4, dtype=torch.float64)
    first = CenteredNorm(dim=1).double()
    with torch.no_grad():
        first.weight.copy_(norm.weight)
    torch.testing.assert_close(
        norm_relevance(first, channels), norm_relevance(Transposed(layer), channels), rtol=1e-10, atol=1e-12
    )
    selected = torch.zeros_like(x)
    selected[:, :3] = 1
    for module in (NoNorm().double(), ScaledNorm()):
        torch.testing.assert_close(norm_relevance(module, x), selected, rtol=1e-12, atol=1e-12)


def test_norm_identity_confirms_norms_by_name():
    """:py:class:`~zennit_attn.rules.NormIdentity` on a module only named like a normalisation (as a zennit
    composite may map it) confirms it at its first call and refuses what is not one."""
    x = torch.randn(2, 5, dtype=torch.float64)
    with pytest.raises(UnsupportedModelError, match='ScaledNorm is named like a normalisation but its output changes'):
        lrp(ScaledNorm(), NormIdentity(), [x], torch.ones_like(x))
    norm = CenteredNorm().double()
    layer = torch.nn.LayerNorm(5, eps=1e-5).double()
    with torch.no_grad():
        layer.weight.copy_(norm.weight)
    relevance = torch.randn(2, 5, dtype=torch.float64)
    (expected,) = lrp(layer, NormIdentity(), [x], relevance)
    (actual,) = lrp(norm, NormIdentity(), [x], relevance)
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)


class QKNorm(torch.nn.Module):
    """Named like a normalisation, but of two tensors at once (ZAYA's query/key norm): not a norm module; the
    engine sees its inside (the norms are normalisers, Prop. 3.4)."""

    def forward(self, query, key):
        return query * (2 / query.norm(dim=-1, keepdim=True)), key / key.norm(dim=-1, keepdim=True)


class PairAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = QKNorm()

    def forward(self, x):
        query, key = self.norm(x, x.flip(-1))
        return torch.softmax(query @ key.transpose(-1, -2), -1) @ x


def test_norm_of_two_tensors_is_opened():
    """CP-LRP through a query/key norm module: exact (the norms constant, the softmax constant), hand-computed: only
    the value path carries relevance."""
    assert norm_kind(QKNorm()) is None and norm_kind(CenteredNorm()) == 'probe'
    x = torch.randn(4, 5, dtype=torch.float64)
    found = attributed(PairAttention(), CPLRPEpsilon(), x)
    with torch.no_grad():
        query, key = QKNorm()(x, x.flip(-1))
        mixing = torch.softmax(query @ key.transpose(-1, -2), -1)
    expected = (mixing.transpose(-1, -2) @ (1 / (mixing @ x))) * x  # relevance 1 at every output element
    torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12)


class Routed(torch.nn.Module):
    """A routing weight selected from a softmax by ``max`` (Switch Transformers) or by slicing and ``cat`` (PhiMoE's
    two top-1 softmaxes), times an expert."""

    def __init__(self, select: str):
        super().__init__()
        self.select = select
        self.router, self.expert = torch.nn.Linear(4, 3, bias=False), torch.nn.Linear(4, 4, bias=False)

    def weight(self, x):
        probs = torch.softmax(self.router(x), -1)
        if self.select == 'max':
            return probs.max(-1, keepdim=True).values
        return torch.cat([probs[..., :1], probs[..., 2:]], -1).sum(-1, keepdim=True)

    def forward(self, x):
        return self.weight(x) * self.expert(x)


@pytest.mark.parametrize('select', ['max', 'cat'])
def test_routing_weights_are_gates(select):
    """Softmax outputs selected by max or joined by cat are gates: CP-LRP constants, so all relevance goes to the expert
    (exact conservation: the relevances sum to the number of outputs)."""
    torch.manual_seed(0)
    model = Routed(select).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    found = attributed(model, CPLRPEpsilon(), x)
    expected = by_hand(lambda xx: model.weight(xx).detach() * model.expert(xx), x)
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(found.sum(), torch.tensor(12.0, dtype=torch.float64), rtol=1e-10, atol=1e-12)


class MaskedRows(torch.nn.Module):
    """Attention whose padded query rows have only ``-inf`` logits (an additive mask; softmax NaN, replaced by 0 as LED
    does) and whose probabilities are padded (``F.pad``) before the product with the values."""

    def forward(self, x):
        scores = x @ x.transpose(-1, -2) + torch.tensor([0.0, 0.0, float('-inf')], dtype=x.dtype)[:, None]
        probs = torch.softmax(scores, -1).masked_fill(torch.tensor([False, False, True])[:, None], 0.0)
        padded = torch.nn.functional.pad(probs, (0, 1))
        return padded @ torch.cat([x, torch.zeros_like(x[:1])])


@pytest.mark.parametrize('composite, share', [(AttnLRPEpsilon, 0.5), (CPLRPEpsilon, 0.0)])
def test_fully_masked_rows_get_no_relevance(composite, share):
    """Rows of ``-inf`` logits pass no relevance (their softmax is NaN and replaced by a constant); padded
    probabilities stay gates. AttnLRP: Props. 3.1 and 3.3 by hand on the well-defined rows; CP-LRP: exact."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64)
    found = attributed(MaskedRows(), composite(), x)

    def forward(xx):
        scores = scaled(xx[:2], share) @ scaled(xx, share).transpose(-1, -2)
        probs = torch.cat([torch.softmax(scores, -1), torch.zeros(1, 3, dtype=xx.dtype)])
        return scaled(probs, share) @ scaled(xx, 0.5 if share else 1.0)

    assert torch.isfinite(found).all()
    torch.testing.assert_close(found, by_hand(forward, x), rtol=1e-10, atol=1e-12)


class Truncated(torch.nn.Module):
    """A recurrence whose first step runs without gradients (truncated backpropagation, as HRM's early cycles)."""

    def __init__(self):
        super().__init__()
        self.cell = torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        with torch.no_grad():
            state = self.cell(x)
        return self.cell(state + x)


class Thresholded(Truncated):
    """Statistics computed without gradients that only select (a mask, as PhiMoE's sparse mixer) or normalise."""

    def forward(self, x):
        with torch.no_grad():
            threshold = x.max(-1, keepdim=True).values
            scale = x.norm()
        return self.cell(x.masked_fill(x < threshold, 0.0)) / scale


def test_relevance_cut_by_no_grad_is_refused():
    """A tensor computed from the input under ``torch.no_grad()`` and then added to relevance-carrying tensors would
    lose the relevance through it: refused (raised inside the operator ``+``, it still arrives as the refusal); masks
    and normalisers computed without gradients are fine (exact conservation)."""
    x = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(UnsupportedModelError, match=r'add in the model \(Truncated\).*torch.no_grad\(\)'):
        attributed(Truncated().double(), CPLRPEpsilon(), x)
    model = Thresholded().double()
    found = attributed(model, CPLRPEpsilon(), x)
    expected = by_hand(model, x)  # linear in x for the fixed mask and scale
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)
    assert not model.__dict__.get('forward') and not model._forward_hooks


class Positioned(torch.nn.Module):
    """Sinusoidal positions computed in the forward (PegasusX) and an additive attention mask (0 / -1e9)."""

    def forward(self, x):
        with torch.no_grad():
            positions = torch.sin(torch.arange(x.shape[0], dtype=x.dtype)[:, None] + torch.arange(x.shape[1]))
        hidden = x + positions
        scores = hidden @ hidden.transpose(-1, -2) + torch.tensor([0.0, -1e9, 0.0], dtype=x.dtype)
        return torch.softmax(scores, -1) @ hidden


def test_constant_tensors_are_noted():
    """A constant tensor added to relevance-carrying ones is a bias that cannot be zeroed: recorded (shape, largest
    magnitude) for the zoo's "not exactly conservative by design"; additive masks are not."""
    composite = CPLRPEpsilon()
    attributed(Positioned(), composite, torch.randn(3, 2, dtype=torch.float64))
    canonizer = composite.operation_canonizer
    assert isinstance(canonizer, OperationCanonizer) and len(canonizer.constants) == 1
    path, value = canonizer.constants[0]
    assert path == '' and value == pytest.approx(float(torch.sin(torch.tensor(2.0))))  # largest |sin(i + j)|, i<3, j<2
    assert f'{value:g}' == 'tensor of shape [3, 2] (largest |value| 0.909297)'


class Sink(torch.nn.Module):
    """Attention with a sink applied as ``sigmoid(logsumexp(z) - s)`` (GraniteSWA's eager attention)."""

    def __init__(self, misuse: bool = False):
        super().__init__()
        self.sink, self.misuse = torch.nn.Parameter(torch.tensor(0.7)), misuse

    def forward(self, x):
        scores = x @ x.transpose(-1, -2)
        lse = torch.logsumexp(scores, -1)
        if self.misuse:  # a log-softmax by hand: no rule
            return (scores - lse[:, None]) @ x
        mass = (lse - self.sink).sigmoid()
        return (torch.softmax(scores, -1) @ x) * mass[:, None]


@pytest.mark.parametrize('composite, share', [(AttnLRPEpsilon, 0.5), (CPLRPEpsilon, 0.0)])
def test_attention_sink_is_the_extended_softmax(composite, share):
    """``(softmax(z) @ V) sigmoid(logsumexp(z) - s)`` is ``softmax([z, s]) @ [V; 0]``: by hand, Props. 3.1 and 3.3
    on the extended softmax (CP-LRP: exact conservation)."""
    torch.manual_seed(0)
    model = Sink().double()
    x = torch.randn(3, 4, dtype=torch.float64)
    found = attributed(model, composite(), x)

    def forward(xx):
        scores = scaled(xx, share) @ scaled(xx, share).transpose(-1, -2)
        extended = torch.cat([scores, model.sink.detach().expand(3, 1)], -1)
        probs = torch.softmax(extended, -1)[:, :3]
        return scaled(probs, share) @ scaled(xx, 0.5 if share else 1.0)

    torch.testing.assert_close(found, by_hand(forward, x), rtol=1e-10, atol=1e-12)
    if not share:
        torch.testing.assert_close(found.sum(), torch.tensor(12.0, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    with pytest.raises(UnsupportedModelError, match=r'log_softmax \(used by matmul\).*not exponentiated'):
        attributed(Sink(misuse=True).double(), composite(), x)


class DynamicMask(torch.nn.Module):
    """Doge's dynamic mask: a per-key bias ``exp(A softplus(W v))`` of the logits, causally masked, added in eager
    attention or passed as the mask of ``scaled_dot_product_attention``."""

    def __init__(self, sdpa: bool):
        super().__init__()
        self.sdpa, self.dt, self.A = sdpa, torch.nn.Linear(4, 1, bias=False), torch.nn.Parameter(torch.tensor(-0.7))

    def bias(self, x, identity=lambda input, output: output):
        inner = identity(self.dt(x), torch.nn.functional.softplus(self.dt(x)))
        bias = identity(self.A * inner, torch.exp(self.A * inner)).transpose(-1, -2).expand(-1, -1, 3, -1)
        return bias.masked_fill(~torch.ones(3, 3, dtype=torch.bool).tril(), torch.finfo(x.dtype).min)

    def forward(self, x):
        if self.sdpa:
            return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=self.bias(x))
        return torch.softmax(x @ x.transpose(-1, -2) / 2 + self.bias(x), -1) @ x


@pytest.mark.parametrize('sdpa', [False, True])
@pytest.mark.parametrize('composite, share', [(AttnLRPEpsilon, 0.5), (CPLRPEpsilon, 0.0)])
def test_logit_bias_gets_the_scores_share(composite, share, sdpa):
    """An additive bias of the logits computed by element-wise functions (exp, softplus: identity rule, Eq. 9) gets
    the relevance of the logits (Prop. 3.1) by the sum's plain gradient; in SDPA the mask's gradient has the scores'
    share (1/2; CP-LRP: 0). By hand on the eager form; an exponential used otherwise stays refused."""
    torch.manual_seed(0)
    model = DynamicMask(sdpa).double()
    x = torch.randn(1, 1, 3, 4, dtype=torch.float64)
    found = attributed(model, composite(), x)

    def forward(xx):
        bias = model.bias(xx if share else xx.detach(), identity)
        probs = torch.softmax(scaled(xx, share) @ scaled(xx, share).transpose(-1, -2) / 2 + bias, -1)
        return scaled(probs, share) @ scaled(xx, 0.5 if share else 1.0)

    torch.testing.assert_close(found, by_hand(forward, x), rtol=1e-10, atol=1e-12)
    with pytest.raises(UnsupportedModelError, match=r'exp \(used by mul\) in the model \(ExpGate\)'):
        attributed(ExpGate().double(), composite(), x[0, 0, :, :3])
    with pytest.raises(UnsupportedModelError, match=r'exp \(used by scaled_dot_product_attention\) in the model'):
        attributed(ExpGate(sdpa=True).double(), composite(), x[..., :3])


class ExpGate(Exponential):
    """An exponential used as a factor, or as the values of attention."""

    def __init__(self, sdpa: bool = False):
        super().__init__()
        self.sdpa = sdpa

    def forward(self, x):
        if self.sdpa:
            return torch.nn.functional.scaled_dot_product_attention(x, x, torch.exp(self.linear(x)))
        return torch.exp(self.linear(x)) * x


class LogRouted(torch.nn.Module):
    """Top-2 routing weights of ``softmax(logsigmoid(router(x)))`` times the selected experts, the softmax written as
    ``softmax`` or in log space as Inkling's router does: ``exp(z - logsumexp(z))`` after top-k (``'topk'``), of the
    gathered logits (``'gather'``, renormalised over the selection), or ``exp(log_softmax(z))`` (``'log_softmax'``)."""

    def __init__(self, form: str, log: bool):
        super().__init__()
        self.form, self.log = form, log
        self.router, self.expert = torch.nn.Linear(4, 3, bias=False), torch.nn.Linear(4, 12, bias=False)

    def weight(self, x):
        logits = torch.nn.functional.logsigmoid(self.router(x))
        index = logits.topk(2, -1).indices
        if self.form == 'gather':
            logits = logits.gather(-1, index)
        if not self.log:
            probs = torch.softmax(logits, -1)
            return probs if self.form == 'gather' else probs.gather(-1, index), index
        if self.form == 'log_softmax':
            return torch.nn.functional.log_softmax(logits, -1).gather(-1, index).reshape(-1).view(3, 2).exp(), index
        log_probs = logits - torch.logsumexp(logits.to(x.dtype), -1)[:, None]
        selected = log_probs if self.form == 'gather' else log_probs.topk(2, -1).values
        return selected.exp(), index

    def forward(self, x):
        weight, index = self.weight(x)
        experts = self.expert(x).view(-1, 3, 4).gather(1, index[..., None].expand(-1, -1, 4))
        return (weight[..., None] * experts).sum(1)


@pytest.mark.parametrize('form', ['topk', 'gather', 'log_softmax'])
@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_log_space_routing_is_a_softmax(form, composite):
    """``exp(z - logsumexp(z))`` and ``exp(log_softmax(z))`` (viewed, selected by top-k or gathered) are ``softmax(z)``:
    the relevance equals that of the same router written with ``softmax`` (float64, 1e-12): a gate, AttnLRP's softmax
    rule (Prop. 3.1) and uniform rule (Prop. 3.2); CP-LRP: a constant (exact conservation)."""
    torch.manual_seed(0)
    assert_same_relevance(LogRouted(form, log=True), LogRouted(form, log=False), composite, outputs=12)


class LogSumExpMisuse(torch.nn.Module):
    """A logsumexp or log-softmax that is not exponentiated into a softmax."""

    def __init__(self, misuse: str):
        super().__init__()
        self.misuse = misuse

    def forward(self, x):
        scores = x @ x.transpose(-1, -2)
        lse = torch.logsumexp(scores, -1)
        if self.misuse == 'lse':  # the normaliser itself as a factor
            return lse[:, None] * x
        if self.misuse == 'broadcast':  # z - logsumexp(z) broadcast along the wrong dimension: no log-softmax
            return (scores - lse).exp() @ x
        if self.misuse == 'shifted':  # a log-softmax shifted before exp
            return ((scores - lse[:, None]) + 1.0).exp() @ x
        return torch.log_softmax(scores, -1) * x[:, :1]


@pytest.mark.parametrize(
    'misuse, match',
    [
        ('lse', r'logsumexp \(used by mul\)'),
        ('broadcast', r'logsumexp \(used by sub\)'),
        ('shifted', r'log_softmax \(used by add\)'),
        ('log_softmax', r'log_softmax \(used by mul\)'),
    ],
)
def test_other_log_softmax_uses_are_refused(misuse, match):
    """Only ``exp`` of a log-softmax (after casts, views, selections) is a softmax; other uses of a logsumexp or a
    log-softmax are refused by name."""
    x = torch.randn(3, 3, dtype=torch.float64)
    for composite in (AttnLRPEpsilon, CPLRPEpsilon):
        with pytest.raises(UnsupportedModelError, match=match + r' in the model \(LogSumExpMisuse\)'):
            attributed(LogSumExpMisuse(misuse), composite(), x)


class ClampedMLP(torch.nn.Module):
    """A gated MLP whose up projection is bounded, as DeepSeek-V4's and gpt-oss's: ``silu(gate(x)) * up(x).clamp()``
    (with bounds the values never reach, or none)."""

    def __init__(self, clamp: bool):
        super().__init__()
        self.clamp = clamp
        self.gate, self.up = torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(4, 6, bias=False)
        self.down = torch.nn.Linear(6, 3, bias=False)

    def forward(self, x):
        up = self.up(x).clamp(-100.0, 100.0) if self.clamp else self.up(x)
        return self.down(torch.nn.functional.silu(self.gate(x)) * up)


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_a_clamped_value_is_no_gate(composite):
    """A clamp bounds a value; it does not make it a gate: the relevance equals the unclamped MLP's (float64, 1e-12;
    CP-LRP conserves: 9 outputs of relevance 1). Before, both factors were gates and CP-LRP's relevance was 0."""
    torch.manual_seed(0)
    assert_same_relevance(ClampedMLP(True), ClampedMLP(False), composite, outputs=9)


class AddedProduct(torch.nn.Module):
    """``p + a * b`` or ``p + a @ b^T`` of three projections of the input, fused (``addcmul``, ``addmm``, ``linear``
    with ``p`` as its bias) or written out."""

    def __init__(self, form: str, fused: bool):
        super().__init__()
        self.form, self.fused = form, fused
        width = 4 if form == 'addcmul' else 3
        self.p, self.a, self.b = (torch.nn.Linear(4, width if index == 0 else 4, bias=False) for index in range(3))

    def forward(self, x):
        p, a, b = self.p(x), self.a(x), self.b(x)
        if self.form == 'addcmul':
            return torch.addcmul(p, a, b) if self.fused else p + a * b
        if self.form == 'addmm':
            return torch.addmm(p, a, b.T) if self.fused else p + a @ b.T
        return torch.nn.functional.linear(a, b, p[0]) if self.fused else a @ b.T + p[0]


@pytest.mark.parametrize('form, outputs', [('addcmul', 12), ('addmm', 9), ('linear', 9)])
@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_added_term_of_a_product_keeps_its_gradient(form, outputs, composite):
    """The added term of ``addcmul``/``addmm`` and the bias of ``linear`` keep the plain gradient, the factors share
    the product's: the relevance equals the written-out sum's (float64, 1e-12), CP-LRP conserves. Before, the added
    term counted as a third factor (a third of its relevance)."""
    torch.manual_seed(0)
    assert_same_relevance(AddedProduct(form, True), AddedProduct(form, False), composite, outputs=outputs)


class AddedFactor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        a = self.a(x)
        return torch.addcmul(a, a, self.b(x))


def test_added_term_that_is_also_a_factor_is_refused():
    with pytest.raises(
        UnsupportedModelError,
        match=r'addcmul in the model \(AddedFactor\): a product with a '
        r'relevance-carrying tensor that is also its additive term',
    ):
        attributed(AddedFactor().double(), AttnLRPEpsilon(), torch.randn(3, 4, dtype=torch.float64))


class Sinkhorn(torch.nn.Module):
    """Mixing weights of three streams: a softmax renormalised by Sinkhorn iterations (rows, then columns), as
    DeepSeek-V4's hyper-connections (20 iterations: 40 divisions between the softmax and its use)."""

    def __init__(self, iterations: int):
        super().__init__()
        self.iterations = iterations
        self.router, self.value = torch.nn.Linear(4, 9, bias=False), torch.nn.Linear(4, 12, bias=False)

    def forward(self, x):
        mix = torch.softmax(self.router(x).view(-1, 3, 3), -1)
        for _ in range(self.iterations):
            mix = mix / mix.sum(-1, keepdim=True)
            mix = mix / mix.sum(-2, keepdim=True)
        return (mix @ self.value(x).view(-1, 3, 4)).flatten(1)


@pytest.mark.parametrize('iterations', [1, 20])
def test_sinkhorn_normalised_softmax_is_a_gate(iterations):
    """The renormalised softmax stays a gate however long the chain: CP-LRP conserves exactly (36 outputs of relevance
    1); with 20 iterations it did not (the chain was longer than the gate search went)."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64)
    found = attributed(Sinkhorn(iterations).double(), CPLRPEpsilon(), x)
    torch.testing.assert_close(found.sum(), torch.tensor(36.0, dtype=torch.float64), rtol=1e-10, atol=1e-12)


PIECEWISE = {
    'sign': torch.sign,
    'round': torch.round,
    'floor': torch.floor,
    'trunc': torch.trunc,
    'remainder': lambda a: a % 0.7,
    'fmod': lambda a: torch.fmod(a, 0.7),
}


class Piecewise(torch.nn.Module):
    """A piecewise-constant or remainder function (:py:data:`PIECEWISE`) of a projection of the input."""

    def __init__(self, name: str):
        super().__init__()
        self.function, self.a = PIECEWISE[name], torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return self.function(self.a(x))


@pytest.mark.parametrize('name', PIECEWISE)
@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_piecewise_functions_get_the_identity_rule(name, composite):
    """``sign``, roundings and remainders are element-wise non-linearities: the identity rule (Eq. 9), computed by
    hand (float64, 1e-12), so relevance is conserved. Before, roundings and ``sign`` passed their zero gradient (the
    relevance vanished) and remainders their gradient 1 (``x`` instead of ``x mod c``)."""
    torch.manual_seed(0)
    model = Piecewise(name).double()
    x = torch.randn(3, 4, dtype=torch.float64) * 2
    expected = by_hand(lambda xx: identity(model.a(xx), model(xx)), x)
    found = attributed(model, composite(), x)
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(found.sum(), (model(x) != 0).sum().double(), rtol=1e-10, atol=1e-12)


class ElementProduct(torch.nn.Module):
    """The product of the elements of a projection of the input along its last dimension (``dim``), or of all of them
    (``None``): ``prod``, or the same factors as the operands of one ``einsum`` (``einsum=True``)."""

    def __init__(self, dim, einsum: bool):
        super().__init__()
        self.dim, self.einsum = dim, einsum
        self.a = torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        a = self.a(x)
        if self.einsum:
            factors = a.unbind(-1) if self.dim is not None else a.flatten().unbind()
            return torch.einsum(','.join('...' for _ in factors) + '->...', *factors).reshape(-1, 1)
        return (a.prod(self.dim) if self.dim is not None else a.prod()).reshape(-1, 1)


@pytest.mark.parametrize('dim, outputs', [(-1, 3), (None, 1)])
@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_product_of_elements_is_the_uniform_rule(dim, outputs, composite):
    """``prod`` of N elements gives each 1/N of its relevance (Prop. 3.2), as ``einsum`` gives its N operands (float64,
    1e-12) and as computed by hand; CP-LRP conserves. Before, each element got the whole (N times the relevance)."""
    torch.manual_seed(0)
    assert_same_relevance(ElementProduct(dim, False), ElementProduct(dim, True), composite, outputs=outputs)
    model = ElementProduct(dim, False).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    count = 4 if dim is not None else 12
    expected = by_hand(lambda xx: model(scaled(xx, 1 / count)), x)  # the linear layer passes relevance unchanged
    torch.testing.assert_close(attributed(model, composite(), x), expected, rtol=1e-10, atol=1e-12)


def test_instance_settings_compute_every_cycle_with_gradients():
    """HRM-Text runs all but its last inner cycles without gradients (truncated backpropagation): the engine
    sets its instance to compute every cycle with them
    (:py:data:`~zennit_attn.canonizers.operations.INSTANCE_SETTINGS`),
    so CP-LRP is conservative, and puts the truncation back afterwards."""
    from transformers import HrmTextConfig, HrmTextForCausalLM

    config = HrmTextConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        H_cycles=2,
        L_cycles=3,
        num_layers_per_stack=1,
        num_hidden_layers=8,
    )
    torch.manual_seed(0)
    model = HrmTextForCausalLM(config).double().eval()
    truncated = list(model.model.L_bp_cycles_padded)
    assert truncated != [3, 3]
    embeddings = model.get_input_embeddings()(torch.tensor([[5, 9, 13, 2, 40]])).detach().requires_grad_(True)
    with CPLRPEpsilon().context(model) as modified:
        assert model.model.L_bp_cycles_padded == [3, 3]
        logits = modified(inputs_embeds=embeddings, use_cache=False).logits[0, -1]
        target = logits[logits.argmax()]
        target.backward()
    assert model.model.L_bp_cycles_padded == truncated
    bias = sum(float(value.abs().sum()) for name, value in model.named_parameters() if name.endswith('bias'))
    assert bias == 0
    # the relevance 1 given at the explained logit (the root's boundary) reaches the embeddings whole
    torch.testing.assert_close(embeddings.grad.sum(), torch.tensor(1.0, dtype=torch.float64), rtol=1e-9, atol=1e-9)


def _alive_after_the_forward(model, composite, ids: torch.Tensor) -> int:
    """Bytes of the storages autograd saved in one forward (parameters apart) still alive when the backward pass
    begins, under ``composite`` (None: the plain gradient with frozen weights)."""
    seen = {}
    parameters = {tensor.untyped_storage().data_ptr() for tensor in (*model.parameters(), *model.buffers())}

    def pack(tensor):
        storage = tensor.untyped_storage()
        seen.setdefault(storage.data_ptr(), (weakref.ref(storage), storage.nbytes()))
        return tensor

    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
    context = composite.context(model) if composite is not None else frozen(model)
    with context:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            logit = model(inputs_embeds=embeddings).logits[0, -1, 3]
        gc.collect()
        alive = sum(size for pointer, (storage, size) in seen.items() if pointer not in parameters and storage())
        logit.backward()
    return alive


@contextlib.contextmanager
def frozen(model):
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    for parameter in parameters:
        parameter.requires_grad_(False)
    try:
        yield model
    finally:
        for parameter in parameters:
            parameter.requires_grad_(True)


def test_the_marks_of_a_forward_keep_nothing_alive_at_the_backward():
    """The engine's marks are kept by autograd node during the forward; after it they are let go, and with them what
    the nodes of the branches that CP-LRP's rules cut off (constant gates, softmaxes) saved: CP-LRP keeps no more
    alive at the backward pass than the plain pass (1.10x of it while the marks were kept)."""
    model = tiny_model('llama')
    ids = token_ids('llama', 24)
    plain = _alive_after_the_forward(model, None, ids)
    assert _alive_after_the_forward(model, CPLRPEpsilon(), ids) <= plain
