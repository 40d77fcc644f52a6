"""The recurrences of sequence mixers (:py:mod:`zennit_attn.operations.recurrences`): Mamba's selective scan
equals MambaLRP's rules written out by hand, a gated delta rule gives the same relevance chunked and recurrent (and
equals the rule written out by hand), Mamba-2's chunked scan does not depend on its chunk size, and what the
declarations do not cover is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.models.mamba import modeling_mamba
from transformers.models.mamba2 import modeling_mamba2
from transformers.models.qwen3_next import modeling_qwen3_next

from tests.by_hand import attributed, by_hand, identity
from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.operations.recurrences import GATES, RECURRENCES, Recurrence

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')

#: transformers' recurrences compute in float32 (``.float()``, ``.to(torch.float32)``) also for float64 inputs: two of
#: their algorithms agree to its rounding
FLOAT32 = 1e-4


def tiny_mamba() -> transformers.MambaForCausalLM:
    torch.manual_seed(0)
    config = transformers.MambaConfig(
        vocab_size=40, hidden_size=16, state_size=4, num_hidden_layers=2, conv_kernel=3, expand=2, time_step_rank=4
    )
    return transformers.MambaForCausalLM(config).double().eval()


def rms_by_hand(hidden: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """RMSNorm with its normaliser constant (Prop. 3.4)."""
    scale = torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon).detach()
    return norm.weight * hidden * scale


def mixer_by_hand(mixer: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Mamba's mixer with MambaLRP's rules (Rezaei Jafari et al. 2024) written out: ``dt``, ``A``-bar, ``B``, ``C``
    constant, the identity rule on SiLU, half of the relevance of ``y * silu(z)`` to each factor; the recurrence run
    token by token."""
    length = hidden.shape[1]
    x, z = mixer.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)
    x = mixer.conv1d(x)[..., :length]
    x = identity(x, F.silu(x))
    rank, state_size = mixer.time_step_rank, mixer.ssm_state_size
    dt, b, c = torch.split(mixer.x_proj(x.transpose(1, 2)).detach(), [rank, state_size, state_size], dim=-1)
    dt = F.softplus(mixer.dt_proj(dt)).transpose(1, 2)
    a = -torch.exp(mixer.A_log)
    state = torch.zeros(x.shape[0], x.shape[1], state_size, dtype=x.dtype)
    outputs = []
    for t in range(length):
        state = torch.exp(a * dt[:, :, t, None]) * state + dt[:, :, t, None] * b[:, None, t] * x[:, :, t, None]
        outputs.append((state @ c[:, t, :, None])[..., 0])
    y = torch.stack(outputs, -1) + x * mixer.D[None, :, None]
    gated = y * identity(z, F.silu(z))
    gated = 0.5 * gated + 0.5 * gated.detach()  # the uniform rule on a product of two (Prop. 3.2)
    return mixer.out_proj(gated.transpose(1, 2))


def mamba_by_hand(model: transformers.MambaForCausalLM, ids: torch.Tensor, target: int) -> torch.Tensor:
    """Token relevance of ``target``'s logit at the last position, by MambaLRP's rules written out."""
    embeddings = model.backbone.embeddings(ids).detach().requires_grad_(True)
    hidden = embeddings
    for layer in model.backbone.layers:
        hidden = hidden + mixer_by_hand(layer.mixer, rms_by_hand(hidden, layer.norm))
    logits = model.lm_head(rms_by_hand(hidden, model.backbone.norm_f))
    logits[0, -1, target].backward()
    return (embeddings * embeddings.grad).sum(-1)[0]


