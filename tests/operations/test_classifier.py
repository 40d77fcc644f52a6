"""Operations of the classifying mode (:py:mod:`zennit_attn.operations.classifier`) that a model author may
spell in many ways: in place, as aliases, as scatters, as powers, with combined weights. Each case is checked in
float64 on a bias-free module against the same function written otherwise or against the rule written out by hand
(:py:mod:`tests.by_hand`), and CP-LRP must conserve the relevance exactly (the relevance 1 of every output element).
Every case here gave a silently different relevance, or a refusal of an operation that has a rule, before issue 29.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.by_hand import attributed, by_hand, identity, scaled
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.core import UnsupportedModelError
from zennit_attn.rules import ConstantGates, ProductRule

COMPOSITES = [AttnLRPEpsilon, CPLRPEpsilon]


class Projected(torch.nn.Module):
    """``function(self, x)`` with three bias-free projections ``a``, ``b``, ``c`` of the ``[3, 4]`` input."""

    def __init__(self, function):
        super().__init__()
        self.function = function
        self.a, self.b, self.c = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x):
        return self.function(self, x)


def projected(function) -> Projected:
    torch.manual_seed(0)
    return Projected(function).double()


def inputs() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(3, 4, dtype=torch.float64)


def assert_conserved(relevance: torch.Tensor, model: torch.nn.Module, x: torch.Tensor) -> None:
    """CP-LRP: the input relevance sums to the number of non-zero outputs (relevance 1 each; float64, 1e-10)."""
    with torch.no_grad():
        outputs = (model(x.clone()) != 0).sum()
    torch.testing.assert_close(relevance.sum(), outputs.double(), rtol=1e-10, atol=1e-12)


def check(model, expected_forward, composite) -> None:
    """``model``'s relevance equals the plain gradient of ``expected_forward`` (the rules applied by hand) times the
    input (1e-12); CP-LRP conserves."""
    x = inputs()
    found = attributed(model, composite(), x)
    torch.testing.assert_close(found, by_hand(expected_forward, x), rtol=1e-10, atol=1e-12)
    if composite is CPLRPEpsilon:
        assert_conserved(found, model, x)


class Activated(torch.nn.Module):
    """``b(activation(a(x)))`` with an activation module."""

    def __init__(self, activation: torch.nn.Module):
        super().__init__()
        self.activation = activation
        self.a, self.b = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return self.b(self.activation(self.a(x)))


IN_PLACE_MODULES = {
    'silu': torch.nn.SiLU,
    'elu': torch.nn.ELU,
    'hardswish': torch.nn.Hardswish,
    'mish': torch.nn.Mish,
    'relu6': torch.nn.ReLU6,
}


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('name', IN_PLACE_MODULES)
def test_in_place_activation_modules(name, composite):
    """An activation module with ``inplace=True`` gets the identity rule of the values it was called with (it runs out
    of place for the time of the context: its flag is put back afterwards); before, the rule read the overwritten
    input (CP-LRP 13.0 for SiLU instead of 12)."""
    torch.manual_seed(0)
    model = Activated(IN_PLACE_MODULES[name](inplace=True)).double()
    reference = Activated(IN_PLACE_MODULES[name]()).double()
    reference.load_state_dict(model.state_dict())
    x = inputs()
    found = attributed(model, composite(), x)
    torch.testing.assert_close(found, attributed(reference, composite(), x), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        found,
        by_hand(lambda xx: reference.b(identity(reference.a(xx), reference.activation(reference.a(xx)))), x),
        rtol=1e-10,
        atol=1e-12,
    )
    if composite is CPLRPEpsilon:
        assert_conserved(found, reference, x)
    assert model.activation.inplace is True


class OverwritingActivation(torch.nn.Module):
    """An activation module (by its name) that overwrites its input without an ``inplace`` flag."""

    def forward(self, x):
        return x.tanh_()


def test_activation_that_overwrites_its_input_is_refused():
    model = Activated(OverwritingActivation()).double()
    with pytest.raises(UnsupportedModelError, match='OverwritingActivation changes its input in place'):
        attributed(model, CPLRPEpsilon(), inputs())


IN_PLACE_FUNCTIONS = {
    'F.silu(inplace=True)': (lambda h: F.silu(h, inplace=True), F.silu),
    'tanh_': (lambda h: h.tanh_(), torch.tanh),
    'F.elu(inplace=True)': (lambda h: F.elu(h, inplace=True), F.elu),
    'sigmoid_': (lambda h: h.sigmoid_(), torch.sigmoid),
    'clamp_': (lambda h: h.clamp_(-0.5, 0.5), lambda h: h.clamp(-0.5, 0.5)),
    'F.leaky_relu(h, 0.1, True)': (lambda h: F.leaky_relu(h, 0.1, True), lambda h: F.leaky_relu(h, 0.1)),
    'torch.relu_': (torch.relu_, torch.relu),
    'abs_().sqrt_()': (lambda h: h.abs_().sqrt_(), lambda h: h.abs().sqrt()),
}


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('name', IN_PLACE_FUNCTIONS)
def test_in_place_functions(name, composite):
    """An element-wise function computed in place on a view of a projection (the projection's other half kept):
    the identity rule of the values before (by hand); before, the rule was built from the overwritten values."""
    changed, plain = IN_PLACE_FUNCTIONS[name]

    def forward(module, x):
        h = module.a(x)
        changed(h[:, :2])
        return module.b(h)

    def expected(xx, module):
        h = module.a(xx)
        return module.b(torch.cat([identity(h[:, :2], plain(h[:, :2])), h[:, 2:]], 1))

    model = projected(forward)
    check(model, lambda xx: expected(xx, model), composite)


@pytest.mark.filterwarnings('ignore:index_reduce.. is in beta:UserWarning')
@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('spelling', ['scatter_reduce', 'scatter_reduce_without_self', 'index_reduce'])
def test_scatters_that_multiply_are_products(spelling, composite):
    """``ones.scatter_reduce(1, [[0, 0, 1, 1]], h, 'prod')`` is ``[h0 h1, h2 h3]``: the uniform rule (Prop. 3.2),
    1/2 to each factor, as the product written with ``*``; before, each factor kept the whole (twice the relevance)."""

    def forward(module, x):
        h = module.a(x)
        if spelling == 'index_reduce':
            return torch.ones(3, 2, dtype=h.dtype).index_reduce(1, torch.tensor([0, 0, 1, 1]), h, 'prod')
        index = torch.tensor([[0, 0, 1, 1]] * 3)
        if spelling == 'scatter_reduce':
            return torch.ones(3, 2, dtype=h.dtype).scatter_reduce(1, index, h, 'prod')
        return torch.zeros(3, 2, dtype=h.dtype).scatter_reduce(1, index, h, 'prod', include_self=False)

    model = projected(forward)

    def expected(xx):
        h = scaled(model.a(xx), 0.5)
        return torch.stack([h[:, 0] * h[:, 1], h[:, 2] * h[:, 3]], 1)

    check(model, expected, composite)


@pytest.mark.parametrize('composite', COMPOSITES)
def test_scatter_into_a_factor_shares_with_it(composite):
    """``b(x)[:, :2].scatter_reduce(1, index, a(x), 'prod')``: three relevance-carrying factors per output (the
    input's entry and two scattered ones), 1/3 each."""

    def forward(module, x):
        return module.b(x)[:, :2].scatter_reduce(1, torch.tensor([[0, 0, 1, 1]] * 3), module.a(x), 'prod')

    model = projected(forward)

    def expected(xx):
        h, g = scaled(model.a(xx), 1 / 3), scaled(model.b(xx), 1 / 3)
        return torch.stack([g[:, 0] * h[:, 0] * h[:, 1], g[:, 1] * h[:, 2] * h[:, 3]], 1)

    check(model, expected, composite)


VALUES = {
    'sqrt(softplus(h))': lambda h: torch.sqrt(F.softplus(h)),
    'softplus(h) ** 0.5': lambda h: F.softplus(h) ** 0.5,
    'relu(h) ** tensor(1.5)': lambda h: torch.relu(h) ** torch.tensor(1.5, dtype=h.dtype),
    '1 / softplus(h)': lambda h: 1 / F.softplus(h),
    'rsqrt(softplus(h))': lambda h: torch.rsqrt(F.softplus(h)),
}


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('name', VALUES)
def test_roots_and_powers_of_values_get_the_identity_rule(name, composite):
    """A square root, power or reciprocal that computes a value (not a normaliser ``g(x)`` that divides or
    multiplies ``x``) is an element-wise non-linearity: the identity rule from the first input of the chain of
    element-wise functions (Eq. 9); before, it was taken as a constant normaliser and the relevance vanished."""
    function = VALUES[name]
    model = projected(lambda module, x: module.b(function(module.a(x))))
    check(model, lambda xx: model.b(identity(model.a(xx), function(model.a(xx)))), composite)


@pytest.mark.parametrize('composite', COMPOSITES)
def test_a_variance_added_as_a_value_is_decomposed(composite):
    """``h + h.var(-1)``: the variance is a value, ``mean((h - mean h)^2)`` with the identity rule on the square;
    before, it was a constant (CP-LRP -7.2 of 12)."""
    model = projected(lambda module, x: module.b(module.a(x) + module.a(x).var(-1, keepdim=True)))

    def expected(xx):
        h = model.a(xx)
        centered = h - h.mean(-1, keepdim=True)
        return model.b(h + identity(centered, centered.square()).sum(-1, keepdim=True) / 3)

    check(model, expected, composite)


NORMALISATIONS = {
    'x * rsqrt(mean(x^2))': lambda h: h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6),
    '(x - mean) * rsqrt(var)': lambda h: (
        (h - h.mean(-1, keepdim=True)) * torch.rsqrt(h.var(-1, keepdim=True, correction=0) + 1e-6)
    ),
    '(x - mean) / sqrt(var)': lambda h: (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, keepdim=True) + 1e-6),
    'x * (1 / norm(x))': lambda h: h * (1 / h.norm(dim=-1, keepdim=True)),
    'x * norm(x) ** -1': lambda h: h * h.norm(dim=-1, keepdim=True) ** -1,
    'x * vector_norm(x.float()).reciprocal()': lambda h: (
        h * torch.linalg.vector_norm(h.float(), dim=-1, keepdim=True).reciprocal()
    ),
}


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('name', NORMALISATIONS)
def test_normalisers_of_the_normalised_tensor_are_constants(name, composite):
    """Where ``g(x)`` divides or multiplies the tensor it is computed from (also centred or cast), it is a constant
    (Prop. 3.4): the rule by hand with ``g`` detached."""
    function = NORMALISATIONS[name]
    model = projected(lambda module, x: module.b(function(module.a(x))))

    def expected(xx):
        h = model.a(xx)
        centered = h - h.mean(-1, keepdim=True) if name.startswith('(x - mean)') else h
        return model.b(centered * (function(h.detach()) / centered.detach()))

    check(model, expected, composite)


