"""Torch functions that the engine opens: their arithmetic re-run as plain torch operations.

A :py:class:`~torch.overrides.TorchFunctionMode` sees a composite torch function such as
:py:func:`torch.nn.functional.multi_head_attention_forward` as one call and none of the operations inside it. The
functions here compute the same result from operations that
:py:class:`~zennit_attn.operations.classifier.Classifier` classifies one by one (linear maps, the attention
products, the softmax, element-wise non-linearities), so that AttnLRP's rules apply inside them:
:py:data:`DECOMPOSED` (multi-head attention, GLU, softmin, group normalisation) and :py:data:`STATISTICS`
(variances, standard deviations and norms, which are normalisers ``g(x)`` where they normalise ``x`` and values
elsewhere).
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

__all__ = [
    'DECOMPOSED',
    'STATISTICS',
    'multi_head_attention',
    'glu',
    'softmin',
    'variance',
    'variance_mean',
    'standard_deviation',
    'standard_deviation_mean',
    'norm',
    'matrix_norm',
    'linalg_norm',
    'lerp',
    'addcdiv',
    'hypot',
    'cosine_similarity',
    'group_norm',
]


def _refuse_options(arguments: dict) -> None:
    """Raise NotImplementedError naming the options of ``multi_head_attention_forward`` outside standard softmax
    attention that ``arguments`` (bound) use."""
    unsupported = [name for name in ('bias_k', 'bias_v', 'static_k', 'static_v') if arguments[name] is not None]
    if arguments['add_zero_attn']:
        unsupported.append('add_zero_attn')
    if arguments['training'] and arguments['dropout_p'] > 0:
        unsupported.append('dropout in training mode')
    if unsupported:
        raise NotImplementedError(f'multi_head_attention_forward with {", ".join(unsupported)}')


def multi_head_attention(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:py:func:`torch.nn.functional.multi_head_attention_forward` (same arguments and result) from linear maps,
    ``q @ k^T``, softmax and ``A @ v``: the attention of :py:class:`torch.nn.MultiheadAttention` (SigLIP's
    attention-pooling head, ...).

    Raises
    ------
    NotImplementedError
        For the options outside standard softmax attention: ``bias_k``/``bias_v``, ``add_zero_attn``, ``static_k``/
        ``static_v``, and dropout in training mode (the message names the option).
    """
    bound = inspect.signature(F.multi_head_attention_forward).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    _refuse_options(a)
    query, key, value = a['query'], a['key'], a['value']
    batched = query.dim() == 3
    if not batched:  # (L, E) -> (L, 1, E)
        query, key, value = (tensor.unsqueeze(1) for tensor in (query, key, value))
    length, batch, width = query.shape
    heads = a['num_heads']
    size = width // heads
    if a['use_separate_proj_weight']:
        weights = a['q_proj_weight'], a['k_proj_weight'], a['v_proj_weight']
    else:
        weights = a['in_proj_weight'].chunk(3)
    biases = (None,) * 3 if a['in_proj_bias'] is None else a['in_proj_bias'].chunk(3)

    def split(tensor, weight, bias):  # (S, N, E) -> (N, heads, S, size)
        projected = F.linear(tensor, weight, bias)
        return projected.reshape(projected.shape[0], batch, heads, size).permute(1, 2, 0, 3)

    q, k, v = (split(tensor, weight, bias) for tensor, weight, bias in zip((query, key, value), weights, biases))
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(size)
    mask = _mask(
        a['attn_mask'], a['key_padding_mask'], a['is_causal'], scores, batch, heads, length, k.shape[2], batched
    )
    if mask is not None:
        scores = scores + mask
    attention = torch.softmax(scores, -1)
    mixed = torch.matmul(attention, v).permute(2, 0, 1, 3).reshape(length, batch, width)
    output = F.linear(mixed, a['out_proj_weight'], a['out_proj_bias'])
    weights_out = None
    if a['need_weights']:
        weights_out = attention
        if a['average_attn_weights']:
            weights_out = weights_out.mean(1)
        if not batched:
            weights_out = weights_out.squeeze(0)
    return (output if batched else output.squeeze(1)), weights_out


