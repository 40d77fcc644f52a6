"""The operation registry (:py:mod:`zennit_attn.operations.registry`) walked op by op: every declared operation,
run by the engine on a small case, against its rule written out by hand (float64):

- ``plain``: the plain gradient (the function itself, differentiated by torch);
- ``product``: each of the two relevance-carrying factors 1/2 (AttnLRP's uniform rule, Prop. 3.2 and 3.3);
- ``elementwise``, ``bound``, ``normaliser``, ``power``: the identity rule ``f(x) / x`` (Eq. 9), from the input of the
  element-wise function (a normaliser used as a value);
- ``elements``: 1/N of each of the N factors; ``scatter``: 1/N of each of the N factors of an output;
- ``division``: the divisor constant (Prop. 3.4); ``statistic``: the decomposition, the square by the identity rule;
- ``softmax``, ``log_softmax``, ``logsumexp``: the plain gradient where they form a softmax (Prop. 3.1);
- ``attention``: query and key 1/4, value 1/2; ``normalisation``: the identity rule on ``x / g(x)``;
- ``decomposed``: equal to the operations it consists of, written out; ``exp``: a logit bias 1/2 (the scores'
  share), refused elsewhere; ``refused``: refused with its reason.

Every declared operation has a case here or a stated reason why none applies (:py:data:`NO_CASE`), and every operation
the zoo walk meets on relevance-carrying tensors is declared (``test_the_zoo_meets_only_declared_operations``).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.by_hand import attributed, by_hand, identity, scaled
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.core import UnsupportedModelError
from zennit_attn.operations import OPERATIONS
from zennit_attn.operations.decompositions import DECOMPOSED, STATISTICS
from zennit_attn.operations.registry import RULES, SHAPES, op_name

HALF = 0.5


class Projected(torch.nn.Module):
    """``function(h, g)`` of two bias-free projections ``h = a(x)`` and ``g = b(x)`` of the ``[3, 4]`` input."""

    def __init__(self, function):
        super().__init__()
        self.function = function
        self.a, self.b = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)

    def forward(self, x):
        return self.function(self.a(x), self.b(x))


def x() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(3, 4, dtype=torch.float64) + 0.1


def v(h):
    """A view of ``h`` as the plain gradient passes it (for cases whose output is not a float tensor of ``h``)."""
    return h


# ---------------------------------------------------------------------------------------------------- plain cases
INDEX = torch.tensor([[0, 2], [1, 3], [3, 0]])
MASK = torch.tensor([[True, False, True, False]] * 3)
PLAIN = {
    # view
    'view': lambda h, g: h.view(12),
    'view_as': lambda h, g: h.view_as(g),
    'reshape': lambda h, g: h.reshape(2, 6),
    'reshape_as': lambda h, g: h.reshape_as(g),
    'flatten': lambda h, g: h.flatten(),
    'unflatten': lambda h, g: h.unflatten(1, (2, 2)),
    'squeeze': lambda h, g: h[None].squeeze(0),
    'unsqueeze': lambda h, g: h.unsqueeze(0),
    'permute': lambda h, g: h.permute(1, 0),
    'transpose': lambda h, g: h.transpose(0, 1),
    'movedim': lambda h, g: h.movedim(0, 1),
    't': lambda h, g: h.t(),
    'contiguous': lambda h, g: h.t().contiguous(),
    'clone': lambda h, g: h.clone(),
    'expand': lambda h, g: h[:, None].expand(3, 2, 4),
    'expand_as': lambda h, g: h[:1].expand_as(g),
    'broadcast_to': lambda h, g: torch.broadcast_to(h[:1], (3, 4)),
    'broadcast_tensors': lambda h, g: torch.broadcast_tensors(h[:1], g)[0],
    'to': lambda h, g: h.to(torch.float32).to(torch.float64),
    'type': lambda h, g: h.type(torch.float32).type(torch.float64),
    'type_as': lambda h, g: h.float().type_as(g),
    'float': lambda h, g: h.float().double(),
    'double': lambda h, g: h.float().double(),
    'half': lambda h, g: h.half().double() + 0 * h,
    'bfloat16': lambda h, g: h.bfloat16().double() + 0 * h,
    'cpu': lambda h, g: h.cpu(),
    'as_strided': lambda h, g: h.as_strided((2, 2), (4, 1)),
    'unsqueeze_copy': lambda h, g: torch.unsqueeze_copy(h, 0),
    'expand_copy': lambda h, g: torch.expand_copy(h[:1], (3, 4)),
    'view_copy': lambda h, g: torch.view_copy(h, (12,)),
    'permute_copy': lambda h, g: torch.permute_copy(h, (1, 0)),
    'transpose_copy': lambda h, g: torch.transpose_copy(h, 0, 1),
    'squeeze_copy': lambda h, g: torch.squeeze_copy(h[None], 0),
    'real': lambda h, g: torch.complex(h, g).real,
    'imag': lambda h, g: torch.complex(g, h).imag,
    'conj': lambda h, g: torch.complex(h, g).conj().real,
    'resolve_conj': lambda h, g: torch.complex(h, g).conj().resolve_conj().real,
    'resolve_neg': lambda h, g: torch.complex(h, g).conj().imag.resolve_neg(),
    'view_as_complex': lambda h, g: torch.view_as_complex(h.reshape(3, 2, 2)).real,
    'view_as_real': lambda h, g: torch.view_as_real(torch.complex(h, g))[..., 0],
    'pixel_shuffle': lambda h, g: F.pixel_shuffle(h.reshape(1, 4, 3, 1), 2),
    'pixel_unshuffle': lambda h, g: F.pixel_unshuffle(h.reshape(1, 1, 2, 6), 2),
    'unfold': lambda h, g: h.unfold(1, 2, 1),
    # selection
    'getitem': lambda h, g: h[1:, ::2],
    'select': lambda h, g: h.select(0, 1),
    'narrow': lambda h, g: h.narrow(1, 1, 2),
    'narrow_copy': lambda h, g: h.narrow_copy(1, 1, 2),
    'index_select': lambda h, g: h.index_select(1, torch.tensor([3, 0])),
    'gather': lambda h, g: h.gather(1, INDEX),
    'take_along_dim': lambda h, g: torch.take_along_dim(h, INDEX, 1),
    'split': lambda h, g: h.split(2, 1)[1],
    'split_with_sizes': lambda h, g: h.split_with_sizes([1, 3], 1)[1],
    'tensor_split': lambda h, g: h.tensor_split(2, 1)[0],
    'hsplit': lambda h, g: h.hsplit(2)[1],
    'vsplit': lambda h, g: h.vsplit([1])[1],
    'chunk': lambda h, g: h.chunk(2, 1)[0],
    'unbind': lambda h, g: h.unbind(1)[2],
    'split_copy': lambda h, g: torch.split_copy(h, 2, 1)[0],
    'slice_copy': lambda h, g: torch.slice_copy(h, 1, 1, 3),
    'select_copy': lambda h, g: torch.select_copy(h, 0, 2),
    'flip': lambda h, g: h.flip(1),
    'fliplr': lambda h, g: h.fliplr(),
    'flipud': lambda h, g: h.flipud(),
    'roll': lambda h, g: h.roll(1, 1),
    'rot90': lambda h, g: h.rot90(1, (0, 1)),
    'repeat': lambda h, g: h.repeat(2, 1),
    'repeat_interleave': lambda h, g: h.repeat_interleave(2, 0),
    'tile': lambda h, g: h.tile(2),
    'diagonal': lambda h, g: h.diagonal(),
    'topk': lambda h, g: h.topk(2, 1).values,
    'sort': lambda h, g: h.sort(1).values,
    'msort': lambda h, g: h.msort(),
    'kthvalue': lambda h, g: h.kthvalue(2, 1).values,
    'max': lambda h, g: h.max(1).values,
    'min': lambda h, g: h.min(1).values,
    'amax': lambda h, g: h.amax(1),
    'amin': lambda h, g: h.amin(1),
    'median': lambda h, g: h.median(1).values,
    'masked_select': lambda h, g: h.masked_select(MASK),
    'maximum': lambda h, g: torch.maximum(h, g),
    'minimum': lambda h, g: torch.minimum(h, g),
    'fmax': lambda h, g: torch.fmax(h, g),
    'fmin': lambda h, g: torch.fmin(h, g),
    'cummax': lambda h, g: h.cummax(1).values,
    'cummin': lambda h, g: h.cummin(1).values,
    'embedding': lambda h, g: F.embedding(torch.tensor([2, 0, 2]), h),
    'max_pool1d': lambda h, g: F.max_pool1d(h[None], 2),
    'max_pool2d': lambda h, g: F.max_pool2d(h[None], 2),
    'max_pool3d': lambda h, g: F.max_pool3d(h[None, None], (1, 2, 2)),
    'adaptive_max_pool1d': lambda h, g: F.adaptive_max_pool1d(h[None], 2),
    'adaptive_max_pool2d': lambda h, g: F.adaptive_max_pool2d(h[None], 2),
    'adaptive_max_pool3d': lambda h, g: F.adaptive_max_pool3d(h[None, None], (1, 2, 2)),
    # join
    'cat': lambda h, g: torch.cat([h, g], 1),
    'stack': lambda h, g: torch.stack([h, g]),
    'hstack': lambda h, g: torch.hstack([h, g]),
    'vstack': lambda h, g: torch.vstack([h, g]),
    'dstack': lambda h, g: torch.dstack([h, g]),
    'complex': lambda h, g: torch.view_as_real(torch.complex(h, g)),
    # shift
    'add': lambda h, g: h + g,
    'sub': lambda h, g: h - g,
    'rsub': lambda h, g: torch.rsub(h, g),
    'neg': lambda h, g: -h,
    'positive': lambda h, g: +h,
    # mask
    'masked_fill': lambda h, g: h.masked_fill(MASK, 0.0),
    'where': lambda h, g: torch.where(MASK, h, g),
    'tril': lambda h, g: h.tril(),
    'triu': lambda h, g: h.triu(),
    'nan_to_num': lambda h, g: torch.nan_to_num(h),
    'index_fill': lambda h, g: h.index_fill(1, torch.tensor([1]), 0.0),
    'zero': lambda h, g: torch.cat([h.clone()[:1].zero_(), h]),
    'fill': lambda h, g: torch.cat([h.clone()[:1].fill_(0.0), h]),
    'pad': lambda h, g: F.pad(h, (1, 1)),
    'constant_pad_nd': lambda h, g: torch.constant_pad_nd(h, (1, 1)),
    # write
    'setitem': lambda h, g: _set(h, g),
    'copy': lambda h, g: torch.zeros(3, 4, dtype=h.dtype).copy_(h),
    'index_put': lambda h, g: h.index_put((torch.tensor([0, 2]),), g[:2]),
    'index_copy': lambda h, g: h.index_copy(0, torch.tensor([1]), g[:1]),
    'index_add': lambda h, g: h.index_add(0, torch.tensor([0, 0, 2]), g),
    'scatter_add': lambda h, g: h.scatter_add(1, INDEX, g[:, :2]),
    'masked_scatter': lambda h, g: h.masked_scatter(MASK, g),
    'diag_embed': lambda h, g: torch.diag_embed(h),
    # reduction
    'sum': lambda h, g: h.sum(1),
    'mean': lambda h, g: h.mean(0),
    'nansum': lambda h, g: h.nansum(1),
    'cumsum': lambda h, g: h.cumsum(1),
    'diff': lambda h, g: h.diff(dim=1),
    'embedding_bag': lambda h, g: F.embedding_bag(torch.tensor([0, 2, 1, 2]), h, torch.tensor([0, 2])),
    'fold': lambda h, g: F.fold(h.reshape(1, 4, 3), (1, 3), (1, 1)),
    'interpolate': lambda h, g: F.interpolate(h[None], scale_factor=2, mode='linear'),
    'upsample': lambda h, g: F.upsample(h[None], scale_factor=2, mode='linear'),
    'avg_pool1d': lambda h, g: F.avg_pool1d(h[None], 2),
    'avg_pool2d': lambda h, g: F.avg_pool2d(h[None], 2),
    'avg_pool3d': lambda h, g: F.avg_pool3d(h[None, None], (1, 2, 2)),
    'adaptive_avg_pool1d': lambda h, g: F.adaptive_avg_pool1d(h[None], 2),
    'adaptive_avg_pool2d': lambda h, g: F.adaptive_avg_pool2d(h[None], 2),
    'adaptive_avg_pool3d': lambda h, g: F.adaptive_avg_pool3d(h[None, None], (1, 2, 2)),
    # dropout (evaluation mode: the identity)
    'dropout': lambda h, g: F.dropout(h, 0.5, training=False),
    'dropout1d': lambda h, g: F.dropout1d(h[None], 0.5, training=False),
    'dropout2d': lambda h, g: F.dropout2d(h[None], 0.5, training=False),
    'dropout3d': lambda h, g: F.dropout3d(h[None, None], 0.5, training=False),
    'alpha_dropout': lambda h, g: F.alpha_dropout(h, 0.5, training=False),
    'feature_alpha_dropout': lambda h, g: F.feature_alpha_dropout(h, 0.5, training=False),
    # constant-valued (no relevance through their outputs): they select or mask a relevance-carrying tensor
    'eq': lambda h, g: h * (h == g).double(),
    'ne': lambda h, g: h * (h != g).double(),
    'lt': lambda h, g: h * (h < g).double(),
    'le': lambda h, g: h * (h <= g).double(),
    'gt': lambda h, g: h * (h > g).double(),
    'ge': lambda h, g: h * (h >= g).double(),
    'equal': lambda h, g: h * float(torch.equal(h, g)) + h,
    'isnan': lambda h, g: h.masked_fill(h.isnan(), 0.0),
    'isinf': lambda h, g: h.masked_fill(h.isinf(), 0.0),
    'isfinite': lambda h, g: torch.where(h.isfinite(), h, 0.0),
    'isclose': lambda h, g: h.masked_fill(torch.isclose(h, g), 0.0),
    'allclose': lambda h, g: h * (2.0 if torch.allclose(h, g) else 1.0),
    'all': lambda h, g: h * float(bool((h > g).all())) + h,
    'any': lambda h, g: h * float(bool((h > g).any())) + h,
    'signbit': lambda h, g: h.masked_fill(h.signbit(), 0.0),
    'count_nonzero': lambda h, g: h * int(h.count_nonzero()),
    'nonzero': lambda h, g: h[tuple(h.gt(0).nonzero().T)],
    'contains': lambda h, g: h * (2.0 if h[0, 0] in h else 1.0),
    'iter': lambda h, g: torch.stack(list(iter(h))),
    'reversed': lambda h, g: torch.stack(list(reversed(h))),
    'new_zeros': lambda h, g: h + h.new_zeros(3, 4),
    'new_ones': lambda h, g: h * h.new_ones(3, 4),
    'new_empty': lambda h, g: h + h.new_empty(3, 4).zero_(),
    'new_full': lambda h, g: h * h.new_full((3, 4), 2.0),
    'new_tensor': lambda h, g: h * h.new_tensor([1.0, 2.0, 3.0, 4.0]),
    'zeros_like': lambda h, g: h + torch.zeros_like(h),
    'ones_like': lambda h, g: h * torch.ones_like(h),
    'empty_like': lambda h, g: h + torch.empty_like(h).zero_(),
    'full_like': lambda h, g: h * torch.full_like(h, 2.0),
    'rand_like': lambda h, g: h * (torch.rand_like(h) >= 0).double(),
    'randn_like': lambda h, g: h * (torch.randn_like(h) * 0 + 1),
    'randint_like': lambda h, g: h * (torch.randint_like(h, 1, 2)),
    'numpy': lambda h, g: h * h.new_tensor(h.detach().numpy()),
    'argsort': lambda h, g: h.gather(1, h.argsort(1)),
    'argmax': lambda h, g: h.gather(1, h.argmax(1, keepdim=True)),
    'argmin': lambda h, g: h.gather(1, h.argmin(1, keepdim=True)),
    'bucketize': lambda h, g: h * torch.bucketize(h, torch.tensor([0.0])).double(),
    'searchsorted': lambda h, g: h * torch.searchsorted(torch.tensor([0.0]), h.contiguous()).double(),
    'histc': lambda h, g: h * torch.histc(h.detach(), 2).sum() / 12,
    'one_hot': lambda h, g: h * F.one_hot(h.argmax(1), 4).double(),
    'logical_and': lambda h, g: h * torch.logical_and(h > 0, g > 0).double(),
    'logical_or': lambda h, g: h * torch.logical_or(h > 0, g > 0).double(),
    'logical_not': lambda h, g: h * torch.logical_not(h > 0).double(),
    'logical_xor': lambda h, g: h * torch.logical_xor(h > 0, g > 0).double(),
    'bitwise_and': lambda h, g: h * ((h > 0) & (g > 0)).double(),
    'bitwise_or': lambda h, g: h * ((h > 0) | (g > 0)).double(),
    'bitwise_not': lambda h, g: h * (~(h > 0)).double(),
}


def _set(h, g):
    out = h.clone()
    out[0] = g[1]
    return out


#: Declared operations without a case of their own, and why.
NO_CASE = {
    'cuda': 'needs a GPU (a view: the same case as cpu)',
    'align_to': 'named tensors (prototype): a view',
    'rename': 'named tensors (prototype): a view',
    'refine_names': 'named tensors (prototype): a view',
    'pin_memory': 'needs an accelerator: the same tensor',
    'share_memory': 'the same tensor (shared memory)',
    'record_stream': 'CUDA streams only',
    'floor_divide': 'torch has no derivative for it (its own error)',
    'split_size': 'not a torch function of today, kept as a name',
    '_softmax': 'the aten name of softmax: the same case',
    '_log_softmax': 'the aten name of log_softmax: the same case',
    'bilinear': 'a product of three (two inputs and a weight): covered by the products of linear and einsum',
    'conv2d': 'as conv1d (the same rule)',
    'conv3d': 'as conv1d (the same rule)',
    'conv_transpose2d': 'as conv_transpose1d (the same rule)',
    'conv_transpose3d': 'as conv_transpose1d (the same rule)',
    'grouped_mm_fallback': "transformers' loop over experts (batched products of tokens and frozen weights)",
    '_grouped_mm': "torch's grouped product of tokens and frozen expert weights "
    '(tests/canonizers/test_operations.py: test_grouped_experts_equal_the_loop)',
    'multi_head_attention_forward': 'tests/operations/test_decompositions.py',
    'special_xlog1py': 'refused as log (the same reason)',
    'istft': 'refused as stft (the same reason)',
}


def attributed_by_hand(function, expected):
    """Relevance at ``x`` of ``Projected(function)`` (AttnLRP) and of the same module with the rule written out by
    hand in ``expected(h, g)`` (plain autograd)."""
    torch.manual_seed(0)
    model = Projected(function).double()
    inputs = x()
    found = attributed(model, AttnLRPEpsilon(), inputs)
    return found, by_hand(lambda xx: expected(model.a(xx), model.b(xx)), inputs)


@pytest.mark.filterwarnings('ignore:dropout2d. Received a 3D input:UserWarning')
@pytest.mark.filterwarnings('ignore:`nn.functional.upsample` is deprecated:UserWarning')
@pytest.mark.parametrize('name', sorted(PLAIN))
def test_plain_operations_pass_the_plain_gradient(name):
    assert OPERATIONS[name].rule == 'plain', name
    found, expected = attributed_by_hand(PLAIN[name], PLAIN[name])
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


# -------------------------------------------------------------------------------------------------- products
W = torch.linspace(-1, 1, 16, dtype=torch.float64).reshape(4, 4)
PRODUCTS = {
    'matmul': lambda h, g: h @ g.T,
    'mm': lambda h, g: torch.mm(h, g.T),
    'bmm': lambda h, g: torch.bmm(h[None], g.T[None]),
    'einsum': lambda h, g: torch.einsum('ij,kj->ik', h, g),
    'tensordot': lambda h, g: torch.tensordot(h, g, ([1], [1])),
    'inner': lambda h, g: torch.inner(h, g),
    'dot': lambda h, g: torch.dot(h[0], g[1]).reshape(1),
    'vdot': lambda h, g: torch.vdot(h[0], g[1]).reshape(1),
    'outer': lambda h, g: torch.outer(h[0], g[1]),
    'addmm': lambda h, g: torch.addmm(W[:3, :3], h, g.T),
    'addbmm': lambda h, g: torch.addbmm(W[:3, :3], h[None], g.T[None]),
    'baddbmm': lambda h, g: torch.baddbmm(W[None, :3, :3], h[None], g.T[None]),
    'addmv': lambda h, g: torch.addmv(W[0, :3], h, g[0]),
    'mul': lambda h, g: h * g,
    'linear': lambda h, g: F.linear(h, g),
    'conv1d': lambda h, g: F.conv1d(h.T[None], g[:, :, None]),
    'conv_transpose1d': lambda h, g: F.conv_transpose1d(h[None], g[:, :, None]),
    'addcmul': lambda h, g: torch.addcmul(W[:3], h, g),
    'kron': lambda h, g: torch.kron(h[:2, :2], g[:2, :2]),
}


def halves(function):
    return lambda h, g: function(scaled(h, HALF), scaled(g, HALF))


@pytest.mark.parametrize('name', sorted(PRODUCTS))
def test_products_share_uniformly(name):
    """Two relevance-carrying factors: 1/2 each (an additive term keeps its plain gradient)."""
    assert OPERATIONS[name].rule == 'product', name
    found, expected = attributed_by_hand(PRODUCTS[name], halves(PRODUCTS[name]))
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------- element-wise
POSITIVE = {'rsqrt', 'sqrt', 'reciprocal', 'reciprocal_scaled', 'pow'}
ELEMENTWISE = {
    'tanh': torch.tanh,
    'sigmoid': torch.sigmoid,
    'log_sigmoid': F.logsigmoid,
    'silu': F.silu,
    'gelu': F.gelu,
    'relu': torch.relu,
    'relu6': F.relu6,
    'leaky_relu': F.leaky_relu,
    'elu': F.elu,
    'selu': F.selu,
    'celu': F.celu,
    'softplus': F.softplus,
    'mish': F.mish,
    'hardswish': F.hardswish,
    'hardsigmoid': F.hardsigmoid,
    'erf': torch.erf,
    'erfc': torch.erfc,
    'special_erfc': torch.special.erfc,
    'special_ndtr': torch.special.ndtr,
    'abs': torch.abs,
    'square': torch.square,
    'sign': torch.sign,
    'softsign': F.softsign,
    'softshrink': F.softshrink,
    'hardshrink': F.hardshrink,
    'tanhshrink': F.tanhshrink,
    'rrelu': lambda h: F.rrelu(h, training=False),
    'prelu': lambda h: F.prelu(h, torch.tensor([0.25], dtype=h.dtype)),
    'threshold': lambda h: F.threshold(h, 0.1, -2.0),
    'clamp': lambda h: h.clamp(-0.3, 0.3),
    'clamp_min': lambda h: h.clamp_min(0.1),
    'clamp_max': lambda h: h.clamp_max(0.1),
    'hardtanh': lambda h: F.hardtanh(h, -0.3, 0.3),
    'round': lambda h: (3 * h).round(),
    'floor': lambda h: (3 * h).floor(),
    'ceil': lambda h: (3 * h).ceil(),
    'trunc': lambda h: (3 * h).trunc(),
    'frac': lambda h: (3 * h).frac(),
    'remainder': lambda h: h % 0.3,
    'fmod': lambda h: torch.fmod(h, 0.3),
    'rsqrt': torch.rsqrt,
    'sqrt': torch.sqrt,
    'reciprocal': torch.reciprocal,
    'reciprocal_scaled': lambda h: 2 / h,
    'pow': lambda h: h**0.5,
}


@pytest.mark.parametrize('name', sorted(ELEMENTWISE))
def test_elementwise_functions_get_the_identity_rule(name):
    """The identity rule ``f(x) / x`` from the function's input (Eq. 9); a normaliser used as a value too. The
    functions of positive inputs are applied to ``|h| + 0.5``, a number added to an activation output: part of the
    element-wise function ``f(|h| + 0.5)`` of ``h``, whose identity rule applies from ``h``."""
    assert OPERATIONS[name].rule in ('elementwise', 'bound', 'normaliser', 'power'), name
    function = ELEMENTWISE[name]
    prepare = (lambda h: h.abs() + 0.5) if name in POSITIVE else (lambda h: 0 + h)
    found, expected = attributed_by_hand(
        lambda h, g: function(prepare(h)), lambda h, g: identity(h, function(prepare(h)))
    )
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------ the others
def _statistic(name):
    call = {
        'var': lambda h: h.var(1),
        'var_mean': lambda h: torch.var_mean(h, 1)[0],
        'std': lambda h: h.std(1),
        'std_mean': lambda h: torch.std_mean(h, 1)[0],
        'norm': lambda h: h.norm(dim=1),
        'vector_norm': lambda h: torch.linalg.vector_norm(h, dim=1),
        'linalg_vector_norm': lambda h: torch.linalg.vector_norm(h, 3, dim=1),
        'linalg_norm': lambda h: torch.linalg.norm(h, dim=1),
        'matrix_norm': lambda h: torch.linalg.matrix_norm(h[None]),
        'linalg_matrix_norm': lambda h: torch.linalg.matrix_norm(h[None], 'fro'),
    }[name]
    return call


@pytest.mark.parametrize('name', sorted(name for name, entry in OPERATIONS.items() if entry.rule == 'statistic'))
def test_statistics_used_as_values_are_their_decomposition(name):
    """A variance or norm used as a value (added to a tensor, not normalising it) is its decomposition: the square,
    absolute value and root by the identity rule, the sums plain."""
    function = _statistic(name)
    found, expected = attributed_by_hand(
        lambda h, g: g + function(h)[..., None], lambda h, g: g + _decomposed(name, function, h)[..., None]
    )
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


def _decomposed(name, function, h):
    """The decomposition with the identity rule by hand: ``sqrt(sum(h^2))`` for 2-norms, ``(sum |h|^3)^(1/3)``,
    ``sum((h - mean)^2) / (n - 1)`` for variances and their roots."""
    if name in ('var', 'var_mean', 'std', 'std_mean'):
        centered = h - h.mean(1, keepdim=True)
        variance = identity(centered, centered.square()).sum(1) / 3
        return identity(variance, variance.sqrt()) if name.startswith('std') else variance
    if name == 'linalg_vector_norm':
        cubes = identity(h, h.abs().pow(3)).sum(1)
        return identity(cubes, cubes.pow(1 / 3))
    squares = identity(h, h.square()).sum((-2, -1) if 'matrix' in name else 1)
    if 'matrix' in name:
        squares = squares.reshape(1)
    return identity(squares, squares.sqrt())


def test_prod_shares_by_the_number_of_factors():
    found, expected = attributed_by_hand(lambda h, g: h.prod(1), lambda h, g: scaled(h, 1 / 4).prod(1))
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings('ignore:index_reduce.. is in beta:UserWarning')
@pytest.mark.parametrize('name', ['scatter', 'scatter_reduce', 'index_reduce'])
def test_scatters_that_multiply_share_per_output(name):
    """Two factors per output: 1/2 each; ``scatter`` without a product reduction is a write (plain)."""
    index = torch.tensor([[0, 0, 1, 1]] * 3)
    spelled = {
        'scatter': lambda h, g: torch.zeros(3, 4, dtype=h.dtype).scatter(1, INDEX, h[:, :2]),
        'scatter_reduce': lambda h, g: torch.ones(3, 2, dtype=h.dtype).scatter_reduce(1, index, h, 'prod'),
        'index_reduce': lambda h, g: torch.ones(3, 2, dtype=h.dtype).index_reduce(1, index[0], h, 'prod'),
    }[name]
    if name == 'scatter':
        found, expected = attributed_by_hand(spelled, spelled)
    else:
        found, expected = attributed_by_hand(
            spelled,
            lambda h, g: torch.stack(
                [scaled(h, HALF)[:, 0] * scaled(h, HALF)[:, 1], scaled(h, HALF)[:, 2] * scaled(h, HALF)[:, 3]], 1
            ),
        )
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('name', ['div', 'divide', 'true_divide'])
def test_a_divisor_is_a_constant(name):
    """``a / b`` (also spelled ``divide``, ``true_divide``): ``b`` constant (Prop. 3.4)."""
    function = getattr(torch, name)
    found, expected = attributed_by_hand(
        lambda h, g: function(h, g.abs() + 1), lambda h, g: function(h, g.detach().abs() + 1)
    )
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


#: a unit lower-triangular matrix (the UT transform of a chunked delta rule)
TRIANGLE = torch.eye(4, dtype=torch.float64) + torch.linspace(-1, 1, 16, dtype=torch.float64).reshape(4, 4).tril(-1)
SOLVES = {
    'linalg_solve_triangular': lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
    'linalg_solve': torch.linalg.solve,
}


@pytest.mark.parametrize('name', sorted(SOLVES))
def test_a_solve_is_linear_in_its_right_hand_side(name):
    """``A^-1 B`` with a constant ``A``: the plain gradient (linear in ``B``, which carries relevance); with a
    relevance-carrying ``A`` refused."""
    solve = SOLVES[name]
    assert OPERATIONS[name].rule == 'solve'
    found, expected = attributed_by_hand(lambda h, g: solve(TRIANGLE, h.T).T, lambda h, g: solve(TRIANGLE, h.T).T)
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)
    assert float(found.sum()) == pytest.approx(float(expected.sum()))
    with pytest.raises(UnsupportedModelError, match='linear solve with a relevance-carrying matrix'):
        attributed_by_hand(lambda h, g: solve(TRIANGLE + 0.01 * (g.T @ g).tril(-1), h.T).T, lambda h, g: h)


def test_batch_norm_with_running_statistics_is_affine():
    """``batch_norm`` in evaluation (running statistics): the plain gradient of its affine map per channel; by the
    statistics of the batch, or ``instance_norm``, refused."""
    mean, variance = torch.linspace(-0.5, 0.5, 4, dtype=torch.float64), torch.linspace(0.5, 2, 4, dtype=torch.float64)
    weight = torch.linspace(0.5, 1.5, 4, dtype=torch.float64)

    def normalised(h, g):
        return F.batch_norm(h, mean, variance, weight, None, False)

    found, expected = attributed_by_hand(normalised, normalised)
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)
    assert OPERATIONS['batch_norm'].rule == OPERATIONS['instance_norm'].rule == 'running_norm'
    for refused in (
        lambda h, g: F.batch_norm(h, mean, variance, training=True),
        lambda h, g: F.instance_norm(h[None]).squeeze(0),
    ):
        with pytest.raises(UnsupportedModelError, match='normalisation by the statistics of the batch'):
            attributed_by_hand(refused, lambda h, g: h)


class _PatchEmbedding(torch.nn.Module):
    """A bias-free convolution, a BatchNorm2d with running statistics and the patches as tokens
    (``flatten(2).transpose(1, 2)``, as XCiT's and EfficientFormer's patch embeddings), averaged, then a linear head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 32, 8, 8, bias=False)
        self.norm = torch.nn.BatchNorm2d(32)
        self.head = torch.nn.Linear(32, 1, bias=False)

    def forward(self, x):
        return self.head(self.norm(self.conv(x)).flatten(2).transpose(1, 2).mean(1))


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon], ids=lambda composite: composite.__name__)
def test_batch_norm_of_patches_conserves(composite):
    """torch's CPU backward of ``batch_norm`` with running statistics returns a wrong input gradient for a batch of one
    whose gradient is channels-last with a batch stride other than ``C H W`` (what ``flatten(2).transpose(1, 2)``
    sends back): the engine makes that gradient contiguous, and the relevance of a bias-free patch embedding sums to
    its output's 1 (1e-10; before, 1.948, the plain gradient's error)."""
    model = _PatchEmbedding().double().eval()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    leaf = x.clone().requires_grad_(True)
    with composite().context(model) as modified:
        modified(leaf).sum().backward()
    torch.testing.assert_close(leaf.grad.sum(), torch.tensor(1.0, dtype=torch.float64), rtol=1e-10, atol=0)