#: activations divided by activations: element-wise functions (or normalisations) of values, not a renormalised softmax
ACTIVATION_QUOTIENTS = {
    'x**2 / (|x| + 1)': lambda h: h**2 / (h.abs() + 1),
    'sigmoid(x) / sigmoid(x).sum()': lambda h: torch.sigmoid(h) / torch.sigmoid(h).sum(-1, keepdim=True),
}


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('name', ACTIVATION_QUOTIENTS)
def test_activations_divided_by_activations_are_normalised(name, composite):
    """A quotient of activations (sigmoid routing scores renormalised by their sum) times a gate: the divisor is a
    constant (Prop. 3.4), the numerator's activations pass their relevance by the identity rule; the two gates share
    the product uniformly (also CP-LRP: every factor is a gate). Before, the quotient was taken for a renormalised
    softmax and passed its plain gradient: CP-LRP kept 78% of the logit with ``x**2 / (|x| + 1)``."""
    function = ACTIVATION_QUOTIENTS[name]
    model = projected(lambda module, x: module.c(function(module.a(x)) * torch.sigmoid(module.b(x))))

    def expected(xx):
        h = model.a(xx)
        if name.startswith('x**2'):  # the identity rule on the whole element-wise function
            quotient = identity(h, function(h))
        else:  # the identity rule on the sigmoid, its sum a constant
            quotient = identity(h, torch.sigmoid(h)) / torch.sigmoid(h).sum(-1, keepdim=True).detach()
        gate = identity(model.b(xx), torch.sigmoid(model.b(xx)))
        return model.c(scaled(quotient, 0.5) * scaled(gate, 0.5))

    check(model, expected, composite)


