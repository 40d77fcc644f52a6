"""Naive reference rules of AttnLRP (Achtibat et al., ICML 2024, Sec. 3) and the helpers that compare them with the
library, shared by the reference tests (``test_reference``, ``canonizers/test_moe_reference``,
``canonizers/test_t5_reference``) and the rule tests (``test_rules``, ``composites/test_gamma``).

The rules are written in *relevance form*: plain torch formulas from the forward activations to the relevance of
the inputs, no autograd and nothing imported from ``zennit_attn``. Their epsilon is 0; an epsilon rule with
``eps > 0`` is the same formula with the denominator :py:func:`stabilize`-d.

Two forms of the matrix-product rules keep the numbers of both reference tests they come from:
:py:func:`matmul_rule` and :py:func:`constant_matmul_rule` (batched, through matrix products) and
:py:func:`matmul_rule_by_terms` and :py:func:`constant_matmul_rule_by_terms` (2-D, every term ``a_ji b_ip`` formed
and summed, as the formula is written). They agree to rounding.
"""

from __future__ import annotations

import torch

from tests.numbers import relative_error as relative_error  # re-exported: the reference tests import it from here

#: The variants of the references: AttnLRP, and CP-LRP (Ali et al. 2022: the attention probabilities and the gates
#: of gated products are constants).
ATTNLRP, CPLRP = 'attnlrp', 'cplrp'


# ----------------------------------------------------------------------------------------------------------------
# Stabiliser
# ----------------------------------------------------------------------------------------------------------------


def sign(tensor):
    """The sign with ``sign(0) = 1``, in the tensor's dtype (zennit's convention).

    Parameters
    ----------
    tensor : torch.Tensor
        Any tensor.

    Returns
    -------
    torch.Tensor
        ``1`` where ``tensor >= 0``, ``-1`` elsewhere.
    """
    return torch.where(tensor >= 0, 1.0, -1.0).to(tensor.dtype)


def stabilize(tensor, epsilon):
    """The stabilised denominator ``z + eps sign(z)`` of the epsilon rule (Eq. 8), as zennit forms it.

    Parameters
    ----------
    tensor : torch.Tensor
        The denominator ``z``.
    epsilon : float
        ``eps``.

    Returns
    -------
    torch.Tensor
        ``z + eps * sign(z)``, with :py:func:`sign` (``sign(0) = 1``).
    """
    return tensor + epsilon * sign(tensor)


# ----------------------------------------------------------------------------------------------------------------
# Linear maps and sums: the epsilon rule (Eq. 8)
# ----------------------------------------------------------------------------------------------------------------


def epsilon_rule(x, weight, z, relevance):
    """Epsilon rule (Eq. 8, eps = 0) of a linear layer ``z = x W^T`` (a bias, if any, is in ``z``).

    Parameters
    ----------
    x : torch.Tensor
        ``[..., in]`` input.
    weight : torch.Tensor
        ``[out, in]`` weight ``W``.
    z : torch.Tensor
        ``[..., out]`` output, the denominator; pass :py:func:`stabilize` ``(z, eps)`` for the rule with ``eps``.
    relevance : torch.Tensor
        ``[..., out]`` output relevance ``R_j``.

    Returns
    -------
    torch.Tensor
        ``[..., in]``: ``R_i = x_i sum_j W_ji R_j / z_j``.
    """
    return x * ((relevance / z) @ weight)


def scale_rule(x, scale, z, relevance):
    """Epsilon rule (Eq. 8, eps = 0) of an element-wise scaling ``z = scale * x`` (a diagonal linear map).

    Parameters
    ----------
    x : torch.Tensor
        Input.
    scale : torch.Tensor or float
        The factor, broadcast against ``x``.
    z : torch.Tensor
        Output ``scale * x``.
    relevance : torch.Tensor
        Output relevance.

    Returns
    -------
    torch.Tensor
        ``R_x = x * scale * R / z``.
    """
    return x * scale * relevance / z


def sum_rule(term, total, relevance):
    """Epsilon rule (Eq. 8, eps = 0) on a sum ``total = sum of terms``: the share of one term.

    A constant term is a bias: it absorbs its share.

    Parameters
    ----------
    term : torch.Tensor
        One term of the sum.
    total : torch.Tensor
        The sum.
    relevance : torch.Tensor
        Relevance of the sum.

    Returns
    -------
    torch.Tensor
        ``term * R / total``.
    """
    return term * relevance / total


def residual_rule(a, b, relevance):
    """Epsilon rule (Eq. 8, eps = 0) on the sum ``z = a + b`` of a residual connection (:py:func:`sum_rule` for
    both terms).

    Returns
    -------
    tuple of torch.Tensor
        ``(a R / z, b R / z)``.
    """
    z = a + b
    return sum_rule(a, z, relevance), sum_rule(b, z, relevance)