def _log_softmax_by_logsumexp(z):
    return z - torch.logsumexp(z, -1, keepdim=True)


SOFTMAXES = {
    'softmax': (lambda h, g: torch.softmax(h @ g.T, -1) @ g, None),
    'log_softmax': (lambda h, g: torch.log_softmax(h @ g.T, -1).exp() @ g, None),
    'logsumexp': (lambda h, g: _log_softmax_by_logsumexp(h @ g.T).exp() @ g, None),
}


@pytest.mark.parametrize('name', sorted(SOFTMAXES))
def test_softmaxes_pass_their_plain_gradient(name):
    """A softmax, however written, between two products: the products share uniformly, the softmax passes its plain
    gradient (Prop. 3.1)."""
    spelled = SOFTMAXES[name][0]
    found, expected = attributed_by_hand(
        spelled,
        lambda h, g: torch.softmax(scaled(h, HALF) @ scaled(g, HALF).T, -1) @ g,
    )
    # the attention output's product: 1/2 to the softmax, 1/2 to g
    found_written, expected_written = attributed_by_hand(
        spelled,
        lambda h, g: scaled(torch.softmax(scaled(h, HALF) @ scaled(g, HALF).T, -1), HALF) @ scaled(g, HALF),
    )
    torch.testing.assert_close(found_written, expected_written, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(found, expected)  # the product rule applies on both sides of the softmax


def test_attention_shares_query_key_and_value():
    found, expected = attributed_by_hand(
        lambda h, g: F.scaled_dot_product_attention(h[None], g[None], h[None])[0],
        lambda h, g: scaled(torch.softmax(scaled(h, 0.25) @ scaled(g, 0.25).T / 2, -1), 1.0) @ scaled(h, HALF),
    )
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('name', ['layer_norm', 'rms_norm', 'normalize'])
def test_normalisations_get_the_identity_rule_on_x_over_g(name):
    function = {
        'layer_norm': lambda h: F.layer_norm(h, (4,)),
        'rms_norm': lambda h: F.rms_norm(h, (4,)),
        'normalize': lambda h: F.normalize(h, dim=1),
    }[name]
    centered = (lambda h: h - h.mean(1, keepdim=True)) if name == 'layer_norm' else (lambda h: h)
    found, expected = attributed_by_hand(
        lambda h, g: function(h), lambda h, g: centered(h) * (function(h) / centered(h)).detach()
    )
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)