@pytest.mark.parametrize('composite', COMPOSITES)
def test_a_softmax_divisor_of_another_tensor_is_a_constant(composite):
    """``a(x) / (softmax(b(x))[..., :1] + 1)``: the divisor is a softmax gate, the numerator is not: a normaliser of
    the numerator, constant (Prop. 3.4). Only softmax gates divided by softmax gates (a renormalised softmax, Prop.
    3.1) keep their plain gradient."""
    model = projected(lambda module, x: module.c(module.a(x) / (torch.softmax(module.b(x), -1)[..., :1] + 1)))

    def expected(xx):
        divisor = torch.softmax(model.b(xx), -1)[..., :1] + 1
        return model.c(model.a(xx) / divisor.detach())

    check(model, expected, composite)


def _renormalised_in_place(m, x):
    weight = torch.softmax(m.b(x), -1).topk(1, dim=-1).values
    weight /= weight.sum(-1, keepdim=True)  # Mixtral's, Qwen-MoE's and OLMoE's spelling
    return weight


def _stabilised_in_place(m, x):
    weight = torch.sigmoid(m.b(x)).gather(-1, (m.b(x) + 0.1).topk(1, dim=-1).indices)
    weight /= weight.sum(-1, keepdim=True) + 1e-20  # DeepSeek-V3's sigmoid scores with a stabiliser
    return weight