def constant_factor_rule(constant, variable, relevance):
    """Epsilon rule (Eq. 8, eps = 0) of ``z = constant * variable``, linear in ``variable`` (CP-LRP: a gate taken
    as a constant).

    Returns
    -------
    torch.Tensor
        ``R_variable = variable * constant * R / z`` (all of ``R``, up to rounding).
    """
    return variable * constant * relevance / (constant * variable)


def rotary_rule(x, rotation, z, relevance):
    """Epsilon rule (Eq. 8, eps = 0) of the rotary embedding, a linear map ``z_t = J_t x_t`` per position.

    Parameters
    ----------
    x, z, relevance : torch.Tensor
        ``[T, d]`` input, output and output relevance of one head.
    rotation : torch.Tensor
        ``[T, d, d]`` rotary matrices ``J_t``.

    Returns
    -------
    torch.Tensor
        ``R_x[t] = x_t * J_t^T (R_t / z_t)``.
    """
    return x * torch.einsum('tji,tj->ti', rotation, relevance / z)


# ----------------------------------------------------------------------------------------------------------------
# Element-wise non-linearities and normalisation: identity rule (Eq. 9, Prop. 3.4)
# ----------------------------------------------------------------------------------------------------------------


def identity_rule(relevance):
    """Identity rule (Eq. 9) of an element-wise non-linearity (SiLU, GELU, sigmoid, ...): ``R_in = R_out``."""
    return relevance


def norm_rule(relevance):
    """Identity rule (Prop. 3.4) on the normalisation ``x / g(x)`` of LayerNorm / RMSNorm: ``R_x = R_{x/g}``."""
    return relevance


def rms_norm_rule(u, weight, relevance):
    """RMSNorm (and T5LayerNorm) ``y = w * u``, ``u = x / g(x)``: epsilon rule (Eq. 8) on the weight, then the
    identity rule (Prop. 3.4) on the normalisation.

    Parameters
    ----------
    u : torch.Tensor
        The normalised input ``x / g(x)``.
    weight : torch.Tensor
        The weight ``w``.
    relevance : torch.Tensor
        Relevance of ``y``.

    Returns
    -------
    torch.Tensor
        ``R_x = u * w * R / (w * u)``.
    """
    return norm_rule(scale_rule(u, weight, weight * u, relevance))


# ----------------------------------------------------------------------------------------------------------------
# Products and the softmax: Props. 3.1-3.3
# ----------------------------------------------------------------------------------------------------------------


def uniform_rule(relevance, factors=2):
    """Uniform rule (Prop. 3.2) of an element-wise product of ``factors`` factors.

    Returns
    -------
    torch.Tensor
        ``R / factors``, the share of *each* factor.
    """
    return relevance / factors


def softmax_rule(x, s, relevance, mask=None):
    """Softmax rule (Prop. 3.1) over the last dimension: ``R_x_i = x_i (R_i - s_i sum_j R_j)``; the hidden bias
    absorbs the rest.

    Parameters
    ----------
    x : torch.Tensor
        ``[..., I]`` softmax input (masked entries arbitrary).
    s : torch.Tensor
        ``[..., I]`` softmax output (0 at masked entries).
    relevance : torch.Tensor
        ``[..., I]`` relevance of ``s``.
    mask : torch.Tensor, optional
        ``[..., I]`` bool, True where an entry is visible; masked entries get 0 relevance. None: no mask.
    """
    result = x * (relevance - s * relevance.sum(-1, keepdim=True))
    return result if mask is None else torch.where(mask, result, torch.zeros_like(result))


def matmul_rule(a, b, o, relevance):
    """Epsilon + uniform rule (Prop. 3.3, eps = 0) of ``o = a @ b``, batched over leading dimensions, through
    matrix products.

    Parameters
    ----------
    a : torch.Tensor
        ``[..., J, I]``.
    b : torch.Tensor
        ``[..., I, P]``.
    o : torch.Tensor
        ``[..., J, P]`` the product.
    relevance : torch.Tensor
        ``[..., J, P]`` relevance of ``o``.

    Returns
    -------
    tuple of torch.Tensor
        ``R_a[j, i] = sum_p a_ji b_ip R_jp / (2 o_jp)`` and ``R_b[i, p] = sum_j a_ji b_ip R_jp / (2 o_jp)``.
    """
    ratio = relevance / (2 * o)
    return a * (ratio @ b.transpose(-1, -2)), b * (a.transpose(-1, -2) @ ratio)


def constant_matmul_rule(a, b, o, relevance):
    """Epsilon rule (Eq. 8, eps = 0) of ``o = a @ b`` with ``a`` a constant (CP-LRP: ``A`` of ``A V``), batched,
    through matrix products.

    Returns
    -------
    torch.Tensor
        ``R_b[i, p] = sum_j a_ji b_ip R_jp / o_jp``.
    """
    return b * (a.transpose(-1, -2) @ (relevance / o))


