"""The operation registry: every torch operation the engine knows, declared once with its rule.

The classifying mode (:py:mod:`~zennit_attn.engine.canonizers.classifier`) names each torch function a model calls on
tensors that carry relevance (:py:func:`~zennit_attn.engine.canonizers.classifier.op_name`: ``torch.mul``,
``Tensor.__rmul__`` and ``Tensor.mul_`` are all ``'mul'``), looks the name up in :py:data:`OPERATIONS` and applies the
rule declared there. An operation that is not declared is refused by name
(:py:class:`~zennit_attn.engine.errors.UnsupportedModelError`), never passed with its plain gradient by default: a
silent wrong answer is worse than a refusal. This is where an operation is added (docs: *Add an operation*).

Each :py:class:`Operation` has a *rule* (what its backward pass becomes) and, for the linear ones, a *shape* (what it
does to the positions of its input's values), from which the marks of the engine pass through it (a log-softmax, a
logsumexp, an attention logit bias, a normaliser: :py:data:`KEEPS`):

===================  ==================================================================================================
rule                 backward pass (gradient formulation, :py:mod:`zennit_attn.engine.rules`)
===================  ==================================================================================================
``metadata``         nothing computed (sizes, flags, hooks): not even checked
``plain``            linear, structural, selection or constant-valued: the plain gradient (Eq. 8, epsilon -> 0)
``product``          multilinear: the composite's product rule among its relevance-carrying factors (Prop. 3.2,
                     3.3); linear, the plain gradient, where one factor carries relevance
``elements``         the product of the elements of one tensor (``prod``): 1/N each (Prop. 3.2)
``scatter``          a scatter that may multiply (``reduce='prod'``): the product rule per output
``division``         ``a / b``: a relevance-carrying divisor is a constant (Prop. 3.4)
``solve``            ``A^-1 B`` (a linear solve): linear in ``B``, the plain gradient; a relevance-carrying ``A``
                     refused
``elementwise``      element-wise non-linearity: the composite's activation rule (the identity rule, Eq. 9)
``bound``            a bound or rounding (clamp, round, remainder): the activation rule, its output no gate
``normaliser``       an element-wise normaliser ``g(x)`` (``rsqrt``, ``sqrt``, ``1 / x``): the activation rule, and
                     a constant (Prop. 3.4) where it multiplies the tensor it is computed from
``power``            ``x ** p``: the activation rule; a normaliser for ``p < 1``
``statistic``        a variance or norm: its decomposition, a normaliser as above
``exp``              an exponential: only as an additive bias of attention logits (the softmax rule, Prop. 3.1)
``softmax``          the plain gradient, which is the softmax rule (Prop. 3.1)
``log_softmax``      ``log_softmax(z)``: only exponentiated (``exp`` of it is ``softmax(z)``)
``logsumexp``        only as the normaliser of a log-softmax or the mass of an attention sink
``attention``        ``scaled_dot_product_attention``: the product rule on its two products (Props. 3.1, 3.3)
``normalisation``    ``layer_norm``, ``rms_norm``, ``normalize``: the identity rule on ``x / g(x)`` (Prop. 3.4)
``running_norm``     ``batch_norm`` with running statistics (evaluation: convolutional vision towers): an affine map
                     per channel, the plain gradient, its shift a constant; with batch statistics refused
``decomposed``       a composite function, run as the operations it consists of
``refused``          no AttnLRP rule: refused with the reason given
===================  ==================================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    'Operation',
    'OPERATIONS',
    'RULES',
    'SHAPES',
    'KEEPS',
    'NORMALISER_RULES',
    'ADDITIVE',
    'operation',
    'keeps',
    'op_name',
    'in_place',
]

#: The rules an operation may have (see the module's table).
RULES = frozenset(
    'metadata plain product elements scatter division solve elementwise bound normaliser power statistic exp softmax '
    'log_softmax logsumexp attention normalisation running_norm decomposed refused'.split()
)
#: What a linear operation does to the positions of its input's values.
SHAPES = frozenset(
    [
        'view',  # the same values, another shape or dtype (reshape, permute, cast, clone)
        'selection',  # a selection or rearrangement of the values (indexing, top-k, split, flip, repeat, maximum)
        'join',  # values of several tensors side by side (cat, stack)
        'shift',  # a sum of tensors or with constants (add, sub, neg)
        'mask',  # values replaced by constants at some positions (masked_fill, where, tril, nan_to_num)
        'write',  # values written into another tensor (index_put, scatter_add, copy_)
        'reduction',  # sums and means over positions (sum, mean, cumsum, pooling, interpolation)
        'dropout',  # the identity in evaluation mode
        'constant',  # an output that carries no gradient (comparisons, indices, new tensors of a given shape)
    ]
)
#: Which shapes keep each mark of the engine: a log-softmax stays one through views and selections (``exp`` of a
#: selected log-softmax is a selected softmax), a logsumexp through views, selections and constant shifts (a sink's
#: ``logsumexp(z) - s``), a logit bias through everything that moves or masks values until it is added to the logits,
#: a normaliser through element-wise and structural operations on normalisers only.
KEEPS = {
    'log_softmax': frozenset({'view', 'selection'}),
    'logsumexp': frozenset({'view', 'selection', 'shift'}),
    'bias': frozenset({'view', 'selection', 'join', 'shift', 'mask', 'dropout'}),
    'normaliser': frozenset({'view', 'selection', 'shift', 'reduction'}),
}
#: The rules whose outputs stay normalisers where every relevance-carrying input is one (``rsqrt(var + eps)``,
#: ``norm.clamp_min(eps)``, ``2 * rsqrt(v)``), besides the shapes of :py:data:`KEEPS`.
NORMALISER_RULES = frozenset({'product', 'division', 'elementwise', 'bound', 'normaliser', 'power', 'statistic'})
#: Products with an additive term (position, keyword): ``addmm(input, a, b) = input + a @ b``, the bias of ``linear``
#: and of the convolutions; it keeps its plain gradient, only the factors share the product's relevance.
ADDITIVE = {
    **dict.fromkeys(['addmm', 'addbmm', 'baddbmm', 'addmv', 'addcmul'], (0, 'input')),
    **dict.fromkeys(
        ['linear', 'conv1d', 'conv2d', 'conv3d', 'conv_transpose1d', 'conv_transpose2d', 'conv_transpose3d'],
        (2, 'bias'),
    ),
    'bilinear': (3, 'bias'),
    '_grouped_mm': (3, 'bias'),
}


@dataclass(frozen=True)
class Operation:
    """One torch operation the engine knows.

    Attributes
    ----------
    name: str
        The operation's name as :py:func:`~zennit_attn.engine.canonizers.classifier.op_name` gives it.
    rule: str
        What its backward pass becomes (a key of :py:data:`RULES`, see the module's table).
    shape: str or None
        For linear operations, what they do to the positions of the values (:py:data:`SHAPES`).
    contraction: bool
        A product that sums over an index of its factors (matrix products, ``einsum``): a contraction of
        relevance-carrying factors without a softmax among them, used in another product, is linear attention.
    reason: str or None
        For ``refused``: why no rule applies, as the refusal says it.
    """

    name: str
    rule: str
    shape: str | None = None
    contraction: bool = False
    reason: str | None = None

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f'{self.name}: unknown rule {self.rule!r} (known: {sorted(RULES)})')
        if self.shape is not None and self.shape not in SHAPES:
            raise ValueError(f'{self.name}: unknown shape {self.shape!r} (known: {sorted(SHAPES)})')
        if (self.rule == 'refused') != (self.reason is not None):
            raise ValueError(f'{self.name}: a refused operation needs a reason, and only a refused one has one')


#: Every operation the engine knows, by name.
OPERATIONS: dict[str, Operation] = {}


def operation(rule: str, names: str, shape: str | None = None, contraction: bool = False, reason: str | None = None):
    """Declare the operations ``names`` (separated by white space) with ``rule`` (and ``shape``, ``contraction``,
    ``reason``, see :py:class:`Operation`) in :py:data:`OPERATIONS`; each name is declared once."""
    for name in names.split():
        if name in OPERATIONS:
            raise ValueError(f'{name} is declared twice: as {OPERATIONS[name].rule} and as {rule}')
        OPERATIONS[name] = Operation(name, rule, shape, contraction, reason)


#: Reflected operators whose operand order changes what they compute (``c - x``, ``c / x``, ``c ** x``).
_REFLECTED = {'rsub': 'sub', 'rtruediv': 'reciprocal_scaled', 'rdiv': 'reciprocal_scaled', 'rpow': 'rpow'}
#: Operators whose reflected (``__rmul__``) and in-place (``__imul__``) forms compute the same as the plain one.
_SWAPPABLE = frozenset('add sub mul matmul truediv floordiv pow mod and or xor'.split())
#: Other names of the same operation (operators, ``torch.special``, NumPy-style names).
ALIASES = {
    'truediv': 'div',
    'floordiv': 'floor_divide',
    'mod': 'remainder',
    'and': 'logical_and',
    'or': 'logical_or',
    'xor': 'logical_xor',
    'special_expit': 'sigmoid',
    'expit': 'sigmoid',
    'special_erf': 'erf',
    'special_softmax': 'softmax',
    'special_log_softmax': 'log_softmax',
    'special_logsumexp': 'logsumexp',
    'special_round': 'round',
    'absolute': 'abs',
    'negative': 'neg',
    'subtract': 'sub',
    'fix': 'trunc',
    'float_power': 'pow',
    'logsigmoid': 'log_sigmoid',
    'arctan2': 'atan2',
    '_threshold': 'threshold',
    'multiply': 'mul',
    'divide': 'div',
    'true_divide': 'div',
    'concat': 'cat',
    'concatenate': 'cat',
    'swapaxes': 'transpose',
    'swapdims': 'transpose',
    'moveaxis': 'movedim',
    'clip': 'clamp',
}

#: The names :py:func:`op_name` gave, by function (the mode asks for each operation of every forward).
_OP_NAMES: dict = {}


def op_name(func: Callable) -> str:
    """The name under which :py:data:`OPERATIONS` declares ``func``: ``torch.mul``, ``Tensor.__rmul__``,
    ``Tensor.mul_`` and ``torch.multiply`` all give ``'mul'`` (:py:data:`ALIASES`); ``c / x`` gives
    ``'reciprocal_scaled'``, ``c - x`` ``'sub'``."""
    try:
        return _OP_NAMES[func]
    except KeyError:
        name = _OP_NAMES[func] = _name_of(func)
        return name
    except TypeError:  # an unhashable callable
        return _name_of(func)


def in_place(func: Callable, kwargs: dict | None = None) -> bool:
    """Whether ``func`` changes its first argument in place: by its name (``mul_``, ``__imul__``, not ``__mul__``) or
    by its argument ``inplace=True`` (``F.silu(x, inplace=True)``)."""
    name = getattr(func, '__name__', '') or ''
    if name.startswith('__i') and name.endswith('__') and name[3:-2] in _SWAPPABLE:
        return True
    return (name.endswith('_') and not name.startswith('__')) or bool(kwargs and kwargs.get('inplace') is True)


def _name_of(func: Callable) -> str:
    name = getattr(func, '__name__', '') or ''
    if name.startswith('__') and name.endswith('__'):
        name = name[2:-2]
        if name in _REFLECTED:
            return _REFLECTED[name]
        if name[:1] in ('r', 'i') and name[1:] in _SWAPPABLE:
            name = name[1:]
    name = name.rstrip('_') or name
    return ALIASES.get(name, name)


def keeps(mark: str, name: str) -> bool:
    """Whether the operation ``name`` keeps ``mark`` (a key of :py:data:`KEEPS`) on a tensor that has it."""
    entry = OPERATIONS.get(name)
    return entry is not None and entry.shape in KEEPS[mark]


# ------------------------------------------------------------------------------------------------ metadata
operation(
    'metadata',
    """
    get detach numel dim size stride storage_offset data_ptr element_size is_contiguous is_floating_point is_complex
    item tolist bool len format repr hash requires_grad retain_grad register_hook untyped_storage get_device
    """,
)

# ------------------------------------------------------------------------------------------------ plain gradient
operation(
    'plain',
    """
    view view_as reshape reshape_as flatten unflatten squeeze unsqueeze permute transpose movedim t contiguous
    clone expand expand_as broadcast_to broadcast_tensors to type type_as float double half
    bfloat16 cpu cuda as_strided unsqueeze_copy expand_copy view_copy permute_copy transpose_copy squeeze_copy
    real imag conj resolve_conj resolve_neg align_to rename refine_names view_as_complex view_as_real
    pin_memory share_memory record_stream pixel_shuffle pixel_unshuffle unfold
    """,
    shape='view',
)
operation(
    'plain',
    """
    getitem select narrow narrow_copy index_select gather take_along_dim split split_with_sizes tensor_split hsplit
    vsplit chunk unbind split_copy slice_copy select_copy flip fliplr flipud roll rot90 repeat repeat_interleave tile
    diagonal topk sort msort kthvalue max min amax amin median masked_select maximum minimum fmax fmin cummax cummin
    embedding max_pool1d max_pool2d max_pool3d adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d
    """,
    shape='selection',
)
operation('plain', 'cat stack hstack vstack dstack complex', shape='join')
operation('plain', 'add sub rsub neg positive', shape='shift')
operation('plain', 'masked_fill where tril triu nan_to_num index_fill zero fill pad constant_pad_nd', shape='mask')
operation('plain', 'setitem copy index_put index_copy index_add scatter_add masked_scatter diag_embed', shape='write')
operation(
    'plain',
    """
    sum mean nansum cumsum diff embedding_bag fold interpolate upsample avg_pool1d avg_pool2d avg_pool3d
    adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d
    """,
    shape='reduction',
)
operation('plain', 'dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout', shape='dropout')
operation(
    'plain',
    """
    eq ne lt le gt ge equal isnan isinf isfinite isclose allclose all any signbit count_nonzero nonzero contains iter
    reversed new_zeros new_ones new_empty new_full new_tensor zeros_like ones_like empty_like full_like rand_like
    randn_like randint_like numpy argsort argmax argmin bucketize searchsorted histc one_hot logical_and logical_or
    logical_not logical_xor bitwise_and bitwise_or bitwise_not floor_divide split_size
    """,
    shape='constant',
)

# ------------------------------------------------------------------------------------------------ products
operation('product', 'matmul mm bmm einsum tensordot inner dot vdot outer addmm addbmm baddbmm addmv', contraction=True)
operation(
    'product',
    """
    mul linear bilinear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d addcmul kron
    _grouped_mm grouped_mm_fallback
    """,
)
operation('elements', 'prod')
operation('scatter', 'scatter scatter_reduce index_reduce')
operation('division', 'div')
operation('solve', 'linalg_solve_triangular linalg_solve')

# ------------------------------------------------------------------------------------------------ element-wise
operation(
    'elementwise',
    """
    tanh sigmoid log_sigmoid silu gelu relu relu6 leaky_relu elu selu celu softplus mish hardswish hardsigmoid erf
    abs square sign softsign softshrink hardshrink tanhshrink rrelu prelu threshold
    """,
)
operation('bound', 'clamp clamp_min clamp_max hardtanh round floor ceil trunc frac remainder fmod')
operation('normaliser', 'rsqrt sqrt reciprocal reciprocal_scaled')
operation('power', 'pow')
operation(
    'statistic',
    'var var_mean std std_mean norm vector_norm linalg_vector_norm linalg_norm matrix_norm linalg_matrix_norm',
)
operation('exp', 'exp')

# ------------------------------------------------------------------------------------------------ softmax, attention
operation('softmax', 'softmax _softmax')
operation('log_softmax', 'log_softmax _log_softmax')
operation('logsumexp', 'logsumexp')
operation('attention', 'scaled_dot_product_attention')
operation('normalisation', 'layer_norm rms_norm normalize')
operation('running_norm', 'batch_norm instance_norm')
operation('decomposed', 'multi_head_attention_forward glu softmin lerp addcdiv hypot cosine_similarity')

# ------------------------------------------------------------------------------------------------ refused
operation(
    'refused',
    'expm1 exp2 log log1p log2 log10 xlogy logaddexp logaddexp2 logit special_xlog1py',
    reason='an exponential or logarithm of relevance-carrying values (outside attention logits: the decay of a '
    'state-space model, the features of linear attention, a probability), which AttnLRP has no rule for',
)
operation(
    'refused',
    'sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh sinc',
    reason='a periodic or trigonometric function of relevance-carrying values (rotary and sinusoidal positions are '
    'computed from positions, not from them), which AttnLRP has no rule for',
)
operation(
    'refused',
    'cumprod logcumsumexp',
    reason='a cumulative product of relevance-carrying values (a recurrence), which AttnLRP has no rule for',
)
operation(
    'refused',
    'rpow',
    reason='a power with a relevance-carrying exponent (c ** x: an exponential), which AttnLRP has no rule for',
)
operation(
    'refused',
    'fft_fft fft_ifft fft_rfft fft_irfft fft_fft2 fft_ifft2 fft_rfft2 fft_irfft2 fft_fftn fft_ifftn fft_rfftn '
    'fft_irfftn stft istft',
    reason='a Fourier transform (it mixes positions with complex factors: FNet, Hyena), which AttnLRP has no rule for',
)
operation(
    'refused',
    'cdist pdist dist',
    reason='a distance between relevance-carrying tensors (a norm of differences), which AttnLRP has no rule for',
)