DECOMPOSITIONS = {
    'glu': (lambda h, g: F.glu(torch.cat([h, g], 1)), lambda h, g: h * torch.sigmoid(g)),
    'softmin': (lambda h, g: F.softmin(h, 1), lambda h, g: torch.softmax(-h, 1)),
    'lerp': (lambda h, g: torch.lerp(h, g, torch.sigmoid(h)), lambda h, g: h + torch.sigmoid(h) * (g - h)),
    'addcdiv': (lambda h, g: torch.addcdiv(h, g, h.abs() + 1, value=0.5), lambda h, g: h + 0.5 * (g / (h.abs() + 1))),
    'hypot': (lambda h, g: torch.hypot(h, g), lambda h, g: (h.square() + g.square()).sqrt()),
    'cosine_similarity': (
        lambda h, g: F.cosine_similarity(h, g)[:, None] * h,
        lambda h, g: ((h * g).sum(1) / (h.norm(dim=1) * g.norm(dim=1)).clamp_min(1e-8))[:, None] * h,
    ),
    'group_norm': (lambda h, g: F.group_norm(h, 2) * g, lambda h, g: grouped_norm(h, 2) * g),
}


def grouped_norm(h: torch.Tensor, groups: int) -> torch.Tensor:
    """The groups of ``h``'s features centred and divided by their standard deviation, written out."""
    rows = h.reshape(h.shape[0], groups, -1)
    centred = rows - rows.mean(-1, keepdim=True)
    return (centred / torch.sqrt(rows.var(-1, keepdim=True, unbiased=False) + 1e-5)).reshape(h.shape)