def matmul_rule_by_terms(a, b, relevance):
    """:py:func:`matmul_rule` (Prop. 3.3, eps = 0) of ``O = a @ b`` for 2-D ``a``, ``b``, with every term
    ``a_ji b_ip R_jp / (2 O_jp)`` formed and then summed.

    Parameters
    ----------
    a : torch.Tensor
        ``[J, I]``.
    b : torch.Tensor
        ``[I, P]``.
    relevance : torch.Tensor
        ``[J, P]`` relevance of ``O``.

    Returns
    -------
    tuple of torch.Tensor
        ``R_a[j, i] = sum_p a_ji b_ip R_jp / (2 O_jp)`` and ``R_b[i, p] = sum_j a_ji b_ip R_jp / (2 O_jp)``.
    """
    out = a @ b
    contributions = a[:, :, None] * b[None, :, :] * (relevance / (2 * out))[:, None, :]
    return contributions.sum(2), contributions.sum(0)


def constant_matmul_rule_by_terms(a, b, relevance):
    """:py:func:`constant_matmul_rule` (Eq. 8, eps = 0, ``a`` constant) of ``O = a @ b`` for 2-D ``a``, ``b``, with
    every term formed and then summed.

    Returns
    -------
    torch.Tensor
        ``R_b[i, p] = sum_j a_ji b_ip R_jp / O_jp``.
    """
    out = a @ b
    return (a[:, :, None] * b[None, :, :] * (relevance / out)[:, None, :]).sum(0)


def gated_mlp_rule(x, w_gate, w_up, w_down, relevance, variant, activation=torch.nn.functional.silu):
    """Output and input relevance of the gated MLP ``down(activation(gate x) * up x)`` (bias-free).

    ``down``, ``gate``, ``up``: Eq. 8; the product: Prop. 3.2 (CP-LRP: the gate ``activation(gate x)`` is a
    constant factor, the product is linear in ``up x``, which receives all relevance); the activation: Eq. 9.

    Parameters
    ----------
    x : torch.Tensor
        ``[T, H]`` input.
    w_gate, w_up : torch.Tensor
        ``[I, H]`` gate and up projections.
    w_down : torch.Tensor
        ``[H, I]`` down projection.
    relevance : torch.Tensor
        ``[T, H]`` relevance of the output.
    variant : str
        :py:data:`ATTNLRP` or :py:data:`CPLRP`.
    activation : callable
        The gate's activation (SiLU in Llama-like experts, ``gelu_new`` in T5's gated-GELU layer).

    Returns
    -------
    tuple of torch.Tensor
        ``(output [T, H], relevance at x [T, H])``.
    """
    a, b = x @ w_gate.T, x @ w_up.T
    h = activation(a) * b
    e = h @ w_down.T
    r_h = epsilon_rule(h, w_down, e, relevance)
    if variant == ATTNLRP:
        r_activation, r_b = uniform_rule(r_h), uniform_rule(r_h)
        r_x = epsilon_rule(x, w_gate, a, identity_rule(r_activation)) + epsilon_rule(x, w_up, b, r_b)
    else:  # CP-LRP: activation(a) is a constant factor, the product is linear in b
        r_x = epsilon_rule(x, w_up, b, r_h)
    return e, r_x


# ----------------------------------------------------------------------------------------------------------------
# Comparison with the library
# ----------------------------------------------------------------------------------------------------------------


def lrp(module, rule, inputs, relevance_out):
    """Relevance at ``inputs`` of ``module`` with the library's ``rule`` registered, from ``relevance_out`` at its
    output.

    The rules pass the modified gradient ``g = R / x``, so the output relevance enters as ``R / y`` (0 where
    ``y = 0``) and the input relevance is ``x * g``.

    Parameters
    ----------
    module : torch.nn.Module
        The module, called with ``inputs``.
    rule : zennit.core.Hook
        The rule, registered on ``module`` for this call.
    inputs : torch.Tensor or sequence of torch.Tensor
        The input, or the inputs.
    relevance_out : torch.Tensor
        Relevance of the output.

    Returns
    -------
    torch.Tensor or list of torch.Tensor
        The input relevance, in the form of ``inputs``; 0 at an input the output does not depend on.
    """
    single = isinstance(inputs, torch.Tensor)
    handles = rule.register(module)
    try:
        inputs = [tensor.detach().requires_grad_() for tensor in ([inputs] if single else inputs)]
        output = module(*inputs)
        grad_output = torch.where(output == 0, 0.0, relevance_out / output)
        grads = torch.autograd.grad(output, inputs, grad_outputs=grad_output, allow_unused=True)
    finally:
        handles.remove()
    relevances = [tensor.detach() * (0 if grad is None else grad) for tensor, grad in zip(inputs, grads)]
    return relevances[0] if single else relevances
