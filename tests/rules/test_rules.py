"""Each AttnLRP rule of modules against a naive re-implementation of the paper's formula (float64, exact to
1e-10); the product rules, which the engine applies at operations, are tested in
``tests/operations/test_classifier.py``."""

import gc
import weakref

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from zennit.composites import LayerMapComposite

from tests.by_hand import attributed
from tests.naive_rules import epsilon_rule, identity_rule, lrp, norm_rule, scale_rule, stabilize
from tests.numbers import assert_close
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.core.errors import UnsupportedModelError
from zennit_attn.rules import Epsilon, Identity, NormIdentity, RelevanceBoundary


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.mark.parametrize('epsilon', [0.0, 1e-6, 0.5])
def test_epsilon_linear(epsilon):
    """Eq. 8: R_i = sum_j W_ji x_i R_j / (z_j + eps sign z_j), bias included in z."""
    linear = torch.nn.Linear(5, 4).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    relevance = torch.randn(3, 4, dtype=torch.float64)
    (actual,) = lrp(linear, Epsilon(epsilon), [x], relevance)

    z = x @ linear.weight.T + linear.bias
    denominator = stabilize(z, epsilon)
    expected = torch.einsum('ji,bi,bj->bi', linear.weight, x, relevance / denominator)
    assert_close(actual, expected)
    if epsilon == 0:
        # what the bias absorbs is exactly b_j R_j / z_j
        assert_close(relevance.sum(1) - actual.sum(1), (linear.bias * relevance / z).sum(1))


@pytest.mark.parametrize('activation', [torch.nn.GELU(), torch.nn.SiLU(), torch.nn.Tanh(), torch.nn.GELU('tanh')])
def test_identity_activation(activation):
    """Eq. 9: element-wise non-linearities pass relevance unchanged."""
    x = torch.randn(4, 6, dtype=torch.float64)
    x[0, 0] = 0.0
    relevance = torch.randn(4, 6, dtype=torch.float64)
    relevance[0, 0] = 0.0  # relevance at f(0) = 0 is 0
    (actual,) = lrp(activation, Identity(), [x], relevance)
    assert_close(actual, relevance)


def test_norm_identity_layer_norm():
    """Prop. 3.4 with epsilon rules on the affine parts: centering M x (linear), normalisation (identity), then
    y = w n + b (element-wise linear with bias)."""
    norm = torch.nn.LayerNorm(6).double()
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(3, 6, dtype=torch.float64)
    relevance = torch.randn(3, 6, dtype=torch.float64)
    (actual,) = lrp(norm, NormIdentity(), [x], relevance)

    centering = torch.eye(6, dtype=torch.float64) - 1 / 6
    centered = x @ centering.T
    normalised = centered / torch.sqrt(centered.pow(2).mean(1, keepdim=True) + norm.eps)
    y = norm.weight * normalised + norm.bias
    relevance_normalised = scale_rule(normalised, norm.weight, y, relevance)
    relevance_centered = norm_rule(relevance_normalised)
    expected = epsilon_rule(x, centering, centered, relevance_centered)
    assert_close(actual, expected)


@pytest.mark.parametrize('norm', [LlamaRMSNorm(6, eps=1e-6), torch.nn.RMSNorm(6, eps=1e-6)])
def test_norm_identity_rms_norm(norm):
    """Prop. 3.4 for RMSNorm: identity on x / g(x), epsilon on the weight: R_x = R_y."""
    norm = norm.double()
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 6, dtype=torch.float64)
    relevance = torch.randn(3, 6, dtype=torch.float64)
    (actual,) = lrp(norm, NormIdentity(), [x], relevance)
    assert_close(actual, relevance)