@pytest.mark.parametrize('name', sorted(DECOMPOSITIONS))
def test_decomposed_functions_equal_their_operations(name):
    """A composite function gets the relevance of its operations written out (the engine classifies both)."""
    function, spelled = DECOMPOSITIONS[name]
    torch.manual_seed(0)
    model, reference = Projected(function).double(), Projected(spelled).double()
    reference.load_state_dict(model.state_dict())
    inputs = x()
    found = attributed(model, AttnLRPEpsilon(), inputs)
    torch.testing.assert_close(found, attributed(reference, AttnLRPEpsilon(), inputs), rtol=1e-10, atol=1e-12)


def test_exp_as_a_logit_bias_gets_the_scores_share():
    """``exp`` added to attention logits (a dynamic mask): the scores' share, 1/2; as a value: refused."""
    found, expected = attributed_by_hand(
        lambda h, g: torch.softmax(h @ g.T + torch.exp(g[:, :3]), -1) @ g,
        lambda h, g: (
            scaled(
                torch.softmax(scaled(h, HALF) @ scaled(g, HALF).T + identity(g[:, :3], torch.exp(g[:, :3])), -1), HALF
            )
            @ scaled(g, HALF)
        ),
    )
    torch.testing.assert_close(found, expected, rtol=1e-10, atol=1e-12)
    with pytest.raises(UnsupportedModelError, match='exp'):
        attributed_by_hand(lambda h, g: torch.exp(h), lambda h, g: h)