def _mask(attn_mask, key_padding_mask, is_causal, scores, batch, heads, length, source, batched):
    """The additive mask ``[N, heads or 1, L, S]`` of the attention mask and the key padding mask (True: masked)."""
    total = None
    for mask in (attn_mask, key_padding_mask):
        if mask is None:
            continue
        if mask is key_padding_mask:
            mask = mask.reshape(batch if batched else 1, 1, 1, source)
        elif mask.dim() == 3:  # (N * heads, L, S)
            mask = mask.reshape(batch, heads, length, source)
        if mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=scores.dtype).masked_fill(mask, float('-inf'))
        mask = mask.to(scores.dtype)
        total = mask if total is None else total + mask
    if total is None and is_causal:
        total = torch.full((length, source), float('-inf'), dtype=scores.dtype, device=scores.device).triu(1)
    return total


def glu(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """:py:func:`torch.nn.functional.glu`: ``a * sigmoid(b)`` of the two halves of ``input`` along ``dim`` (a
    product of a value and a gate)."""
    a, b = input.chunk(2, dim)
    return a * torch.sigmoid(b)


def softmin(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> torch.Tensor:
    """:py:func:`torch.nn.functional.softmin`: the softmax of ``-input``."""
    return torch.softmax(-input, dim if dim is not None else -1, dtype=dtype)


def _dims(input: torch.Tensor, dim) -> tuple[int, ...]:
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        return tuple(range(input.dim()))
    return tuple(item % max(input.dim(), 1) for item in ((dim,) if isinstance(dim, int) else dim))


def _variance_arguments(args, kwargs) -> tuple:
    """``(dim, correction, keepdim)`` of the overloads ``var(input, unbiased)``, ``var(input, dim, unbiased,
    keepdim)`` and ``var(input, dim=None, *, correction=1, keepdim=False)`` (also ``std``)."""
    rest = list(args)
    dim, unbiased = kwargs.get('dim'), kwargs.get('unbiased')
    correction, keepdim = kwargs.get('correction'), kwargs.get('keepdim', False)
    if rest and isinstance(rest[0], bool):
        unbiased = rest.pop(0)
    if rest:
        dim = rest.pop(0)
    if rest and isinstance(rest[0], bool):
        unbiased = rest.pop(0)
    if rest:
        keepdim = rest.pop(0)
    if correction is None:
        correction = 1 if unbiased is None else int(unbiased)
    return dim, correction, keepdim


def variance_mean(input: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """:py:func:`torch.var_mean`: ``sum((x - mean)^2) / (n - correction)`` and the mean, from a mean, a difference,
    a square (an element-wise non-linearity) and a sum."""
    dim, correction, keepdim = _variance_arguments(args, kwargs)
    dims = _dims(input, dim)
    count = math.prod(input.shape[item] for item in dims) if input.dim() else 1
    mean = input.mean(dims, keepdim=True)
    total = (input - mean).square().sum(dims, keepdim=keepdim)
    return total / (count - correction), (mean if keepdim else mean.squeeze(dims) if dims else mean)


def variance(input: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """:py:func:`torch.var` (see :py:func:`variance_mean`)."""
    return variance_mean(input, *args, **kwargs)[0]


def standard_deviation_mean(input: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """:py:func:`torch.std_mean`: the square root of the variance, and the mean."""
    value, mean = variance_mean(input, *args, **kwargs)
    return value.sqrt(), mean


def standard_deviation(input: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """:py:func:`torch.std` (see :py:func:`variance_mean`)."""
    return variance_mean(input, *args, **kwargs)[0].sqrt()


def norm(
    input: torch.Tensor, ord=2, dim=None, keepdim: bool = False, *args, dtype=None, p=None, **kwargs
) -> torch.Tensor:
    """A vector norm (``torch.norm``, ``Tensor.norm``, ``torch.linalg.vector_norm``, ``torch.linalg.norm`` of a vector,
    the Frobenius norm): ``(sum |x|^p)^(1/p)``, ``max |x|`` for ``p = inf``, ``min |x|`` for ``-inf``, from element-wise
    non-linearities and sums.

    Raises
    ------
    NotImplementedError
        For the nuclear and spectral norms and ``p = 0`` (the count of non-zero entries).
    """
    order = ord if p is None else p
    if order is None or order == 'fro':
        order = 2
    if isinstance(order, str) or order == 0 or not isinstance(order, (int, float)):
        raise NotImplementedError(f'the norm {order!r}')
    x = input if dtype is None else input.to(dtype)
    dims = _dims(x, dim)
    if order == math.inf:
        return x.abs().amax(dims, keepdim=keepdim)
    if order == -math.inf:
        return x.abs().amin(dims, keepdim=keepdim)
    if order == 2:
        return x.square().sum(dims, keepdim=keepdim).sqrt()
    return x.abs().pow(order).sum(dims, keepdim=keepdim).pow(1 / order)


def matrix_norm(input: torch.Tensor, ord='fro', dim=(-2, -1), keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    """:py:func:`torch.linalg.matrix_norm`: the Frobenius norm (see :py:func:`norm`); other orders are refused."""
    if ord != 'fro':
        raise NotImplementedError(f'the matrix norm {ord!r}')
    return norm(input, 2, dim, keepdim, dtype=dtype)


def linalg_norm(input: torch.Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    """:py:func:`torch.linalg.norm`: a matrix norm (:py:func:`matrix_norm`) for an order given over two dimensions
    (of a 2-dimensional input without ``dim``), else a vector norm (:py:func:`norm`)."""
    over_two = (dim is None and input.dim() == 2) or (isinstance(dim, (tuple, list)) and len(dim) == 2)
    if ord is not None and over_two:
        return matrix_norm(input, ord, (-2, -1) if dim is None else dim, keepdim, dtype=dtype)
    return norm(input, ord, dim, keepdim, dtype=dtype)


def lerp(input: torch.Tensor, end: torch.Tensor, weight) -> torch.Tensor:
    """:py:func:`torch.lerp`: ``input + weight * (end - input)`` (a product where the weight carries relevance)."""
    return input + weight * (end - input)


def addcdiv(input: torch.Tensor, tensor1: torch.Tensor, tensor2: torch.Tensor, *, value=1) -> torch.Tensor:
    """:py:func:`torch.addcdiv`: ``input + value * tensor1 / tensor2`` (a division: the divisor is a normaliser)."""
    return input + value * (tensor1 / tensor2)


def hypot(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """:py:func:`torch.hypot`: ``sqrt(input^2 + other^2)`` (a norm of two values)."""
    return (input.square() + other.square()).sqrt()


def cosine_similarity(x1: torch.Tensor, x2: torch.Tensor, dim: int = 1, eps: float = 1e-8) -> torch.Tensor:
    """:py:func:`torch.nn.functional.cosine_similarity`: ``sum(x1 * x2) / max(||x1|| ||x2||, eps)`` along ``dim``
    (a product of the two, divided by the norms: constants, Prop. 3.4)."""
    return (x1 * x2).sum(dim) / (x1.norm(dim=dim) * x2.norm(dim=dim)).clamp_min(eps)


def group_norm(
    input: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """:py:func:`torch.nn.functional.group_norm`: the channels (dimension 1) in ``num_groups`` groups, each centred and
    divided by its standard deviation over its channels and positions (a divisor: a constant, Prop. 3.4, as a
    LayerNorm's), then scaled and shifted per channel."""
    shape = input.shape
    grouped = input.reshape(shape[0], num_groups, -1)
    centred = grouped - grouped.mean(-1, keepdim=True)
    output = (centred / torch.sqrt(grouped.var(-1, keepdim=True, unbiased=False) + eps)).reshape(shape)
    channels = (1, -1) + (1,) * (len(shape) - 2)
    if weight is not None:
        output = output * weight.reshape(channels)
    if bias is not None:
        output = output + bias.reshape(channels)
    return output


#: torch functions (by name) -> their decomposition
DECOMPOSED = {
    'multi_head_attention_forward': multi_head_attention,
    'glu': glu,
    'softmin': softmin,
    'lerp': lerp,
    'addcdiv': addcdiv,
    'hypot': hypot,
    'cosine_similarity': cosine_similarity,
    'group_norm': group_norm,
}
#: statistics of a tensor (by name) -> their decomposition: the value of a normaliser ``g(x)`` where it is not used
#: to normalise ``x`` (:py:mod:`~zennit_attn.operations.elementwise`)
STATISTICS = {
    'var': variance,
    'var_mean': variance_mean,
    'std': standard_deviation,
    'std_mean': standard_deviation_mean,
    'norm': norm,
    'vector_norm': norm,
    'linalg_vector_norm': norm,
    'linalg_norm': linalg_norm,
    'matrix_norm': matrix_norm,
    'linalg_matrix_norm': matrix_norm,
}