#: the routing weight of one selected expert, however renormalised: the constant 1 computed from the router's logits
ONE_ROUTING_WEIGHT = {
    'w /= w.sum() in place': _renormalised_in_place,
    'sigmoid w /= w.sum() + 1e-20 in place': _stabilised_in_place,
    'w / w.clone().sum()': lambda m, x: (lambda w: w / w.clone().sum(-1, keepdim=True))(
        torch.softmax(m.b(x), -1)[..., 1:2]
    ),
    'w / w.sum(-1).unsqueeze(-1), scaled': lambda m, x: (
        2.5 * (lambda w: w / w.sum(-1).unsqueeze(-1))(torch.softmax(m.b(x), -1).topk(1, -1).values)
    ),
    'w / clamp(w.sum(), min=1e-12)': lambda m, x: (
        lambda w: w / torch.clamp(w.sum(-1, keepdim=True), min=1e-12)  # ERNIE-4.5-MoE's
    )(torch.softmax(m.b(x), -1).topk(1, -1).values),
    'softmax(top-1 logits)': lambda m, x: torch.softmax(m.b(x).topk(1, -1).values, -1),
    'scattered into a dense [tokens, experts] matrix': lambda m, x: torch.zeros_like(x).scatter(
        -1, m.b(x).argmax(-1, keepdim=True), torch.softmax(m.b(x)[..., :1], -1)
    ),
}


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('name', ONE_ROUTING_WEIGHT)
def test_one_renormalised_routing_weight_is_a_constant(name, composite):
    """Top-1 routing weights renormalised over the one selected expert (``w / w.sum()``, a softmax over one logit) are
    the constant 1 (times constants, scattered into zeros): the product with an expert's output is linear in it, the
    output gets all relevance, as in the dense model with that expert alone. Before, AttnLRP's uniform rule gave the
    constant half of the relevance, which its zero gradient lost (the model passed 50% of its relevance), or which
    went to the router through the sigmoid (DeepSeek-V3's stabilised renormalisation)."""
    weight = ONE_ROUTING_WEIGHT[name]
    model = projected(lambda module, x: module.c(weight(module, x) * module.a(x)))

    def expected(xx):
        return model.c(weight(model, xx).detach() * model.a(xx))

    check(model, expected, composite)
    if composite is AttnLRPEpsilon:  # every weight is 1 or 0, the outputs' relevance 1: AttnLRP conserves too
        assert_conserved(attributed(model, composite(), inputs()), model, inputs())