def test_mamba_equals_mambalrps_rules_by_hand():
    """transformers' ``MambaForCausalLM`` explained by the engine (AttnLRP) equals MambaLRP's rules written out by
    hand, token by token (in float64, to the rounding of transformers' scan, which computes in float32;
    benchmarks/mambalrp_parity.py compares with MambaLRP's own code)."""
    model = tiny_mamba()
    ids = torch.randint(0, 40, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        target = int(model(ids).logits[0, -1].argmax())
    found = torch.as_tensor(explain(model, ids, target=target).relevance).flatten()
    expected = mamba_by_hand(model, ids, target)
    scale = float(expected.abs().max())
    torch.testing.assert_close(found, expected.detach(), rtol=FLOAT32, atol=FLOAT32 * scale)
    # the constants are held: the relevance is not the plain gradient times the input
    embeddings = model.backbone.embeddings(ids).detach().requires_grad_(True)
    model(inputs_embeds=embeddings).logits[0, -1, target].backward()
    plain = (embeddings * embeddings.grad).sum(-1)[0]
    assert float((plain - expected).abs().max()) > 0.05 * scale


class TinyGatedDeltaNet(torch.nn.Module):
    """Queries, keys, values, decay and write strength projected from the input, mixed by one of transformers' gated
    delta rule functions (``recurrence``), optionally with the constants detached by hand."""

    def __init__(self, recurrence, by_hand: bool = False, **options):
        super().__init__()
        torch.manual_seed(0)
        self.heads, self.width = 2, 4
        self.q, self.k, self.v = (torch.nn.Linear(6, 8, bias=False) for _ in range(3))
        self.a, self.b = torch.nn.Linear(6, 2, bias=False), torch.nn.Linear(6, 2, bias=False)
        self.o = torch.nn.Linear(8, 3, bias=False)
        self.recurrence, self.by_hand, self.options = recurrence, by_hand, options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, x.shape[1], self.heads, self.width)
        query, key, value = (projection(x).view(shape) for projection in (self.q, self.k, self.v))
        beta, g = self.b(x).sigmoid(), -F.softplus(self.a(x))
        if self.by_hand:
            query, key, beta, g = (tensor.detach() for tensor in (query, key, beta, g))
        output, _ = self.recurrence(query, key, value, g=g, beta=beta, use_qk_l2norm_in_kernel=True, **self.options)
        return self.o(output.reshape(1, x.shape[1], -1))


def delta_inputs() -> torch.Tensor:
    return torch.randn(1, 10, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_a_delta_rule_chunked_equals_recurrent(composite):
    """The chunked gated delta rule (3 chunks of 4, the UT transform solved) and the recurrent one are the same
    linear function of the values once queries, keys, decay and write strength are held: the same relevance, equal
    to the rule written out by hand, conserved (no biases)."""
    x = delta_inputs()
    chunked = TinyGatedDeltaNet(modeling_qwen3_next.torch_chunk_gated_delta_rule, chunk_size=4).double()
    recurrent = TinyGatedDeltaNet(modeling_qwen3_next.torch_recurrent_gated_delta_rule).double()
    written = TinyGatedDeltaNet(modeling_qwen3_next.torch_recurrent_gated_delta_rule, by_hand=True).double()
    found_chunked = attributed(chunked, composite(), x)
    found_recurrent = attributed(recurrent, composite(), x)
    torch.testing.assert_close(found_chunked, found_recurrent, rtol=FLOAT32, atol=FLOAT32)
    torch.testing.assert_close(found_recurrent, by_hand(written, x), rtol=1e-9, atol=1e-12)
    assert float(found_chunked.sum()) == pytest.approx(3 * 10, rel=1e-6)  # relevance 1 at each output


class TinyMamba2Scan(torch.nn.Module):
    """Mamba-2's chunked scan on projections of the input (4 heads of width 2, one group, state 3)."""

    def __init__(self, chunk_size: int):
        super().__init__()
        torch.manual_seed(0)
        self.x, self.dt = torch.nn.Linear(6, 8, bias=False), torch.nn.Linear(6, 4, bias=False)
        self.b, self.c = torch.nn.Linear(6, 3, bias=False), torch.nn.Linear(6, 3, bias=False)
        self.A = torch.nn.Parameter(-torch.linspace(0.5, 2, 4))
        self.chunk_size = chunk_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return modeling_mamba2.mamba2_chunk_scan(
            self.x(x).view(batch, length, 4, 2),
            self.dt(x),
            self.A,
            self.b(x).view(batch, length, 1, 3),
            self.c(x).view(batch, length, 1, 3),
            chunk_size=self.chunk_size,
            dt_softplus=True,
        )


def test_mamba2_relevance_does_not_depend_on_the_chunk_size():
    """Mamba-2's state-space duality chunked by 3 (four chunks, states passed between them) and by 16 (one chunk):
    the same relevance (float64), conserved by CP-LRP."""
    x = delta_inputs()
    small, large = TinyMamba2Scan(3).double(), TinyMamba2Scan(16).double()
    found_small, found_large = attributed(small, CPLRPEpsilon(), x), attributed(large, CPLRPEpsilon(), x)
    torch.testing.assert_close(found_small, found_large, rtol=FLOAT32, atol=FLOAT32)
    assert float(found_small.sum()) == pytest.approx(10 * 8, rel=1e-6)  # relevance 1 at each output


class ToyMambaMixer(torch.nn.Module):
    """A module named like a state-space mixer that mixes by a recurrence of its own (undeclared)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(6, 4, bias=False), torch.nn.Linear(6, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates, values = torch.sigmoid(self.a(x)), self.b(x)
        state, outputs = torch.zeros_like(values[:, 0]), []
        for t in range(x.shape[1]):
            state = gates[:, t] * state + values[:, t]
            outputs.append(state)
        return torch.stack(outputs, 1)


def test_a_mixer_without_a_declared_recurrence_is_refused():
    with pytest.raises(UnsupportedModelError, match='ToyMambaMixer.*ran none of the recurrences'):
        attributed(ToyMambaMixer().double(), AttnLRPEpsilon(), delta_inputs())


class SelfAttention(torch.nn.Module):
    """Softmax attention over the sequence (one head)."""

    def __init__(self, width: int = 6):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = (torch.nn.Linear(width, width, bias=False) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / x.shape[-1] ** 0.5
        return scores.softmax(-1) @ self.v(x)


class AttentionMixer(SelfAttention):
    """:py:class:`SelfAttention` under a name of a sequence mixer."""


class TokenMixer(SelfAttention):
    """:py:class:`SelfAttention` under another name of a sequence mixer."""


class GatedTokenMixer(SelfAttention):
    """A mixer named like :py:class:`TokenMixer` whose product takes no softmax output: ``q * k * v``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) * self.k(x) * self.v(x)


