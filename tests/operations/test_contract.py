"""The contract of the operation registry (:py:mod:`zennit_attn.operations.registry`), checked on tiny modules
against the rules written out by hand (float64):

- an operation the registry does not declare is refused by name, never passed with its plain gradient;
- the share tables of the product rules of relevance patching (``ConstantAttention``: RelP, ``HalfGates``: the MLP
  rules) hold through the engine, as ``Uniform`` (AttnLRP) and ``ConstantGates`` (CP-LRP) do;
- a composite's override of one operation's rule (a rule object or a function) changes that operation and nothing
  else, and an override the registry cannot place is refused;
- the dry run of the rules (``rule_table``) says which rule each operation gets, runs no backward pass, and goes on
  past a refusal, which it lists.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.by_hand import attributed, by_hand, identity, scaled
from zennit_attn.canonizers.operations import UNDECLARED
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon, MLPRules, RelPEpsilon
from zennit_attn.core import UnsupportedModelError
from zennit_attn.operations import OPERATIONS, check_overrides
from zennit_attn.operations.registry import op_name
from zennit_attn.rules import ConstantAttention, ConstantGates, HalfGates, Identity, Uniform, scaled_gradient
from zennit_attn.rules.products import ACTIVATION, SOFTMAX

COMPOSITES = [AttnLRPEpsilon, CPLRPEpsilon, RelPEpsilon, MLPRules]


class Block(torch.nn.Module):
    """A gated MLP and an attention on the ``[3, 4]`` input: ``d(silu(a(x)) * b(x)) + softmax(a(x) b(x)^T) c(x)``."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (torch.nn.Linear(4, 4, bias=False) for _ in range(4))

    def forward(self, x):
        mlp = self.d(F.silu(self.a(x)) * self.b(x))
        return mlp + torch.softmax(self.a(x) @ self.b(x).T, -1) @ self.c(x)


def block() -> Block:
    torch.manual_seed(0)
    return Block().double()


def inputs() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(3, 4, dtype=torch.float64)


def by_rules(model: Block, gate: float, value: float, query: float, key: float, values: float):
    """The block's forward with the rules written out by hand: the shares of the gated product (``gate`` to
    ``silu(a)``, ``value`` to ``b``), of the scores' factors (``query``, ``key``) and of the attention's values."""

    def forward(x):
        activated = identity(model.a(x), F.silu(model.a(x)))
        mlp = model.d(scaled(activated, gate) * scaled(model.b(x), value))
        scores = scaled(model.a(x), query) @ scaled(model.b(x), key).T
        return mlp + torch.softmax(scores, -1) @ scaled(model.c(x), values)

    return forward


# ------------------------------------------------------------------------------------------------ undeclared
UNDECLARED_FUNCTIONS = {
    'special_i0': torch.special.i0,
    'lgamma': torch.lgamma,
    'erfinv': lambda h: torch.erfinv(torch.tanh(h)),
    'heaviside': lambda h: torch.heaviside(h, torch.zeros_like(h)),
}


@pytest.mark.parametrize('composite', COMPOSITES, ids=lambda composite: composite.__name__)
@pytest.mark.parametrize('name', sorted(UNDECLARED_FUNCTIONS))
def test_an_undeclared_operation_is_refused(name, composite):
    """An operation the registry does not know, on relevance-carrying tensors, is refused with its name, the module
    and what to do; it is not explained with its plain gradient."""
    function = UNDECLARED_FUNCTIONS[name]
    assert name not in OPERATIONS

    class Undeclared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4, bias=False)

        def forward(self, x):
            return self.a(function(self.a(x)))

    with pytest.raises(UnsupportedModelError) as error:
        attributed(Undeclared().double(), composite(), inputs())
    message = str(error.value)
    assert message.startswith(f'zennit-attn cannot explain {name} in the model (Undeclared): {UNDECLARED}')
    assert 'declare the operation in the registry (zennit_attn.operations.registry' in message


# ----------------------------------------------------------------------------------------------- share tables
PAIRS = [[SOFTMAX, None], [ACTIVATION, None], [None, None], [SOFTMAX, SOFTMAX], [ACTIVATION, ACTIVATION]]
TABLES = {
    # rule: the shares of each pair of factor kinds of PAIRS, and of [SOFTMAX, ACTIVATION] and three factors
    Uniform: [(0.5, 0.5)] * 5 + [(0.5, 0.5), (1 / 3,) * 3],
    ConstantGates: [(0.0, 1.0), (0.0, 1.0), (0.5, 0.5), (0.5, 0.5), (0.5, 0.5), (0.0, 1.0), (0.0, 0.0, 1.0)],
    ConstantAttention: [(0.0, 1.0), (0.5, 0.5), (0.5, 0.5), (0.5, 0.5), (0.5, 0.5), (0.0, 1.0), (0.0, 0.5, 0.5)],
    HalfGates: [(1.0, 1.0), (0.5, 0.5), (1.0, 1.0), (1.0, 1.0), (0.5, 0.5), (1.0, 1.0), (1.0, 1.0, 1.0)],
}