REFUSED_CASES = {
    'expm1': torch.expm1,
    'exp2': torch.exp2,
    'log': lambda h: torch.log(h.abs() + 1),
    'log1p': lambda h: torch.log1p(h.abs()),
    'log2': lambda h: torch.log2(h.abs() + 1),
    'log10': lambda h: torch.log10(h.abs() + 1),
    'xlogy': lambda h: torch.xlogy(h, h.abs() + 1),
    'logaddexp': lambda h: torch.logaddexp(h, h.flip(1)),
    'logaddexp2': lambda h: torch.logaddexp2(h, h.flip(1)),
    'logit': lambda h: torch.logit(torch.sigmoid(h)),
    'sin': torch.sin,
    'cos': torch.cos,
    'tan': torch.tan,
    'asin': lambda h: torch.asin(torch.tanh(h)),
    'acos': lambda h: torch.acos(torch.tanh(h)),
    'atan': torch.atan,
    'atan2': lambda h: torch.atan2(h, h.flip(1)),
    'sinh': torch.sinh,
    'cosh': torch.cosh,
    'asinh': torch.asinh,
    'acosh': lambda h: torch.acosh(h.abs() + 1),
    'atanh': lambda h: torch.atanh(torch.tanh(h) * 0.5),
    'sinc': torch.sinc,
    'cumprod': lambda h: h.cumprod(1),
    'logcumsumexp': lambda h: h.logcumsumexp(1),
    'rpow': lambda h: 2**h,
    'fft_fft': lambda h: torch.fft.fft(h).real,
    'fft_ifft': lambda h: torch.fft.ifft(h).real,
    'fft_rfft': lambda h: torch.fft.rfft(h).real,
    'fft_irfft': lambda h: torch.fft.irfft(h),
    'fft_fft2': lambda h: torch.fft.fft2(h).real,
    'fft_ifft2': lambda h: torch.fft.ifft2(h).real,
    'fft_rfft2': lambda h: torch.fft.rfft2(h).real,
    'fft_irfft2': lambda h: torch.fft.irfft2(h),
    'fft_fftn': lambda h: torch.fft.fftn(h).real,
    'fft_ifftn': lambda h: torch.fft.ifftn(h).real,
    'fft_rfftn': lambda h: torch.fft.rfftn(h).real,
    'fft_irfftn': lambda h: torch.fft.irfftn(h),
    'stft': lambda h: torch.stft(h.flatten(), 4, window=torch.ones(4, dtype=h.dtype), return_complex=True).real,
    'cdist': lambda h: torch.cdist(h, h.flip(0)),
    'pdist': lambda h: F.pdist(h)[None],
    'dist': lambda h: torch.dist(h, h.flip(0))[None],
}