@pytest.mark.parametrize('composite', COMPOSITES)
def test_a_root_of_another_tensor_is_a_factor(composite):
    """``sqrt(softplus(a(x))) * b(x)``: the root is not computed from ``b(x)``, so it does not normalise it: a product
    of two factors (AttnLRP: 1/2 each; CP-LRP: the root of an activation is a gate, constant)."""
    model = projected(lambda module, x: module.c(torch.sqrt(F.softplus(module.a(x))) * module.b(x)))
    share = 0.0 if composite is CPLRPEpsilon else 0.5

    def expected(xx):
        root = identity(model.a(xx), torch.sqrt(F.softplus(model.a(xx))))
        return model.c(scaled(root, share) * scaled(model.b(xx), 1 - share))

    check(model, expected, composite)


GATE_PRODUCTS = {
    # name: (forward, by hand with CP-LRP's constants)
    'softmax(a b^T) @ silu(c)': (
        lambda m, x: torch.softmax(m.a(x) @ m.b(x).T, -1) @ F.silu(m.c(x)),
        lambda m, x: torch.softmax(m.a(x) @ m.b(x).T, -1).detach() @ identity(m.c(x), F.silu(m.c(x))),
    ),
    'gelu(a) * silu(b)': (
        lambda m, x: m.c(F.gelu(m.a(x)) * F.silu(m.b(x))),
        lambda m, x: m.c(scaled(identity(m.a(x), F.gelu(m.a(x))), 0.5) * scaled(identity(m.b(x), F.silu(m.b(x))), 0.5)),
    ),
    'relu(a) * relu(a)': (
        lambda m, x: m.c((lambda h: h * h)(torch.relu(m.a(x)))),
        lambda m, x: m.c(identity(m.a(x), torch.relu(m.a(x)).square())),
    ),
}


@pytest.mark.parametrize('name', GATE_PRODUCTS)
def test_products_of_gates(name):
    """CP-LRP where every factor is a gate: the softmax output is the constant and an activated value gets the
    relevance; two activations of one kind share it uniformly (Prop. 3.2; ``h * h`` of one ReLU is its square);
    before, every factor was a constant and the product passed nothing."""
    forward, expected = GATE_PRODUCTS[name]
    model = projected(forward)
    check(model, lambda xx: expected(model, xx), CPLRPEpsilon)


def attention(module, x, first, second):
    return torch.softmax(first(x) @ second(x).T, -1)


COMBINED = {
    # name: (attention weights combined, then @ V; the same as a combination of attention outputs)
    'differential (p1 - 0.3 p2) @ v': (
        lambda m, x: (attention(m, x, m.a, m.b) - 0.3 * attention(m, x, m.b, m.a)) @ m.c(x),
        lambda m, x: attention(m, x, m.a, m.b) @ m.c(x) - 0.3 * (attention(m, x, m.b, m.a) @ m.c(x)),
    ),
    'mixture 0.5 (p1 + p2) @ v': (
        lambda m, x: 0.5 * (attention(m, x, m.a, m.b) + attention(m, x, m.b, m.a)) @ m.c(x),
        lambda m, x: 0.5 * (attention(m, x, m.a, m.b) @ m.c(x)) + 0.5 * (attention(m, x, m.b, m.a) @ m.c(x)),
    ),
}


@pytest.mark.parametrize('name', COMBINED)
def test_combined_attention_weights_are_gates(name):
    """Attention weights combined before the product with V are attention weights: CP-LRP equals the combination of
    the attention outputs (float64, 1e-12) and conserves; before, the relevance leaked through the softmaxes."""
    combined, separate = COMBINED[name]
    model, reference = projected(combined), projected(separate)
    x = inputs()
    found = attributed(model, CPLRPEpsilon(), x)
    torch.testing.assert_close(found, attributed(reference, CPLRPEpsilon(), x), rtol=1e-10, atol=1e-12)
    assert_conserved(found, model, x)


def routed(spelling: str):
    """Top-2 routing weights of a softmax placed in a dense ``[3, 4]`` matrix, times an expert ``b(x)``."""

    def forward(module, x):
        weights, index = torch.softmax(module.a(x), -1).topk(2, -1)
        if spelling == 'scatter':
            dense = torch.zeros(3, 4, dtype=x.dtype).scatter(1, index, weights)
        elif spelling == 'index_put':
            dense = torch.zeros(3, 4, dtype=x.dtype)
            dense[torch.arange(3)[:, None], index] = weights
        else:
            dense = (
                torch.zeros(12, dtype=x.dtype)
                .index_add(0, (index + 4 * torch.arange(3)[:, None]).flatten(), weights.flatten())
                .view(3, 4)
            )
        return dense * module.b(x)

    return forward