@pytest.mark.parametrize('rule', TABLES, ids=lambda rule: rule.__name__)
def test_the_share_tables_of_the_product_rules(rule):
    """Each product rule's shares, kind by kind (the last two: a softmax times an activation, and a softmax, an
    activation and a value)."""
    kinds = [*PAIRS, [SOFTMAX, ACTIVATION], [SOFTMAX, ACTIVATION, None]]
    found = [rule().shares(pair) for pair in kinds]
    assert [len(shares) for shares in found] == [len(shares) for shares in TABLES[rule]]
    for shares, expected in zip(found, TABLES[rule]):
        assert shares == pytest.approx(expected)


SHARES = {
    # composite: (gate, value of the gated product; query, key of the scores; the attention's values)
    AttnLRPEpsilon: (0.5, 0.5, 0.25, 0.25, 0.5),
    CPLRPEpsilon: (0.0, 1.0, 0.0, 0.0, 1.0),
    RelPEpsilon: (0.5, 0.5, 0.0, 0.0, 1.0),  # the softmax constant, the gate half
    MLPRules: (0.5, 0.5, 1.0, 1.0, 1.0),  # the half rule on the gate, the plain gradient in attention
}


@pytest.mark.parametrize('composite', SHARES, ids=lambda composite: composite.__name__)
def test_each_composite_shares_products_as_its_rule_says(composite):
    """The relevance of a gated MLP and an attention under each composite equals its shares applied by hand: a
    mutant that makes RelP's attention uniform, or halves MLPRules' attention products, fails here."""
    model, x = block(), inputs()
    expected = by_hand(by_rules(model, *SHARES[composite]), x)
    torch.testing.assert_close(attributed(model, composite(), x), expected, rtol=1e-10, atol=1e-12)


class CombinedGate(torch.nn.Module):
    """An expert ``c(x)`` times the product of a routing weight (a softmax) and an activated gate."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x):
        return (torch.softmax(self.a(x), -1) * torch.sigmoid(self.b(x))) * self.c(x)


#: composite: (the softmax's share, the activation's share of their product; that product's share, the expert's)
COMBINED = {RelPEpsilon: (0.0, 1.0, 0.5, 0.5), MLPRules: (1.0, 1.0, 0.5, 0.5), CPLRPEpsilon: (0.0, 1.0, 0.0, 1.0)}


@pytest.mark.parametrize('composite', COMBINED, ids=lambda composite: composite.__name__)
def test_a_product_of_a_softmax_and_an_activation_is_an_activation_gate(composite):
    """``softmax(a) * sigmoid(b)`` is a gate of the kind activation (not softmax: the product has an activation's
    values), so that RelP and the MLP rules give the expert and the combined gate half each (by hand)."""
    torch.manual_seed(0)
    model, x = CombinedGate().double(), inputs()
    softmax_share, activation_share, gate_share, value_share = COMBINED[composite]

    def forward(xx):
        activated = identity(model.b(xx), torch.sigmoid(model.b(xx)))
        combined = scaled(torch.softmax(model.a(xx), -1), softmax_share) * scaled(activated, activation_share)
        return scaled(combined, gate_share) * scaled(model.c(xx), value_share)

    torch.testing.assert_close(attributed(model, composite(), x), by_hand(forward, x), rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------ overrides
def halves_to_first(func, args, kwargs):
    """A rule of one's own for a product of two factors: 0.8 of its relevance to the first, 0.2 to the second."""
    first, second = args[:2]
    return func(scaled_gradient(first, 0.8), scaled_gradient(second, 0.2), *args[2:], **kwargs)


class Plain:
    """An activation rule: the plain gradient of the element-wise function."""

    @staticmethod
    def elementwise(input, output, gate=True):
        return output


def test_an_override_of_a_product_changes_that_operation_only():
    """``overrides={'mul': ConstantGates()}``: the gated product gets CP-LRP's shares, the attention's matrix
    products keep AttnLRP's (by hand)."""
    model, x = block(), inputs()
    found = attributed(model, AttnLRPEpsilon(overrides={'mul': ConstantGates()}), x)
    torch.testing.assert_close(found, by_hand(by_rules(model, 0.0, 1.0, 0.25, 0.25, 0.5), x), rtol=1e-10, atol=1e-12)


def test_a_function_overrides_an_operation():
    """``overrides={'matmul': function}``: both matrix products share 0.8 to their first factor, 0.2 to the second;
    everything else keeps CP-LRP's rules (by hand)."""
    model, x = block(), inputs()
    found = attributed(model, CPLRPEpsilon(overrides={'matmul': halves_to_first}), x)

    def forward(xx):
        activated = identity(model.a(xx), F.silu(model.a(xx))).detach()
        scores = scaled(model.a(xx), 0.8) @ scaled(model.b(xx), 0.2).T
        return model.d(activated * model.b(xx)) + scaled(torch.softmax(scores, -1), 0.8) @ scaled(model.c(xx), 0.2)

    torch.testing.assert_close(found, by_hand(forward, x), rtol=1e-10, atol=1e-12)