@pytest.mark.parametrize('name', sorted(REFUSED_CASES))
def test_refused_operations_name_their_reason(name):
    function = REFUSED_CASES[name]
    reason = OPERATIONS[name].reason.split(' (')[0].split(',')[0]
    with pytest.raises(UnsupportedModelError, match=f'cannot explain .*{reason}'):
        attributed_by_hand(lambda h, g: function(h), lambda h, g: h)


def test_every_operation_has_a_case_or_a_reason():
    """The registry walked as a whole: every declared operation has a case above (or in the named test) or a stated
    reason why none applies; every rule and shape is one the registry knows; every decomposed and statistic
    operation has its decomposition."""
    cases = (
        set(PLAIN)
        | set(PRODUCTS)
        | set(ELEMENTWISE)
        | set(DECOMPOSITIONS)
        | set(REFUSED_CASES)
        | {'prod', 'scatter', 'scatter_reduce', 'index_reduce', 'div', 'exp', 'softmax'}
        | set(SOLVES)
        | {'batch_norm', 'instance_norm'}
        | {'log_softmax', 'logsumexp', 'scaled_dot_product_attention', 'layer_norm', 'rms_norm', 'normalize'}
        | {name for name, entry in OPERATIONS.items() if entry.rule in ('statistic', 'metadata')}
    )
    missing = sorted(set(OPERATIONS) - cases - set(NO_CASE))
    assert missing == []
    assert sorted(set(NO_CASE) - set(OPERATIONS)) == []  # no reason for an operation that is not declared
    assert {entry.rule for entry in OPERATIONS.values()} <= RULES
    assert {entry.shape for entry in OPERATIONS.values()} - {None} <= SHAPES
    assert {name for name, entry in OPERATIONS.items() if entry.rule == 'decomposed'} == set(DECOMPOSED)
    assert {name for name, entry in OPERATIONS.items() if entry.rule == 'statistic'} == set(STATISTICS)