@pytest.mark.parametrize('mixer', [AttentionMixer, TokenMixer])
@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_softmax_attention_named_like_a_mixer_is_softmax_attention(mixer, composite):
    """What a module computes decides, not its name: before, softmax attention in a class named ``AttentionMixer``
    or ``TokenMixer`` was refused as "a sequence mixer that is not softmax attention"; it gets the relevance of the
    same module named ``SelfAttention`` (CP-LRP conserving each output's relevance 1), and a mixer without a softmax
    is still refused."""
    x = delta_inputs()
    found = attributed(mixer().double(), composite(), x)
    torch.testing.assert_close(found, attributed(SelfAttention().double(), composite(), x), rtol=0, atol=0)
    if composite is CPLRPEpsilon:
        assert float(found.sum()) == pytest.approx(x.shape[1] * x.shape[2], rel=1e-12)
    with pytest.raises(UnsupportedModelError, match='GatedTokenMixer.*ran none of the recurrences'):
        attributed(GatedTokenMixer().double(), composite(), x)


def toy_scan(values: torch.Tensor, decay: torch.Tensor, other: torch.Tensor | None = None) -> torch.Tensor:
    """A gated linear recurrence ``s_t = decay_t * s_{t-1} + values_t`` (times ``other`` where given)."""
    state, outputs = torch.zeros_like(values[:, 0]), []
    for t in range(values.shape[1]):
        state = decay[:, t] * state + values[:, t]
        outputs.append(state if other is None else state * other[:, t])
    return torch.stack(outputs, 1)


class ToyScanMixer(ToyMambaMixer):
    """A mixer that runs :py:func:`toy_scan` (declared in the tests), optionally with a third relevance-carrying
    argument."""

    def __init__(self, other: bool = False, by_hand: bool = False):
        super().__init__()
        self.other, self.by_hand = other, by_hand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        decay = torch.sigmoid(self.a(x))
        decay = decay.detach() if self.by_hand else decay
        return toy_scan(self.b(x), decay, self.b(x) if self.other else None)


@pytest.fixture
def declared_toy_scan(monkeypatch):
    """:py:func:`toy_scan` declared as a recurrence for the time of a test: ``values`` carry, ``decay`` constant."""
    monkeypatch.setitem(
        RECURRENCES,
        'toy_scan',
        Recurrence('toy_scan', 'toy scan', ('values',), ('decay',), modules=(__name__,)),
    )


def test_a_declared_recurrence_holds_its_constants(declared_toy_scan):
    """A recurrence declared by a user: its constant held (equal to the rule written out by hand), conserved."""
    x = delta_inputs()
    found = attributed(ToyScanMixer().double(), CPLRPEpsilon(), x)
    torch.testing.assert_close(found, by_hand(ToyScanMixer(by_hand=True).double(), x), rtol=1e-10, atol=1e-12)
    assert float(found.sum()) == pytest.approx(10 * 4, rel=1e-10)  # relevance 1 at each output


class ActivatedScanMixer(ToyMambaMixer):
    """:py:func:`toy_scan` of activated values (``silu``), its output times a gate (``sigmoid``)."""

    def __init__(self, by_hand: bool = False):
        super().__init__()
        self.c, self.by_hand = torch.nn.Linear(6, 4, bias=False), by_hand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        decay, values, gate = torch.sigmoid(self.a(x)), F.silu(self.b(x)), torch.sigmoid(self.c(x))
        if self.by_hand:
            decay, values, gate = decay.detach(), identity(self.b(x), values), gate.detach()
        return toy_scan(values, decay) * gate