@pytest.mark.parametrize('spelling', ['scatter', 'index_put'])
def test_scattered_routing_weights_are_gates(spelling):
    """Routing weights scattered or index-put into a dense matrix are gates, as with ``index_add``: CP-LRP equal to
    that spelling (1e-12) and conservative; before, the scattered weights passed relevance to the router."""
    model, reference = projected(routed(spelling)), projected(routed('index_add'))
    x = inputs()
    found = attributed(model, CPLRPEpsilon(), x)
    torch.testing.assert_close(found, attributed(reference, CPLRPEpsilon(), x), rtol=0, atol=1e-12)
    assert_conserved(found, model, x)


CHAINS = {
    'sigmoid(relu(h))': lambda h: torch.sigmoid(torch.relu(h)),
    'softplus(relu(h))': lambda h: F.softplus(torch.relu(h)),
    'exp-free chain tanh(sigmoid(relu(h)))': lambda h: torch.tanh(torch.sigmoid(torch.relu(h))),
}


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('name', CHAINS)
def test_chains_of_elementwise_functions(name, composite):
    """The identity rule of a chain of element-wise functions keeps ``f(0)`` where an inner function gives 0
    (ReLU): the identity rule of the composed function (Eq. 9); before, ``f(x) / x`` was set to 0 at ``x == 0`` and
    ``f(0) g`` was lost."""
    function = CHAINS[name]
    model = projected(lambda module, x: module.b(function(module.a(x))))
    check(model, lambda xx: model.b(identity(model.a(xx), function(model.a(xx)))), composite)


ALIASES = {
    'torch.special.expit': (torch.special.expit, torch.sigmoid),
    'F.softsign': (F.softsign, lambda h: h / (1 + h.abs())),
    'F.glu': (lambda h: F.glu(torch.cat([h, h.flip(-1)], -1)), lambda h: h * torch.sigmoid(h.flip(-1))),
    'F.softmin': (lambda h: F.softmin(h, -1), lambda h: torch.softmax(-h, -1)),
    'torch.absolute': (torch.absolute, torch.abs),
}


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('name', ALIASES)
def test_aliases_and_combinations_have_the_rules_of_their_parts(name, composite):
    """An alias or a combination of operations with rules is explained as those operations (equal relevance, 1e-12);
    before, each was refused."""
    alias, spelled = ALIASES[name]
    model = projected(lambda module, x: module.b(alias(module.a(x))))
    reference = projected(lambda module, x: module.b(spelled(module.a(x))))
    x = inputs()
    found = attributed(model, composite(), x)
    torch.testing.assert_close(found, attributed(reference, composite(), x), rtol=0, atol=1e-12)


@pytest.mark.parametrize('composite', COMPOSITES)
def test_nan_to_num_of_a_masked_softmax(composite):
    """``nan_to_num`` of a softmax whose last row is fully masked (NaN) is the softmax with that row 0; before, it
    was refused."""
    mask = torch.tensor([0.0, 0.0, float('-inf')])[:, None]

    def forward(module, x, spelled=False):
        probs = torch.softmax(module.a(x) @ module.b(x).T + mask, -1)
        probs = probs.masked_fill(probs.isnan(), 0.0) if spelled else torch.nan_to_num(probs)
        return probs @ module.c(x)

    model = projected(forward)
    reference = projected(lambda module, x: forward(module, x, spelled=True))
    x = inputs()
    found = attributed(model, composite(), x)
    torch.testing.assert_close(found, attributed(reference, composite(), x), rtol=0, atol=1e-12)
    assert torch.isfinite(found).all()