def test_operations_are_named_by_what_they_compute():
    """Operators, in-place and reflected forms and aliases map to one declared name."""
    assert {
        op_name(function)
        for function in (torch.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.Tensor.mul_, torch.multiply)
    } == {'mul'}
    assert {op_name(function) for function in (torch.cat, torch.concat, torch.concatenate)} == {'cat'}
    assert {op_name(function) for function in (torch.transpose, torch.swapaxes, torch.swapdims)} == {'transpose'}
    assert op_name(F.threshold) == 'threshold' and op_name(torch.clip) == 'clamp'
    assert op_name(torch.Tensor.__rtruediv__) == op_name(torch.Tensor.__rdiv__) == 'reciprocal_scaled'
    assert op_name(torch.Tensor.__rsub__) == 'sub' and op_name(torch.special.expit) == 'sigmoid'
    assert op_name(torch.Tensor.__rpow__) == 'rpow' and math.isclose(HALF, 0.5)


# -------------------------------------------------------------------------------------------------- random operations
#: A dropout module in training mode that a model keeps outside its module tree (``model.eval()`` does not reach it).
LOOSE_DROPOUT = torch.nn.Dropout(0.3)
ACTIVE_DROPOUT = {
    'dropout': lambda h: F.dropout(h, 0.3, training=True),
    'dropout default': lambda h: F.dropout(h),  # p=0.5, training=True by default
    'torch.dropout': lambda h: torch.dropout(h, 0.3, True),
    'torch.dropout train=': lambda h: torch.dropout(h, 0.3, train=True),
    'dropout1d': lambda h: F.dropout1d(h[None], 0.3, training=True)[0],
    'dropout2d': lambda h: F.dropout2d(h[None, None], 0.3, training=True)[0, 0],
    'alpha_dropout': lambda h: F.alpha_dropout(h, 0.3, training=True),
    'feature_alpha_dropout': lambda h: F.feature_alpha_dropout(h[None, None], 0.3, training=True)[0, 0],
    'module outside the module tree': lambda h: LOOSE_DROPOUT(h),
    'sdpa': lambda h: F.scaled_dot_product_attention(h[None], h[None], h[None], dropout_p=0.3)[0],
}