def test_an_override_of_an_activation_changes_that_operation_only():
    """``overrides={'silu': Plain()}``: the SiLU passes its plain gradient, the rest is AttnLRP's (by hand); the
    override's class is accepted too."""
    model, x = block(), inputs()

    def forward(xx):
        mlp = model.d(scaled(F.silu(model.a(xx)), 0.5) * scaled(model.b(xx), 0.5))
        scores = scaled(model.a(xx), 0.5) @ scaled(model.b(xx), 0.5).T
        return mlp + scaled(torch.softmax(scores, -1), 0.5) @ scaled(model.c(xx), 0.5)

    for rule in (Plain(), Plain):
        found = attributed(model, AttnLRPEpsilon(overrides={'silu': rule}), x)
        torch.testing.assert_close(found, by_hand(forward, x), rtol=1e-10, atol=1e-12)
    # an alias names the same operation; Identity() is the composite's own rule: no change
    assert set(check_overrides({'multiply': Uniform()})) == {'mul'}
    torch.testing.assert_close(
        attributed(model, AttnLRPEpsilon(overrides={'silu': Identity()}), x), attributed(model, AttnLRPEpsilon(), x)
    )


@pytest.mark.parametrize(
    'overrides, error, match',
    [
        ({'silux': Uniform()}, ValueError, r"'silux' is not an operation of the registry; known operations: .*\bmul\b"),
        ({'size': Uniform()}, ValueError, "'size' is not an operation of the registry"),
        ({'silu': ConstantGates()}, ValueError, 'silu is not a product .* give an activation rule'),
        ({'mul': Identity()}, ValueError, 'mul is not an element-wise function .* give a ProductRule'),
        ({'softmax': Uniform()}, ValueError, "softmax is not a product \\(rule 'softmax'\\).* give no rule object"),
        ({'mul': 0.5}, TypeError, 'the rule of mul must be a ProductRule .* or a function'),
    ],
)
def test_overrides_the_registry_cannot_place_are_refused(overrides, error, match):
    with pytest.raises(error, match=match):
        AttnLRPEpsilon(overrides=overrides)


# ---------------------------------------------------------------------------------------------- rule tables
def test_the_rule_table_says_which_rule_each_operation_gets():
    """CP-LRP's dry run on the block: each operation with its rule and what the engine does (the shares by the kinds
    of the factors), the module rule of the root, no gradient computed."""
    model, x = block(), inputs()
    leaf = x.clone().requires_grad_(True)
    table = CPLRPEpsilon().rule_table(model, leaf)
    assert leaf.grad is None and all(not hooks for module in model.modules() for hooks in [module._forward_hooks])
    rows = {(row.operation, row.how): (row.rule, row.count) for row in table.rows}
    assert rows[('silu', 'Identity (Eq. 9)')] == ('elementwise', 1)
    assert rows[('mul', 'ConstantGates(): shares (0, 1) of the factors (activation, value)')] == ('product', 1)
    assert rows[('matmul', 'ConstantGates(): shares (0.5, 0.5) of the factors (value, value)')] == ('product', 1)
    assert rows[('matmul', 'ConstantGates(): shares (0, 1) of the factors (softmax, value)')] == ('product', 1)
    assert rows[('softmax', 'the softmax rule (Prop. 3.1): its plain gradient')] == ('softmax', 1)
    assert rows[('Block (module)', 'RelevanceBoundary')] == ('module rule', 1)
    assert table.operations() == {
        'Block (module)': {'module rule'},
        'linear': {'product'},
        'silu': {'elementwise'},
        'mul': {'product'},
        'matmul': {'product'},
        't': {'plain'},
        'softmax': {'softmax'},
        'add': {'plain'},
    }
    assert table.refusals == []
    text = str(table)
    assert text.startswith('rules of Block under CPLRPEpsilon (products: ConstantGates()) (dry run')
    assert 'ConstantGates(): shares (0, 1) of the factors (softmax, value)' in text and text.endswith(
        'refused: nothing'
    )


def test_the_rule_table_names_overrides_and_goes_on_past_a_refusal():
    """An override is listed as such; a refused operation is listed with the refusal, and the operations after it
    are still classified."""

    class Refusing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)

        def forward(self, x):
            return torch.special.i0(self.a(x)) * self.b(x)

    torch.manual_seed(0)
    table = AttnLRPEpsilon(overrides={'mul': halves_to_first}).rule_table(Refusing().double(), inputs())
    rules = table.operations()
    assert rules['special_i0'] == {'refused'} and rules['mul'] == {'override'}
    assert [row.how for row in table.rows if row.operation == 'mul'] == ['overridden: halves_to_first']
    assert len(table.refusals) == 1 and table.refusals[0].startswith('zennit-attn cannot explain special_i0 in')
    assert 'overrides: mul: halves_to_first' in table.composite


def test_a_rule_table_needs_an_input_that_carries_relevance():
    with pytest.raises(ValueError, match='no input of Block carries relevance'):
        AttnLRPEpsilon().rule_table(block(), torch.tensor([[1, 2]]))


def test_op_names_of_the_contract_cases():
    """The names the cases above use are the registry's names of the functions."""
    assert op_name(torch.special.i0) == 'special_i0' and op_name(torch.Tensor.__matmul__) == 'matmul'