def test_the_output_of_a_recurrence_is_a_value(declared_toy_scan):
    """A recurrence mixes its values with coefficients it holds constant: its output is a value, not a gate, even
    where its values are outputs of activations and it only rescales and adds them; CP-LRP holds the gate it is
    multiplied with constant (by hand) and conserves."""
    x = delta_inputs()
    found = attributed(ActivatedScanMixer().double(), CPLRPEpsilon(), x)
    torch.testing.assert_close(found, by_hand(ActivatedScanMixer(by_hand=True).double(), x), rtol=1e-10, atol=1e-12)
    assert float(found.sum()) == pytest.approx(10 * 4, rel=1e-10)


def test_a_relevance_carrying_argument_without_a_role_is_refused(declared_toy_scan):
    with pytest.raises(UnsupportedModelError, match="argument 'other', which its declaration gives no role"):
        attributed(ToyScanMixer(other=True).double(), AttnLRPEpsilon(), delta_inputs())


def test_a_product_inside_a_recurrence_without_gates_is_refused(declared_toy_scan, monkeypatch):
    """``state * other`` inside a recurrence whose declaration has no gates (``other`` given a value's role)."""
    monkeypatch.setitem(
        RECURRENCES,
        'toy_scan',
        Recurrence('toy_scan', 'toy scan', ('values', 'other'), ('decay',), modules=(__name__,)),
    )
    with pytest.raises(UnsupportedModelError, match='inside the recurrence toy_scan .*linear in its values'):
        attributed(ToyScanMixer(other=True).double(), AttnLRPEpsilon(), delta_inputs())


