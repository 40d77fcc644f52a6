"""Each AttnLRP rule against a naive re-implementation of the paper's formula (float64, exact to 1e-10)."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from zennit.composites import LayerMapComposite

from tests.naive_rules import (
    close,
    epsilon_rule,
    identity_rule,
    lrp,
    norm_rule,
    scale_rule,
    softmax_rule,
    stabilize,
    uniform_rule,
)
from zennit_attn.engine.modules import MatMul, Operand, Product, forward_parameters
from zennit_attn.engine.rules import (
    BilinearEpsilon,
    ConstantFactors,
    ConstantOperand,
    Epsilon,
    Identity,
    NormIdentity,
    RelevanceBoundary,
    Softmax,
    UniformOperand,
    UniformProduct,
)


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
    close(actual, expected)
    if epsilon == 0:
        # what the bias absorbs is exactly b_j R_j / z_j
        close(relevance.sum(1) - actual.sum(1), (linear.bias * relevance / z).sum(1))


@pytest.mark.parametrize('activation', [torch.nn.GELU(), torch.nn.SiLU(), torch.nn.Tanh(), torch.nn.GELU('tanh')])
def test_identity_activation(activation):
    """Eq. 9: element-wise non-linearities pass relevance unchanged."""
    x = torch.randn(4, 6, dtype=torch.float64)
    x[0, 0] = 0.0
    relevance = torch.randn(4, 6, dtype=torch.float64)
    relevance[0, 0] = 0.0  # relevance at f(0) = 0 is 0
    (actual,) = lrp(activation, Identity(), [x], relevance)
    close(actual, relevance)


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
    close(actual, expected)


@pytest.mark.parametrize('norm', [LlamaRMSNorm(6, eps=1e-6), torch.nn.RMSNorm(6, eps=1e-6)])
def test_norm_identity_rms_norm(norm):
    """Prop. 3.4 for RMSNorm: identity on x / g(x), epsilon on the weight: R_x = R_y."""
    norm = norm.double()
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 6, dtype=torch.float64)
    relevance = torch.randn(3, 6, dtype=torch.float64)
    (actual,) = lrp(norm, NormIdentity(), [x], relevance)
    close(actual, relevance)


def test_softmax_rule():
    """Prop. 3.1: R_in_i = x_i (R_i - s_i sum_j R_j)."""
    softmax = torch.nn.Softmax(dim=-1)
    x = torch.randn(3, 5, dtype=torch.float64)
    relevance = torch.randn(3, 5, dtype=torch.float64)
    (actual,) = lrp(softmax, Softmax(), [x], relevance)
    close(actual, softmax_rule(x, x.softmax(-1), relevance))


def test_uniform_product_three_factors():
    """Prop. 3.2: each of N factors of an element-wise product gets R / N."""
    factors = [torch.randn(4, 5, dtype=torch.float64) for _ in range(3)]
    relevance = torch.randn(4, 5, dtype=torch.float64)
    actual = lrp(Product(), UniformProduct(), factors, relevance)
    for value in actual:
        close(value, uniform_rule(relevance, 3))


@pytest.mark.parametrize('epsilon', [0.0, 0.1])
def test_bilinear_matmul(epsilon):
    """Prop. 3.3: R_A[j,i] = sum_p A_ji B_ip R_jp / (2 O_jp + eps), R_B[i,p] = sum_j A_ji B_ip R_jp / (2 O_jp + eps)."""
    a = torch.randn(2, 4, 3, dtype=torch.float64)
    b = torch.randn(2, 3, 5, dtype=torch.float64)
    relevance = torch.randn(2, 4, 5, dtype=torch.float64)
    actual_a, actual_b = lrp(MatMul(), BilinearEpsilon(epsilon), [a, b], relevance)

    output = a @ b
    denominator = stabilize(2 * output, epsilon)
    contributions = torch.einsum('nji,nip,njp->njip', a, b, relevance / denominator)
    close(actual_a, contributions.sum(3))
    close(actual_b, contributions.sum(1))
    if epsilon == 0:
        close(actual_a.sum((1, 2)) + actual_b.sum((1, 2)), relevance.sum((1, 2)))


def test_constant_factors_matmul():
    """CP-LRP: the attention matrix is a constant, O = A V is linear in V and V gets all relevance (Eq. 8)."""
    a = torch.randn(4, 3, dtype=torch.float64).softmax(-1)
    v = torch.randn(3, 5, dtype=torch.float64)
    relevance = torch.randn(4, 5, dtype=torch.float64)
    actual_a, actual_v = lrp(MatMul(), ConstantFactors((0,)), [a, v], relevance)
    expected_v = torch.einsum('ji,ip,jp->ip', a, v, relevance / (a @ v))
    close(actual_v, expected_v)
    assert float(actual_a.abs().max()) == 0.0


def relevance_with_constants(module, rule, operands, constant, relevance_out, keywords=()):
    """Like :py:func:`tests.naive_rules.lrp`, with the operands at the positions ``constant`` not requiring a gradient
    (constants, or tensors that are not explained) and those named in ``keywords`` passed by keyword (by the name of
    the forward's parameter): the input relevance of the others (None at the constants)."""
    leaves = [tensor.detach().requires_grad_(index not in constant) for index, tensor in enumerate(operands)]
    names = forward_parameters(module) if keywords else ()
    handles = rule.register(module)
    try:
        args = [leaf for index, leaf in enumerate(leaves) if not keywords or names[index] not in keywords]
        kwargs = {names[index]: leaf for index, leaf in enumerate(leaves) if keywords and names[index] in keywords}
        output = module(*args, **kwargs)
        variables = [leaf for leaf in leaves if leaf.requires_grad]
        grads = iter(torch.autograd.grad(output, variables, grad_outputs=relevance_out / output, allow_unused=True))
    finally:
        handles.remove()
    relevances = []
    for leaf in leaves:
        grad = next(grads) if leaf.requires_grad else None
        relevances.append(None if not leaf.requires_grad else leaf.detach() * (0 if grad is None else grad))
    return relevances


@pytest.mark.parametrize('constant', [0, 1], ids=['first-constant', 'second-constant'])
def test_uniform_product_with_a_constant_factor(constant):
    """Prop. 3.2 whatever the factors require: ``f = c x y`` with ``c`` a constant still has N = 3 factors, so ``x``
    and ``y`` get ``R / 3`` each (by hand: ``R_x = x * (c y g) / 3`` with ``g = R / f``) and the constant's share
    stays with it. zennit 0.5.1 did not apply the rule where the first factor was the constant (``R_x = R``)."""
    factors = [torch.randn(4, 5, dtype=torch.float64) for _ in range(3)]
    relevance = torch.randn(4, 5, dtype=torch.float64)
    actual = relevance_with_constants(Product(), UniformProduct(), factors, (constant,), relevance)
    output = factors[0] * factors[1] * factors[2]
    gradient = relevance / output
    for index, value in enumerate(actual):
        if index == constant:
            assert value is None
            continue
        others = [factor for position, factor in enumerate(factors) if position != index]
        close(value, factors[index] * others[0] * others[1] * gradient / 3)
        close(value, relevance / 3)


@pytest.mark.parametrize('epsilon', [0.0, 0.1])
@pytest.mark.parametrize('keywords', [(), ('a', 'b')], ids=['positional', 'keywords'])
@pytest.mark.parametrize('constant', [0, 1], ids=['a-constant', 'b-constant'])
def test_bilinear_matmul_with_a_constant_operand(constant, keywords, epsilon):
    """Prop. 3.3 whatever the operands require: ``O = A B`` with one operand constant; the other gets its share
    written out term by term, ``R_B[i, p] = sum_j A_ji B_ip R_jp / (2 O_jp + eps)`` (``R_A`` summed over ``p``), half
    of the relevance for ``eps = 0``. zennit 0.5.1 did not apply the rule where ``A`` was the constant (``R_B`` the
    whole relevance)."""
    a = torch.randn(2, 4, 3, dtype=torch.float64)
    b = torch.randn(2, 3, 5, dtype=torch.float64)
    relevance = torch.randn(2, 4, 5, dtype=torch.float64)
    actual = relevance_with_constants(MatMul(), BilinearEpsilon(epsilon), [a, b], (constant,), relevance, keywords)
    output = torch.zeros(2, 4, 5, dtype=torch.float64)
    for n in range(2):
        for j in range(4):
            for p in range(5):
                output[n, j, p] = sum(a[n, j, i] * b[n, i, p] for i in range(3))
    terms = torch.zeros(2, 4, 3, 5, dtype=torch.float64)
    for n in range(2):
        for j in range(4):
            for i in range(3):
                for p in range(5):
                    denominator = 2 * output[n, j, p] + epsilon * (1.0 if output[n, j, p] >= 0 else -1.0)
                    terms[n, j, i, p] = a[n, j, i] * b[n, i, p] * relevance[n, j, p] / denominator
    assert actual[constant] is None
    if constant == 0:
        close(actual[1], terms.sum(1))
    else:
        close(actual[0], terms.sum(3))
    if epsilon == 0:
        close(actual[1 - constant].sum((1, 2)), relevance.sum((1, 2)) / 2)


@pytest.mark.parametrize('keywords', [(), ('a', 'b')], ids=['positional', 'keywords'])
@pytest.mark.parametrize('requires', [True, False], ids=['a-requires-grad', 'a-constant'])
def test_constant_factors_matmul_whatever_a_requires(requires, keywords):
    """CP-LRP: ``O = A V`` is linear in ``V``, which gets all relevance (Eq. 8, written out term by term), whether
    the attention matrix requires a gradient or not, also with the operands passed by keyword; ``A`` gets none."""
    a = torch.randn(4, 3, dtype=torch.float64).softmax(-1)
    v = torch.randn(3, 5, dtype=torch.float64)
    relevance = torch.randn(4, 5, dtype=torch.float64)
    actual_a, actual_v = relevance_with_constants(
        MatMul(), ConstantFactors((0,)), [a, v], () if requires else (0,), relevance, keywords
    )
    expected = torch.zeros(3, 5, dtype=torch.float64)
    for i in range(3):
        for p in range(5):
            expected[i, p] = sum(a[j, i] * v[i, p] * relevance[j, p] / float(a[j] @ v[:, p]) for j in range(4))
    close(actual_v, expected)
    close(actual_v.sum(), relevance.sum())
    assert actual_a is None if not requires else float(actual_a.abs().max()) == 0.0


@pytest.mark.parametrize(
    'rule, scales',
    [
        (UniformOperand(), {'query': 0.25, 'key': 0.25, 'value': 0.5}),
        (ConstantOperand(), {'query': 0.0, 'key': 0.0, 'value': 1.0}),
    ],
)
def test_operand_rules_fused_sections(rule, scales):
    """Fused q/k/v projection: each section's relevance is scaled by its role's factor."""
    operand = Operand(('query', 'key', 'value'), sections=(2, 2, 4))
    x = torch.randn(3, 8, dtype=torch.float64)
    relevance = torch.randn(3, 8, dtype=torch.float64)
    (actual,) = lrp(operand, rule, [x], relevance)
    factors = torch.tensor([scales['query']] * 2 + [scales['key']] * 2 + [scales['value']] * 4, dtype=torch.float64)
    close(actual, relevance * factors)


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


@pytest.mark.parametrize('role', ['value', 'key'])
def test_operand_rules_hold_where_the_model_changes_the_operand_in_place(role):
    """An operand changed in place by the model keeps its rule (a gradient hook on a view of the operand was dropped
    with the view's node: the plain gradient came out, silently): the relevance is the role's share, as out of place
    (float64, 1e-10)."""
    x, relevance = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    for in_place in (True, False):
        found = run_changed(Operand(role), UniformOperand(), in_place, x, relevance)
        close(found, relevance * UniformOperand.scales[role])


def test_epsilon_holds_where_the_model_changes_the_output_in_place():
    """Eq. 8 needs the layer's output ``z``: computed before the model changes ``z`` in place (Falcon adds its attention
    output to the MLP's in place), the relevance is Eq. 8's, in place and out of place (float64, 1e-10). Before, the
    rule's hook sat on a view and was dropped: the plain gradient came out."""
    linear = torch.nn.Linear(5, 4).double()
    x, relevance = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    z = x @ linear.weight.T + linear.bias
    for in_place in (True, False):
        close(
            run_changed(linear, Epsilon(0.5), in_place, x, relevance),
            torch.einsum('ji,bi,bj->bi', linear.weight, x, relevance / stabilize(z, 0.5)),
        )


def test_attention_operands_conserve_through_bilinear_products():
    """With the operand rules at q, k, v and the plain gradient in between, an attention head's relevance splits
    as Props. 3.1-3.3 say: R(q) + R(k) = R(A) - absorbed, R(v) = R(O) - R(A), with R(A) = A * g_A / 2."""
    q, k, v = (torch.randn(5, 3, dtype=torch.float64) for _ in range(3))
    relevance = torch.randn(5, 3, dtype=torch.float64)
    operands = [Operand(role) for role in ('query', 'key', 'value')]
    handles = [UniformOperand().register(operand) for operand in operands]
    try:
        leaves = [tensor.requires_grad_() for tensor in (q, k, v)]
        qq, kk, vv = (operand(tensor) for operand, tensor in zip(operands, leaves))
        scores = qq @ kk.T
        attention = scores.softmax(-1)
        attention.retain_grad()
        scores.retain_grad()
        output = attention @ vv
        output.backward(relevance / output)
    finally:
        for handle in handles:
            handle.remove()
    r_q, r_k, r_v = (tensor.detach() * tensor.grad for tensor in leaves)
    r_attention = attention.detach() * attention.grad / 2
    # Prop. 3.3 for A V: A and V split the relevance of O
    close(r_attention.sum() + r_v.sum(), relevance.sum())
    # Prop. 3.1 then Prop. 3.3 for Q K^T: q and k split the relevance of the softmax input
    r_scores = scores.detach() * scores.grad / 2
    close(r_q.sum() + r_k.sum(), r_scores.sum())
    expected_scores = softmax_rule(scores.detach(), attention.detach(), r_attention)
    close(r_scores, expected_scores)


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
    close(actual, expected)
    close(actual.sum(1), relevance.sum(1))


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
    close(hooked, expected)
    assert all(not module._forward_hooks and not module._forward_pre_hooks for module in model.modules())


def test_copy_keeps_parameters():
    """zennit composites call copy() for every module: parameters must survive (zennit's Hook.copy drops them)."""
    assert Epsilon(0.3).copy().epsilon == 0.3
    assert BilinearEpsilon(0.2).copy().epsilon == 0.2
    assert ConstantFactors((1,)).copy().indices == (1,)


def test_rule_errors_name_the_module():
    with pytest.raises(TypeError, match='Linear'):
        lrp(
            torch.nn.Linear(3, 3).double(),
            NormIdentity(),
            [torch.randn(2, 3, dtype=torch.float64)],
            torch.randn(2, 3, dtype=torch.float64),
        )
    with pytest.raises(TypeError, match='Operand'):
        lrp(
            torch.nn.Tanh(),
            UniformOperand(),
            [torch.randn(2, 3, dtype=torch.float64)],
            torch.randn(2, 3, dtype=torch.float64),
        )
    with pytest.raises(ValueError, match='role'):
        Operand('queries')