@pytest.mark.parametrize('composite', [AttnLRPEpsilon, CPLRPEpsilon])
@pytest.mark.parametrize('name', sorted(ACTIVE_DROPOUT))
def test_active_dropout_is_refused(name, composite):
    """Dropout that drops (``p > 0`` in training mode, whatever the modules' modes say) makes the explanation that of
    one random draw: another relevance at every call (before: relevance 0.1 to 0.2 apart between two calls of a tiny
    Llama), and a logit that is not the model's. Refused by name; the same operations without dropping pass (the plain
    gradient, ``test_plain_operations_pass_the_plain_gradient``)."""
    function = ACTIVE_DROPOUT[name]
    torch.manual_seed(0)
    model = Projected(lambda h, g: function(h) * 1.0 + g).double()
    with pytest.raises(UnsupportedModelError, match='dropout'):
        attributed(model, composite(), x())


INACTIVE_DROPOUT = {
    'p=0 in training mode': lambda h: F.dropout(h, 0.0, training=True),
    'torch.dropout, evaluation': lambda h: torch.dropout(h, 0.3, False),
    'sdpa without dropout': lambda h: F.scaled_dot_product_attention(h[None], h[None], h[None], dropout_p=0.0)[0],
}


@pytest.mark.parametrize('name', sorted(INACTIVE_DROPOUT))
def test_dropout_that_drops_nothing_passes(name):
    """Dropout with ``p = 0`` or in evaluation mode is the identity: explained as the same function without it."""
    function = INACTIVE_DROPOUT[name]
    without = {'sdpa without dropout': lambda h: F.scaled_dot_product_attention(h[None], h[None], h[None])[0]}
    reference = without.get(name, lambda h: h)
    torch.manual_seed(0)
    found = attributed(Projected(lambda h, g: function(h) + g).double(), CPLRPEpsilon(), x())
    torch.manual_seed(0)
    expected = attributed(Projected(lambda h, g: reference(h) + g).double(), CPLRPEpsilon(), x())
    torch.testing.assert_close(found, expected, rtol=0, atol=0)