class BiasedRMSNorm(LlamaRMSNorm):
    """An RMSNorm with a bias, ``y = x c w + b`` (xLSTM's ``xLSTMRMSNorm(use_bias=True)``)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__(hidden_size, eps=eps)
        self.bias = torch.nn.Parameter(torch.randn(hidden_size))

    def forward(self, hidden_states):
        return super().forward(hidden_states) + self.bias


def test_norm_identity_rms_norm_with_a_bias():
    """Prop. 3.4 with the epsilon rule on the affine part: ``R_x = R_y (y - b) / y``, the bias absorbing its share (as
    LayerNorm's does); before, the identity rule gave the bias's share to ``x``."""
    norm = BiasedRMSNorm(6).double()
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 6, dtype=torch.float64)
    relevance = torch.randn(3, 6, dtype=torch.float64)
    (actual,) = lrp(norm, NormIdentity(), [x], relevance)
    with torch.no_grad():
        y = norm(x)
    assert_close(actual, relevance * (y - norm.bias) / y)


class ScaledRMSNorm(LlamaRMSNorm):
    """An RMSNorm with a keyword argument that changes its output: a call with it cannot be recomputed from ``x``."""

    def forward(self, hidden_states, scale=1.0):
        return super().forward(hidden_states) * scale


def alive_saved_bytes(module, x) -> tuple[torch.Tensor, int]:
    """``module(x)`` and the bytes of the distinct storages autograd saved for its backward pass that are still alive
    after the forward (the module's parameters apart)."""
    parameters = {parameter.untyped_storage().data_ptr() for parameter in module.parameters()}
    saved = {}  # address -> (weak reference to the storage, its bytes)

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = (weakref.ref(storage), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        y = module(x)
    gc.collect()
    alive = sum(size for pointer, (reference, size) in saved.items() if pointer not in parameters and reference())
    return y, alive


def test_norm_identity_saves_no_more_than_the_plain_norm():
    """The RMSNorm rule keeps what a plain pass keeps (the input), not also the output (its backward computes the
    output again), and the relevance is the hand-computed rule R_x = R_y."""
    norm = LlamaRMSNorm(64, eps=1e-6).requires_grad_(False)  # frozen, as the engine runs models
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(32, 64, requires_grad=True)
    relevance = torch.randn(32, 64)
    _, plain = alive_saved_bytes(norm, x)
    handles = NormIdentity().register(norm)
    try:
        y, explained = alive_saved_bytes(norm, x)
        (gradient,) = torch.autograd.grad(y, x, relevance / y)
    finally:
        handles.remove()
    assert explained <= plain, (explained, plain)  # saving the output as well: plain + 32 * 64 * 4 bytes
    assert_close(x * gradient, relevance, 1e-5)


def test_norm_identity_with_a_keyword_keeps_its_output():
    """A normalisation called with a keyword argument is not computed again (the keyword would be missing): the rule
    saves its output, and the relevance is the rule's (R_x = R_y), not that of the norm without the keyword."""
    norm = ScaledRMSNorm(6, eps=1e-6).double()
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    relevance = torch.randn(3, 6, dtype=torch.float64)
    handles = NormIdentity().register(norm)
    try:
        y = norm(x, scale=3.0)
        (gradient,) = torch.autograd.grad(y, x, relevance / y)
    finally:
        handles.remove()
    assert_close(x * gradient, relevance)


class ChangedInPlace(torch.nn.Module):
    """``inner``'s output tripled by the host model in place (``output *= 3``, as T5 adds its position bias to
    ``scores += bias``), or out of place."""

    def __init__(self, inner: torch.nn.Module, in_place: bool):
        super().__init__()
        self.inner, self.in_place = inner, in_place

    def forward(self, x):
        output = self.inner(x)
        if self.in_place:
            output *= 3.0
            return output
        return output * 3.0


def run_changed(inner: torch.nn.Module, rule, in_place: bool, x: torch.Tensor, relevance: torch.Tensor):
    """Relevance at ``x`` of :py:class:`ChangedInPlace` with ``rule`` on ``inner``, from ``relevance`` at the output."""
    handles = rule.register(inner)
    try:
        leaf = x.clone().requires_grad_(True)
        output = ChangedInPlace(inner, in_place)(leaf)
        output.backward(relevance / output.detach())
    finally:
        handles.remove()
    return leaf.grad * x


def test_epsilon_holds_where_the_model_changes_the_output_in_place():
    """Eq. 8 needs the layer's output ``z``: computed before the model changes ``z`` in place (Falcon adds its attention
    output to the MLP's in place), the relevance is Eq. 8's, in place and out of place (float64, 1e-10). Before, the
    rule's hook sat on a view and was dropped: the plain gradient came out."""
    linear = torch.nn.Linear(5, 4).double()
    x, relevance = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    z = x @ linear.weight.T + linear.bias
    for in_place in (True, False):
        assert_close(
            run_changed(linear, Epsilon(0.5), in_place, x, relevance),
            torch.einsum('ji,bi,bj->bi', linear.weight, x, relevance / stabilize(z, 0.5)),
        )


def test_relevance_boundary_linear_root():
    """The root boundary turns relevance at the output into relevance at the input (here Eq. 8, eps 0)."""
    linear = torch.nn.Linear(4, 3, bias=False).double()
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    relevance = torch.randn(2, 3, dtype=torch.float64)
    handles = RelevanceBoundary().register(linear)
    try:
        (actual,) = torch.autograd.grad(linear(x), x, grad_outputs=relevance)
    finally:
        handles.remove()
    expected = epsilon_rule(x.detach(), linear.weight, x.detach() @ linear.weight.T, relevance)
    assert_close(actual, expected)
    assert_close(actual.sum(1), relevance.sum(1))


def test_rules_in_a_plain_zennit_layer_map_composite():
    """The rules are zennit hooks: zennit's own LayerMapComposite copies (keeping parameters) and removes them."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.GELU(), torch.nn.Linear(6, 2)).double()
    composite = LayerMapComposite([(torch.nn.GELU, Identity()), (torch.nn.Linear, Epsilon(0.25))])
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    with composite.context(model) as modified:
        output = modified(x)
        relevance = torch.zeros_like(output)
        relevance[:, 0] = output[:, 0].detach()
        (grad,) = torch.autograd.grad(output, x, grad_outputs=relevance / output)
    hooked = x.detach() * grad

    first, _, last = model
    hidden = first(x.detach())
    activated = torch.nn.functional.gelu(hidden)
    z_last = last(activated)
    r_activated = epsilon_rule(activated, last.weight, stabilize(z_last, 0.25), relevance)
    r_hidden = identity_rule(r_activated)
    expected = epsilon_rule(x.detach(), first.weight, stabilize(hidden, 0.25), r_hidden)
    assert_close(hooked, expected)
    assert all(not module._forward_hooks and not module._forward_pre_hooks for module in model.modules())


def test_copy_keeps_parameters():
    """zennit composites call copy() for every module: parameters must survive (zennit's Hook.copy drops them)."""
    assert Epsilon(0.3).copy().epsilon == 0.3


def test_rule_errors_name_the_module():
    with pytest.raises(TypeError, match='Linear'):
        lrp(
            torch.nn.Linear(3, 3).double(),
            NormIdentity(),
            [torch.randn(2, 3, dtype=torch.float64)],
            torch.randn(2, 3, dtype=torch.float64),
        )


class UnweightedRMSNorm(torch.nn.Module):
    """HY-V4's ``UnweightedRMSNorm``: named like an RMSNorm, it returns the normaliser ``g(x)`` itself (one value per
    row), and its caller multiplies by it."""

    def forward(self, x):
        return torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)


class MeanRMSNorm(torch.nn.Module):
    """Named like an RMSNorm, it returns one value per row that is not a normaliser (the mean)."""

    def forward(self, x):
        return x.mean(-1, keepdim=True)


class NormalisedAfter(torch.nn.Module):
    """``linear(x) g(x)``: HY-V4's hyper-connection logits, the normaliser applied after the linear map."""

    def __init__(self, norm: torch.nn.Module):
        super().__init__()
        self.linear = torch.nn.Linear(6, 3, bias=False)
        self.norm = norm

    def forward(self, x):
        return self.linear(x) * self.norm(x)


class NormalisedBefore(torch.nn.Module):
    """``linear(x / rms(x))``: the same function with an RMSNorm of its own (DeepSeek-V4's spelling)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.norm = torch.nn.RMSNorm(6, eps=1e-6, elementwise_affine=False)
        self.linear = linear

    def forward(self, x):
        return self.linear(self.norm(x))


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
def test_a_norm_that_returns_its_normaliser_holds_it_constant(composite):
    """Prop. 3.4: ``linear(x) g(x)`` with ``g`` from a module named like an RMSNorm gets the relevance of
    ``linear(x / rms(x))`` (1e-12) and conserves the relevance 1 of each output; before, the RMSNorm's identity rule
    divided the one value per row by every input (-796 times the logit of a tiny HY-V4)."""
    torch.manual_seed(0)
    model = NormalisedAfter(UnweightedRMSNorm()).double()
    reference = NormalisedBefore(model.linear).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    found = attributed(model, composite(), x)
    assert_close(found, attributed(reference, composite(), x), 1e-12)
    assert_close(found.sum(), torch.tensor(12.0, dtype=torch.float64), 1e-12)


def test_a_norm_that_returns_another_value_per_row_is_refused():
    """One value per row that is not divided by ``k`` where the row is multiplied by ``k`` is no normaliser: refused by
    name, not explained by the identity rule of a normalisation."""
    model = NormalisedAfter(MeanRMSNorm()).double()
    with pytest.raises(UnsupportedModelError, match='MeanRMSNorm is named like a normalisation but returns one value'):
        attributed(model, AttnLRPEpsilon(), torch.randn(4, 6, dtype=torch.float64))


class Weighted(torch.nn.Module):
    """A module with a weight per feature whose forward is ``function(self, x)``; :py:func:`named` names its class."""

    function = None

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([0.5, 1.5, 1.0, 2.0, 0.7, 1.2], dtype=torch.float64))

    def forward(self, x):
        return type(self).function(self, x)


def named(name: str, function) -> type:
    """A subclass of :py:class:`Weighted` named ``name`` that computes ``function``."""
    return type(name, (Weighted,), {'function': function})


def rms(x, dim=-1):
    return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + 1e-6)


class Projected(torch.nn.Module):
    """``linear(module(linear(x)))``: a module between two bias-free linear maps."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 6, bias=False), torch.nn.Linear(6, 3, bias=False)
        self.module = module

    def forward(self, x):
        return self.b(self.module(self.a(x)))


def relevance_of(module_class: type, composite) -> torch.Tensor:
    torch.manual_seed(0)
    model = Projected(module_class()).double()
    return attributed(
        model, composite, torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    )


#: modules named like an RMSNorm, with what their forward computes (each also computed by a module named otherwise,
#: whose operations get their rules): a LayerNorm (it centres), an RMSNorm of groups of features (Qwen4-Exp's)
NAMED_NORMS = {
    'a centring RMSNorm': lambda m, x: rms(x - x.mean(-1, keepdim=True)) * m.weight,
    'an RMSNorm of groups': lambda m, x: rms(x.view(*x.shape[:-1], 2, 3)).flatten(-2) * m.weight,
}


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
@pytest.mark.parametrize('case', NAMED_NORMS)
def test_a_module_named_like_an_rms_norm_gets_the_rule_of_what_it_computes(case, composite):
    """The relevance of a module named like an RMSNorm equals that of the same forward named otherwise (each operation
    with its rule, 1e-10): the name is confirmed on probes, not trusted. Before, a centring "RMSNorm" got the identity
    rule of an RMSNorm, a relevance 108% of the largest apart from that of the LayerNorm it is."""
    found = relevance_of(named('ProbedRMSNorm', NAMED_NORMS[case]), composite())
    expected = relevance_of(named('Prepared', NAMED_NORMS[case]), composite())
    assert_close(found, expected, 1e-10)


@pytest.mark.parametrize(
    ('function', 'words'),
    [
        (lambda m, x: rms(x) * m.weight * x.roll(1, -1), 'its output changes when a row of its input'),
        (lambda m, x: rms(x) * m.weight + 0.1, 'it adds a constant to its output that is not its bias'),
    ],
    ids=['mixes features', 'adds a constant'],
)
def test_a_module_named_like_an_rms_norm_that_is_none_is_refused(function, words):
    """A module named like an RMSNorm that mixes its features or adds a constant that is not its bias is refused by
    name (before: the identity rule of an RMSNorm, 45% and 9% of the largest relevance off)."""
    with pytest.raises(UnsupportedModelError, match=f'ConfirmedRMSNorm is named like a normalisation but {words}'):
        relevance_of(named('ConfirmedRMSNorm', function), AttnLRPEpsilon())


class MixingRMSNorm(torch.nn.RMSNorm):
    """A subclass of :py:class:`torch.nn.RMSNorm` with a forward of its own that is no RMSNorm."""

    def forward(self, x):
        return super().forward(x) * x.roll(1, -1)


class MixingGELU(torch.nn.GELU):
    """A subclass of :py:class:`torch.nn.GELU` with a forward of its own that is not element-wise."""

    def forward(self, x):
        return super().forward(x) * x.roll(1, -1)


class ScaledGELU(torch.nn.GELU):
    """A subclass of :py:class:`torch.nn.GELU` that is element-wise, with a weight per feature (that of
    :py:class:`Weighted`)."""

    def __init__(self):
        super().__init__()
        self.weight = Weighted().weight

    def forward(self, x):
        return super().forward(x) * self.weight


@pytest.mark.parametrize(
    ('module_class', 'words'),
    [(MixingRMSNorm, 'MixingRMSNorm is named like a normalisation'), (MixingGELU, 'MixingGELU is named like an activ')],
)
def test_a_subclass_of_a_known_module_with_a_forward_of_its_own_is_confirmed(module_class, words):
    """A subclass of ``torch.nn.RMSNorm`` or ``torch.nn.GELU`` whose forward is its own is confirmed like a module named
    like one, not trusted as its base class (before: the identity rule, 5% and 39% of the largest relevance off)."""
    with pytest.raises(UnsupportedModelError, match=words):
        relevance_of(lambda: module_class(6) if module_class is MixingRMSNorm else module_class(), AttnLRPEpsilon())


def test_an_element_wise_subclass_of_an_activation_with_a_weight_per_feature_is_explained():
    """A ``torch.nn.GELU`` subclass that is element-wise with a weight per feature passes the element-wise check (its
    output at the elements not changed stays as it was) and gets the relevance of its operations (1e-10)."""
    found = relevance_of(ScaledGELU, CPLRPEpsilon())
    expected = relevance_of(named('Scaled', lambda m, x: torch.nn.functional.gelu(x) * m.weight), CPLRPEpsilon())
    assert_close(found, expected, 1e-10)


class CalledByKeyword(torch.nn.Module):
    """A Llama RMSNorm and a GELU module called with their input as a keyword argument, or positionally."""

    def __init__(self, keyword: bool):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 6, bias=False), torch.nn.Linear(6, 6, bias=False)
        self.norm, self.act, self.out = LlamaRMSNorm(6), torch.nn.GELU(), torch.nn.Linear(6, 3, bias=False)
        self.keyword = keyword

    def forward(self, x):
        if self.keyword:
            return self.out(self.norm(hidden_states=self.a(x)) * self.act(input=self.b(x)))
        return self.out(self.norm(self.a(x)) * self.act(self.b(x)))


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_a_module_called_by_keyword_gets_its_rule(composite):
    """The rules of modules read the input a module was called with also where it is a keyword argument (1e-12 of the
    positional call's relevance); before, a GELU called as ``act(input=x)`` kept its plain gradient (9% and 31% of the
    largest relevance off under AttnLRP and CP-LRP) and an RMSNorm called so raised an IndexError."""
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    found = []
    for keyword in (False, True):
        torch.manual_seed(0)
        found.append(attributed(CalledByKeyword(keyword).double(), composite(), x))
    assert_close(found[1], found[0], 1e-12)