class ToyForgetGate(torch.nn.Module):
    """A decay computed with an exponential (a softplus written as ``log(1 + exp(x))``)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(-torch.log(1 + torch.exp(self.a(x))))


class ToyGatedScanMixer(ToyMambaMixer):
    """A mixer whose decay comes from a gate module: passed to :py:func:`toy_scan` as its constant, or (``misused``)
    also added to the values."""

    def __init__(self, misused: bool = False, by_hand: bool = False):
        super().__init__()
        self.gate, self.misused, self.by_hand = ToyForgetGate(), misused, by_hand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        decay = self.gate(x.detach() if self.by_hand else x).view(x.shape[0], x.shape[1], 4)
        values = self.b(x) + decay if self.misused else self.b(x)
        return toy_scan(values, decay)


@pytest.fixture
def declared_toy_gate(declared_toy_scan, monkeypatch):
    """:py:class:`ToyForgetGate` declared as a gate module for the time of a test."""
    monkeypatch.setitem(GATES, 'ToyForgetGate', 'a toy decay')


def test_a_gate_module_computes_a_constant(declared_toy_gate):
    """The exponentials inside a declared gate module are not refused; its output, passed to the recurrence as its
    constant, is held constant (equal to the rule written out by hand), conserved."""
    x = delta_inputs()
    found = attributed(ToyGatedScanMixer().double(), CPLRPEpsilon(), x)
    torch.testing.assert_close(found, by_hand(ToyGatedScanMixer(by_hand=True).double(), x), rtol=1e-10, atol=1e-12)
    assert float(found.sum()) == pytest.approx(10 * 4, rel=1e-10)


def test_a_gate_module_used_otherwise_is_refused(declared_toy_gate):
    with pytest.raises(UnsupportedModelError, match='a use of the output of ToyForgetGate, a term of a recurrence'):
        attributed(ToyGatedScanMixer(misused=True).double(), AttnLRPEpsilon(), delta_inputs())
    with pytest.raises(UnsupportedModelError, match='exp'):  # not declared: its exponential is refused
        del GATES['ToyForgetGate']
        attributed(ToyGatedScanMixer().double(), AttnLRPEpsilon(), delta_inputs())


class BoundedSqrt(torch.autograd.Function):
    """A square root with a custom backward (as RG-LRU's ``SqrtBoundDerivative``): a kernel of the tests' own."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sqrt()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / (2 * x.sqrt().clamp_min(1e-3))


class ToyDecayMixer(ToyMambaMixer):
    """An RG-LRU-like mixer: the decay an exponential of the input, the input scaled by ``sqrt(1 - decay^2)`` (a
    custom function of the decay), then :py:func:`toy_scan` (``declared``) or the same recurrence written inline."""

    def __init__(self, declared: bool = True, misused: bool = False, by_hand: bool = False):
        super().__init__()
        self.declared, self.misused, self.by_hand = declared, misused, by_hand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        decay = torch.exp(-F.softplus(self.a(x)))
        multiplier = BoundedSqrt.apply(1 - decay**2)
        if self.by_hand:
            decay, multiplier = decay.detach(), multiplier.detach()
        values = self.b(x) * multiplier + (decay if self.misused else 0)
        if self.declared:
            return toy_scan(values, decay)
        return ToyMambaMixer.forward(self, x) * multiplier


def test_decays_computed_in_a_mixer_are_constants(declared_toy_scan):
    """An exponential inside a mixer and a custom function of it are terms of the recurrence: constant where they
    scale the values and where the declared recurrence takes them (equal to the rule written out by hand),
    conserved."""
    x = delta_inputs()
    found = attributed(ToyDecayMixer().double(), CPLRPEpsilon(), x)
    torch.testing.assert_close(found, by_hand(ToyDecayMixer(by_hand=True).double(), x), rtol=1e-10, atol=1e-12)
    assert float(found.sum()) == pytest.approx(10 * 4, rel=1e-10)


@pytest.mark.parametrize(
    'options, match',
    [
        (dict(misused=True), 'a use of an exponential in ToyDecayMixer, a term of a recurrence'),
        (dict(declared=False), 'ToyDecayMixer.*ran none of the recurrences'),
    ],
)
def test_decays_used_otherwise_are_refused(declared_toy_scan, options, match):
    """A decay added to the values; a decay that scales the values of a recurrence that is not declared."""
    with pytest.raises(UnsupportedModelError, match=match):
        attributed(ToyDecayMixer(**options).double(), AttnLRPEpsilon(), delta_inputs())


class KernelScan(torch.autograd.Function):
    """A stand-in for mamba-ssm's selective-scan kernel (its module named like mamba-ssm's)."""

    @staticmethod
    def forward(ctx, x):
        return x.cumsum(1)

    @staticmethod
    def backward(ctx, grad):
        return grad.flip(1).cumsum(1).flip(1)


KernelScan.__module__ = 'mamba_ssm.ops.selective_scan_interface'


def test_a_kernel_of_a_recurrence_package_is_refused_with_what_to_do():
    model = torch.nn.Sequential(torch.nn.Linear(6, 4)).double()
    model.register_forward_hook(lambda module, args, output: KernelScan.apply(output))
    with pytest.raises(UnsupportedModelError, match='KernelScan.*mamba-ssm is installed.*pip uninstall mamba-ssm'):
        attributed(model, AttnLRPEpsilon(), delta_inputs())


class TinyMambaScan(torch.nn.Module):
    """Mamba's selective scan on projections of the input (8 channels, state 3), over the whole sequence or step by
    step with a carried state (as generation with a cache runs it)."""

    def __init__(self, steps: bool):
        super().__init__()
        torch.manual_seed(0)
        self.x, self.z, self.dt = (torch.nn.Linear(6, 8, bias=False) for _ in range(3))
        self.b, self.c = torch.nn.Linear(6, 3, bias=False), torch.nn.Linear(6, 3, bias=False)
        self.A = torch.nn.Parameter(-torch.linspace(0.5, 2, 24).view(8, 3))
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, z, dt = (projection(x).transpose(1, 2) for projection in (self.x, self.z, self.dt))
        b, c = self.b(x), self.c(x)
        if not self.steps:
            return modeling_mamba.mamba_selective_scan(
                hidden, dt, self.A, b.transpose(1, 2), c.transpose(1, 2), z=z, delta_softplus=True
            )
        state, outputs = torch.zeros(x.shape[0], 8, 3, dtype=x.dtype), []
        for t in range(x.shape[1]):
            outputs.append(
                modeling_mamba.mamba_selective_state_update(
                    state, hidden[..., t], dt[..., t], self.A, b[:, t], c[:, t], z=z[..., t], dt_softplus=True
                )
            )
        return torch.stack(outputs, -1)


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_mamba_scan_equals_its_steps(composite):
    """Mamba's scan over the sequence and its one-token update run token by token with a carried state: the same
    relevance (to the float32 rounding of the scan)."""
    x = delta_inputs()
    found_scan = attributed(TinyMambaScan(steps=False).double(), composite(), x)
    found_steps = attributed(TinyMambaScan(steps=True).double(), composite(), x)
    torch.testing.assert_close(found_scan, found_steps, rtol=FLOAT32, atol=FLOAT32)
    if composite is CPLRPEpsilon:
        assert float(found_scan.sum()) == pytest.approx(10 * 8, rel=1e-5)  # relevance 1 at each output