def linear_attention(spelling: str):
    """Causal linear attention with ``elu + 1`` features, written three ways."""

    def forward(module, x):
        q, k, v = F.elu(module.a(x)) + 1, F.elu(module.b(x)) + 1, module.c(x)
        if spelling == 'einsum and cumsum':
            state = torch.einsum('nd,ne->nde', k, v).cumsum(0)
            normaliser = 1 / (torch.einsum('nd,nd->n', q, k.cumsum(0)) + 1e-6)
            return torch.einsum('nd,nde,n->ne', q, state, normaliser)
        if spelling == 'masked matrix products':
            return (q @ k.T).tril() @ v
        state = (k[:, :, None] * v[:, None, :]).cumsum(0)
        return (q[:, :, None] * state).sum(1)

    return forward


class LinearAttention(torch.nn.Module):
    """A recurrent linear-attention layer named as such: ``s_t = s_{t-1} + k_t v_t^T``, ``o_t = q_t s_t``."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x):
        q, k, v = torch.relu(self.a(x)), torch.relu(self.b(x)), self.c(x)
        state, outputs = torch.zeros(4, 4, dtype=x.dtype), []
        for step in range(x.shape[0]):
            state = state + torch.outer(k[step], v[step])
            outputs.append(q[step] @ state)
        return torch.stack(outputs)


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize(
    'spelling', ['einsum and cumsum', 'masked matrix products', 'outer products', 'LinearAttention']
)
def test_linear_attention_is_refused(spelling, composite):
    """Linear attention (no softmax between ``q k^T`` and ``V``) is not softmax attention: refused by name until its
    rules are defined; before, it was explained with product rules without a word."""
    model = LinearAttention().double() if spelling == 'LinearAttention' else projected(linear_attention(spelling))
    match = 'inside LinearAttention' if spelling == 'LinearAttention' else 'linear attention, not softmax attention'
    with pytest.raises(UnsupportedModelError, match=match):
        attributed(model, composite(), inputs())


CONSTANT = torch.tensor([0.5, -1.5, 2.0, 3.0], dtype=torch.float64)
CONSTANT_PRODUCTS = {
    'c * h': lambda m, x: CONSTANT * m.a(x),
    'h * c': lambda m, x: m.a(x) * CONSTANT,
    'torch.mul(input=c, other=h)': lambda m, x: torch.mul(input=CONSTANT, other=m.a(x)),
    'C @ h (constant first operand)': lambda m, x: CONSTANT.diag() @ m.a(x).T,
    'einsum(C, h)': lambda m, x: torch.einsum('ij,nj->ni', CONSTANT.diag(), m.a(x)),
}


@pytest.mark.parametrize('composite', COMPOSITES)
@pytest.mark.parametrize('name', CONSTANT_PRODUCTS)
def test_a_product_with_a_constant_factor_is_linear(name, composite):
    """A product with one relevance-carrying factor (a constant or a tensor that is not explained as the other, in
    any position, positional or keyword) is linear in it: the plain gradient, the whole relevance to it (the product
    rule shares among relevance-carrying factors only; zennit 0.5.1's product hooks skipped the rule where the first
    operand was a constant, 1.0 applies it: the engine depends on neither)."""
    forward = CONSTANT_PRODUCTS[name]
    model = projected(forward)
    check(model, lambda xx: forward(model, xx), composite)


class Shares(ProductRule):
    """A product rule of a user: 0.7 to the first of two factors, 0.3 to the second; 1/N otherwise."""

    def shares(self, kinds):
        return (0.7, 0.3) if len(kinds) == 2 else (1 / len(kinds),) * len(kinds)


class SharesComposite(AttnLRPEpsilon):
    product_rule = Shares()


def test_a_product_rule_of_a_user_applies_to_every_product():
    """A composite with another product rule changes every product, element-wise and matrix products alike and the
    two products inside scaled_dot_product_attention: the rule by hand (query 0.7 * 0.7, key 0.3 * 0.7, value 0.3)."""

    def forward(module, x):
        attention = F.scaled_dot_product_attention(module.a(x)[None], module.b(x)[None], module.c(x)[None])[0]
        return attention * torch.tanh(module.b(x))

    model = projected(forward)

    def expected(xx):
        q, k, v = scaled(model.a(xx), 0.7 * 0.7), scaled(model.b(xx), 0.3 * 0.7), scaled(model.c(xx), 0.3)
        attention = torch.softmax(q @ k.T / 2.0, -1) @ v
        return scaled(attention, 0.7) * scaled(identity(model.b(xx), torch.tanh(model.b(xx))), 0.3)

    check(model, expected, SharesComposite)
    assert SharesComposite(product_rule=ConstantGates()).product_rule == CPLRPEpsilon().product_rule


@pytest.mark.parametrize('composite', COMPOSITES)
def test_scaled_dot_product_attention_equals_its_arithmetic(composite):
    """``F.scaled_dot_product_attention`` (the rule on its two products) gives the relevance of the same attention
    written out (``softmax(q k^T / sqrt(d)) @ v``, classified operation by operation), with and without an additive
    mask; CP-LRP conserves."""
    mask = torch.tensor([[0.0, -1e9, 0.0], [0.0, 0.0, -1e9], [0.0, 0.0, 0.0]], dtype=torch.float64)

    def fused(module, x, masked):
        q, k, v = (projection(x)[None] for projection in (module.a, module.b, module.c))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask if masked else None)[0]

    def written(module, x, masked):
        scores = module.a(x) @ module.b(x).T / 2.0 + (mask if masked else 0.0)
        return torch.softmax(scores, -1) @ module.c(x)

    for masked in (False, True):
        model = projected(lambda module, x, masked=masked: fused(module, x, masked))
        reference = projected(lambda module, x, masked=masked: written(module, x, masked))
        x = inputs()
        found = attributed(model, composite(), x)
        torch.testing.assert_close(found, attributed(reference, composite(), x), rtol=1e-10, atol=1e-12)
        if composite is CPLRPEpsilon:
            assert_conserved(found, model, x)


class ScaledInPlace(torch.nn.Module):
    """Attention whose query is scaled in place after its projection (``q *= d ** -0.5``), or out of place."""

    def __init__(self, in_place: bool):
        super().__init__()
        self.in_place = in_place
        self.a, self.b, self.c = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x):
        q = self.a(x)
        if self.in_place:
            q *= 0.5
        else:
            q = q * 0.5
        return torch.softmax(q @ self.b(x).T, -1) @ self.c(x)


@pytest.mark.parametrize('composite', COMPOSITES)
def test_operands_changed_in_place_keep_their_share(composite):
    """An operand scaled in place before its product (``q *= scale``) gets the share it gets out of place."""
    torch.manual_seed(0)
    model = ScaledInPlace(True).double()
    reference = ScaledInPlace(False).double()
    reference.load_state_dict(model.state_dict())
    x = inputs()
    torch.testing.assert_close(
        attributed(model, composite(), x), attributed(reference, composite(), x), rtol=1e-10, atol=1e-12
    )


def _gated(module, x):
    """A gated product and a softmax-weighted value, a function the forward calls (compiled or not)."""
    h = module.a(x)
    return F.gelu(module.b(x)) * h + torch.softmax(h, -1) * module.c(x)


#: ``_gated`` compiled by ``torch.compile`` (dynamo alone: no compiler needed to run the test).
_COMPILED = torch.compile(_gated, backend='eager')


@pytest.mark.parametrize('composite', COMPOSITES)
def test_compiled_functions_in_the_forward_run_as_their_code(composite):
    """A function compiled by ``torch.compile`` that the forward calls (a helper of the model, a forward hook) runs as
    its Python code for the time of the forward, where the mode classifies its operations: the relevance of the same
    function uncompiled, and CP-LRP conserves. Before, dynamo traced the mode's own code into the compiled graph,
    whose operations then ran unclassified: CP-LRP's relevance of a tiny Llama with such a hook summed to 0.76 of the
    logit, 2.6e-2 apart from the uncompiled hook's, without a refusal."""
    torch._dynamo.reset()
    model = projected(lambda module, x: _COMPILED(module, x))
    reference = projected(_gated)
    x = inputs()
    for _ in range(2):  # compiled at the first call (under the mode) and run from the cache at the second
        found = attributed(model, composite(), x)
        torch.testing.assert_close(found, attributed(reference, composite(), x), rtol=1e-10, atol=1e-12)
    if composite is CPLRPEpsilon:
        assert_conserved(found, model, x)
    with torch.no_grad():  # and it is compiled again outside the forward
        torch.testing.assert_close(model(x), reference(x), rtol=1e-12, atol=1e-12)
