"""The operation registry: every torch operation the engine knows, declared once: its rule, the handler that applies
it, how the engine's marks pass through it.

The classifying mode (:py:mod:`~zennit_attn.operations.classifier`) names each torch function a model calls on
tensors that carry relevance (:py:func:`op_name`: ``torch.mul``, ``Tensor.__rmul__`` and ``Tensor.mul_`` are all
``'mul'``), looks the name up in :py:data:`OPERATIONS` and calls the declared handler with the call
(:py:class:`~zennit_attn.operations.calls.Call`: its arguments bound by name) and the state of the forward
(:py:class:`~zennit_attn.operations.tracking.State`); then the declared marks function marks its outputs
(:py:mod:`~zennit_attn.operations.marks`: gates, softmax logits, log-softmaxes, logsumexps, attention-logit
biases, normalisers, terms of recurrences). An operation that is not declared is refused by name
(:py:class:`~zennit_attn.core.errors.UnsupportedModelError`), never passed with its plain gradient by default: a
silent wrong answer is worse than a refusal. This is where an operation is added (docs: *Add an operation*): one
declaration, :py:func:`operation`.

Each :py:class:`Operation` has a *rule* (:py:data:`RULE_TABLE`: its handler, what its outputs are, which marks of its
inputs it keeps) and, for the linear ones, a *shape* (what it does to the positions of its input's values, which
decides the marks it keeps: :py:data:`SHAPE_KEEPS`):

===================  ==================================================================================================
rule                 backward pass (gradient formulation, :py:mod:`zennit_attn.rules`)
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
``bound``            a bound or rounding (clamp, round, remainder): the activation rule, its output a gate only where
                     its input is one, or where it is a rectifier (``clamp(x, min=0)``: ReLU)
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

The rules of single operations can be replaced per composite (``overrides``, checked by :py:func:`check_overrides`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..rules.products import ProductRule
from .calls import SWAPPABLE, Call, in_place
from .decompositions import DECOMPOSED, STATISTICS
from .elementwise import (
    activated,
    activation_shift,
    bounded,
    decomposed,
    divided,
    division,
    elementwise,
    exponentiated,
    normalisation,
    normalising,
    rectifies_by_sign,
    running_norm,
    shifts_activation,
    statistic,
)
from .marks import ACTIVATED, extremum_of_multiples, passed, produced
from .products import attended, attention, elements, multiplied, note_offset, product, scatter, solve
from .softmax import log_softmax, log_softmaxed, logsumexp, softmax, softmaxed, summed_exponentials
from .tracking import Override, State, refuse_dropout

__all__ = [
    'Rule',
    'Operation',
    'OPERATIONS',
    'RULES',
    'RULE_TABLE',
    'SHAPES',
    'SHAPE_KEEPS',
    'ADDING',
    'MARKS',
    'ALIASES',
    'PROPERTIES',
    'operation',
    'op_name',
    'in_place',
    'check_overrides',
]


@dataclass(frozen=True)
class Rule:
    """A rule of the registry: what the backward pass of its operations becomes and what their outputs are.

    Attributes
    ----------
    name: str
        Its name (see the module's table).
    handler: callable or None
        ``handler(call, state)``: runs the operation with the rule's gradient and returns its output (None for
        ``metadata``, which is not dispatched).
    marks: callable or None
        ``marks(call, output, state)``: marks the outputs (:py:mod:`~zennit_attn.operations.marks`); None:
        nothing.
    keeps: frozenset of str
        The marks of its inputs that its operations keep (:py:data:`MARKS`), besides those of their shape
        (:py:data:`SHAPE_KEEPS`).
    summary: str
        What the engine does, in words (the dry run of the rules, the documentation).
    accepts: str or None
        Which rule object an override of its operations may give besides a function: ``'product'`` (a
        :py:class:`~zennit_attn.rules.products.ProductRule`), ``'activation'`` (an activation rule), None
        (functions only).
    """

    name: str
    handler: Callable | None
    marks: Callable | None
    keeps: frozenset
    summary: str
    accepts: str | None = None


def _refused(call: Call, state: State):
    """An operation the registry refuses, with its reason."""
    state.refuse(call.name, call.entry.reason)


def _plain(call: Call, state: State):
    """The plain gradient (linear, structural, selection and constant-valued operations: Eq. 8 with epsilon -> 0); a
    constant the model adds to, or joins with, relevance-carrying tensors is noted (it absorbs relevance, like a
    bias: :py:meth:`~zennit_attn.operations.tracking.State.note_constant`), except a number added to the output of
    an element-wise non-linearity, which is part of it (:py:func:`~.elementwise.activation_shift`); a tensor offset by
    a number is noted as such (:py:func:`~.products.note_offset`: a product gives that part to its other factor); the
    extremum of a tensor and a multiple of it, and a selection of it by its sign, are an activation's output
    (:py:func:`~.marks.extremum_of_multiples`, :py:func:`~.elementwise.rectifies_by_sign`)."""
    if call.entry.shape == 'dropout':
        _check_dropout(call, state)
    if call.entry.shape == 'shift' and shifts_activation(call, state):
        return activation_shift(call, state)
    if call.entry.shape in ADDING:
        state.note_constant(call.entry.shape, call.args, call.kwargs)
    output = call.func(*call.args, **call.kwargs)
    if extremum_of_multiples(call, state) or (
        state.signs and rectifies_by_sign(call.name, call.args, call.kwargs, call.carrying, state)
    ):  # ``maximum(x, 0.1 x)``, ``where(x > 0, x, 0)``: leaky ReLU and ReLU, gates as their one-call spellings' outputs
        state.marks.set(produced(call, output), ACTIVATED)
    if call.entry.shape == 'shift':
        note_offset(call.func, call.args, call.kwargs, call.carrying, output, state)
    return output


def _check_dropout(call: Call, state: State) -> None:
    """Refuse dropout that drops: a probability ``p > 0`` in training mode (``torch.nn.functional``'s defaults: 0.5
    and True; torch's own functions name the mode ``train``), whatever the modes of the modules are
    (:py:func:`~.tracking.refuse_dropout`). In evaluation mode, or with ``p = 0``, it is the identity: the plain
    gradient."""
    p = call.argument('p', 0.5)
    training = call.argument('training', call.kwargs.get('train', True))
    if training and p:
        refuse_dropout(state, call.name, p)


#: The shapes of linear operations that may add constants to relevance (:py:func:`_plain`).
ADDING = frozenset({'shift', 'join'})


#: The marks of the engine (:py:class:`~zennit_attn.operations.marks.Mark`).
MARKS = frozenset(
    {'gate', 'sink', 'attention', 'contraction', 'log_softmax', 'lse', 'exp_sum', 'bias', 'normaliser', 'term'}
)
_MOVED = frozenset({'gate', 'sink', 'attention', 'term'})  # what any move of values keeps
#: Which marks a linear operation of each shape keeps (a log-softmax stays one through views and selections: ``exp``
#: of a selected log-softmax is a selected softmax; a logsumexp through views, selections and constant shifts, a sink's
#: ``logsumexp(z) - s``; a logit bias through everything that moves or masks values until it is added to the logits;
#: a normaliser through structural operations and sums of normalisers; a contraction through views, selections,
#: masks and sums; a gate through every linear operation of gates; a term of a recurrence through everything).
SHAPE_KEEPS = {
    'view': MARKS,
    'selection': MARKS,
    'join': _MOVED | {'bias'},
    'shift': _MOVED | {'lse', 'bias', 'normaliser'},
    'mask': _MOVED | {'contraction', 'bias'},
    'write': _MOVED,
    'reduction': _MOVED | {'contraction', 'normaliser'},
    'dropout': _MOVED | {'bias'},
    'constant': frozenset({'term'}),
}
#: What a linear operation does to the positions of its input's values.
SHAPES = frozenset(SHAPE_KEEPS)

_FUNCTIONS_OF_TERMS = frozenset({'normaliser', 'term'})
#: The rules of the registry, by name (see the module's table).
RULE_TABLE = {
    rule.name: rule
    for rule in (
        Rule('metadata', None, None, frozenset(), 'nothing computed'),
        Rule('plain', _plain, passed, frozenset(), 'the plain gradient (linear: Eq. 8, epsilon -> 0)'),
        Rule(
            'product',
            product,
            multiplied,
            frozenset({'gate', 'normaliser', 'term'}),
            'the product rule among its relevance-carrying factors (Prop. 3.2, 3.3)',
            'product',
        ),
        Rule(
            'elements',
            elements,
            multiplied,
            frozenset({'gate', 'normaliser', 'term'}),
            'the product rule, 1/N of N factors (Prop. 3.2)',
            'product',
        ),
        Rule('scatter', scatter, multiplied, frozenset({'gate', 'term'}), 'the product rule per output', 'product'),
        Rule(
            'division',
            division,
            divided,
            frozenset({'gate', 'sink', 'attention', 'contraction', 'normaliser', 'term'}),
            'the divisor a constant (Prop. 3.4)',
        ),
        Rule('solve', solve, passed, frozenset({'gate'}), 'linear in its right-hand side: the plain gradient'),
        Rule('elementwise', elementwise, activated, _FUNCTIONS_OF_TERMS, 'the activation rule (Eq. 9)', 'activation'),
        Rule('bound', elementwise, bounded, _FUNCTIONS_OF_TERMS, 'the activation rule (Eq. 9)', 'activation'),
        Rule(
            'normaliser',
            elementwise,
            activated,
            _FUNCTIONS_OF_TERMS,
            'the activation rule (Eq. 9); a constant where it normalises (Prop. 3.4)',
            'activation',
        ),
        Rule(
            'power',
            elementwise,
            activated,
            _FUNCTIONS_OF_TERMS,
            'the activation rule (Eq. 9); below 1 a normaliser',
            'activation',
        ),
        Rule('statistic', statistic, normalising, _FUNCTIONS_OF_TERMS, 'its decomposition; a normaliser'),
        Rule(
            'exp',
            elementwise,
            exponentiated,
            frozenset({'term'}),
            'the activation rule (Eq. 9) of an attention-logit bias; in a sequence mixer a term of its recurrence',
            'activation',
        ),
        Rule('softmax', softmax, softmaxed, frozenset(), 'the softmax rule (Prop. 3.1): its plain gradient'),
        Rule('log_softmax', log_softmax, log_softmaxed, frozenset(), 'a log-softmax: only exponentiated (Prop. 3.1)'),
        Rule(
            'logsumexp',
            logsumexp,
            summed_exponentials,
            frozenset(),
            'only the normaliser of a log-softmax or a sink mass',
        ),
        Rule(
            'attention',
            attention,
            attended,
            frozenset(),
            'the product rule on its two products (Props. 3.1, 3.3)',
            'product',
        ),
        Rule('normalisation', normalisation, passed, frozenset({'gate'}), 'the identity rule on x / g(x) (Prop. 3.4)'),
        Rule(
            'running_norm', running_norm, passed, frozenset({'gate'}), 'an affine map per channel: the plain gradient'
        ),
        Rule('decomposed', decomposed, None, frozenset(), 'its decomposition, each operation with its own rule'),
        Rule('refused', _refused, None, frozenset(), 'refused'),
    )
}
#: The rules an operation may have (see the module's table).
RULES = frozenset(RULE_TABLE)


@dataclass(frozen=True)
class Operation:
    """One torch operation the engine knows.

    Attributes
    ----------
    name: str
        The operation's name as :py:func:`op_name` gives it.
    rule: str
        What its backward pass becomes (a key of :py:data:`RULE_TABLE`, see the module's table).
    handler: callable or None
        The rule's handler, ``handler(call, state)`` (see :py:class:`Rule`).
    marks: callable or None
        What its outputs are, ``marks(call, output, state)`` (see :py:class:`Rule`).
    keeps: frozenset of str
        The marks of its relevance-carrying inputs it keeps (those of its rule and of its shape).
    shape: str or None
        For linear operations, what they do to the positions of the values (:py:data:`SHAPES`).
    contraction: bool
        A product that sums over an index of its factors (matrix products, ``einsum``): a contraction of
        relevance-carrying factors without a softmax among them, used in another product, is linear attention.
    layer: bool
        A product of a layer's input with its weight (``linear``, the convolutions, grouped expert products).
    mixes: bool
        Whether it sums or contracts the values of its inputs over positions (reductions, matrix products, layers, the
        product of the elements of a tensor, a solve): outputs of activations become mixed gates
        (:py:mod:`~zennit_attn.operations.marks`).
    reason: str or None
        For ``refused``: why no rule applies, as the refusal says it.
    params: tuple of str
        The names of its positional parameters, in the order of ``torch.<name>`` (a tensor method's ``self`` first),
        where a handler reads its arguments and the function has no signature of its own
        (:py:func:`~zennit_attn.operations.calls.signature`).
    additive: str or None
        For a product with an additive term (``addmm(input, a, b) = input + a @ b``, the bias of ``linear``): the name
        of that parameter, which keeps its plain gradient (only the factors share the product's relevance).
    decomposition: callable or None
        For ``decomposed`` and ``statistic``: the function made of operations with rules that computes it
        (:py:mod:`~zennit_attn.operations.decompositions`).
    """

    name: str
    rule: str
    handler: Callable | None = None
    marks: Callable | None = None
    keeps: frozenset = frozenset()
    shape: str | None = None
    contraction: bool = False
    layer: bool = False
    mixes: bool = False
    reason: str | None = None
    params: tuple[str, ...] = ()
    additive: str | None = None
    decomposition: Callable | None = None

    @property
    def elementwise_product(self) -> bool:
        """Whether it is a product of its factors element by element (``mul``, ``addcmul``), not a contraction or a
        layer, whose output may have the shape of an input without being a multiple of it."""
        return self.rule == 'product' and not (self.contraction or self.layer)


#: Every operation the engine knows, by name.
OPERATIONS: dict[str, Operation] = {}


def operation(
    rule: str,
    names: str,
    shape: str | None = None,
    contraction: bool = False,
    layer: bool = False,
    reason: str | None = None,
    params: str = '',
    additive: str | None = None,
) -> None:
    """Declare the operations ``names`` (separated by white space) with ``rule`` (a key of :py:data:`RULE_TABLE`) and
    ``shape``, ``contraction``, ``layer``, ``reason``, ``params`` (separated by white space) and ``additive`` (see
    :py:class:`Operation`) in :py:data:`OPERATIONS`; each name is declared once. Its handler, marks and the marks it
    keeps follow from the rule and the shape."""
    if rule not in RULE_TABLE:
        raise ValueError(f'{names.split()[0]}: unknown rule {rule!r} (known: {sorted(RULE_TABLE)})')
    if shape is not None and shape not in SHAPE_KEEPS:
        raise ValueError(f'{names.split()[0]}: unknown shape {shape!r} (known: {sorted(SHAPE_KEEPS)})')
    if (rule == 'refused') != (reason is not None):
        raise ValueError(f'{names.split()[0]}: a refused operation needs a reason, and only a refused one has one')
    kind = RULE_TABLE[rule]
    keeps = kind.keeps | SHAPE_KEEPS.get(shape, frozenset())
    mixes = shape == 'reduction' or contraction or layer or rule in ('elements', 'solve', 'attention')
    if rule == 'product' and not (contraction or layer):  # a rescaling by a constant keeps what a view keeps
        keeps |= {'sink', 'attention', 'contraction'}
    for name in names.split():
        if name in OPERATIONS:
            raise ValueError(f'{name} is declared twice: as {OPERATIONS[name].rule} and as {rule}')
        decomposition = DECOMPOSED.get(name) if rule == 'decomposed' else STATISTICS.get(name)
        OPERATIONS[name] = Operation(
            name,
            rule,
            kind.handler,
            kind.marks,
            frozenset(keeps),
            shape,
            contraction,
            layer,
            mixes,
            reason,
            tuple(params.split()),
            additive,
            decomposition if rule in ('decomposed', 'statistic') else None,
        )


#: Reflected operators whose operand order changes what they compute (``c - x``, ``c / x``, ``c ** x``).
_REFLECTED = {'rsub': 'sub', 'rtruediv': 'reciprocal_scaled', 'rdiv': 'reciprocal_scaled', 'rpow': 'rpow'}
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


#: Properties of tensors that compute a tensor (read through ``__get__``), by the operation they are; every other
#: property (``shape``, ``grad_fn``, ``data``, ...) is ``get``, metadata.
PROPERTIES = {'T': 't', 'mT': 'transpose', 'H': 't', 'mH': 'transpose', 'real': 'real', 'imag': 'imag'}


def _name_of(func: Callable) -> str:
    name = getattr(func, '__name__', '') or ''
    if name == '__get__':  # a property of tensors
        return PROPERTIES.get(getattr(getattr(func, '__self__', None), '__name__', ''), 'get')
    if name.startswith('__') and name.endswith('__'):
        name = name[2:-2]
        if name in _REFLECTED:
            return _REFLECTED[name]
        if name[:1] in ('r', 'i') and name[1:] in SWAPPABLE:
            name = name[1:]
    name = name.rstrip('_') or name
    return ALIASES.get(name, name)


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
operation('plain', 'cat stack hstack vstack dstack', shape='join', params='tensors dim')
operation('plain', 'complex', shape='join', params='real imag')
operation('plain', 'add sub rsub', shape='shift', params='input other alpha')
operation('plain', 'neg positive', shape='shift', params='input')
operation('plain', 'masked_fill where tril triu nan_to_num index_fill zero fill pad constant_pad_nd', shape='mask')
operation('plain', 'setitem copy index_put index_copy index_add scatter_add masked_scatter diag_embed', shape='write')
operation('plain', 'sum', shape='reduction', params='input dim keepdim')
operation(
    'plain',
    """
    mean nansum cumsum diff embedding_bag fold interpolate upsample avg_pool1d avg_pool2d avg_pool3d
    adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d
    """,
    shape='reduction',
)
operation(
    'plain',
    'dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout',
    shape='dropout',
    params='input p training',
)
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
operation('product', 'matmul mm bmm einsum tensordot inner dot vdot outer', contraction=True)
operation('product', 'addmm', contraction=True, params='input mat1 mat2', additive='input')
operation('product', 'addbmm baddbmm', contraction=True, params='input batch1 batch2', additive='input')
operation('product', 'addmv', contraction=True, params='input mat vec', additive='input')
operation('product', 'mul kron', params='input other')
operation('product', 'addcmul', params='input tensor1 tensor2', additive='input')
operation(
    'product',
    'linear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d',
    layer=True,
    params='input weight bias',
    additive='bias',
)
operation('product', 'bilinear', layer=True, params='input1 input2 weight bias', additive='bias')
operation('product', '_grouped_mm', layer=True, params='mat_a mat_b offs bias', additive='bias')
operation('product', 'grouped_mm_fallback', layer=True)
operation('elements', 'prod', params='input dim keepdim')
operation('scatter', 'scatter scatter_reduce', params='input dim index src reduce include_self')
operation('scatter', 'index_reduce', params='input dim index source reduce include_self')
operation('division', 'div', params='input other')
operation('solve', 'linalg_solve_triangular linalg_solve', params='A B')

# ------------------------------------------------------------------------------------------------ element-wise
operation(
    'elementwise',
    """
    tanh sigmoid log_sigmoid silu gelu relu relu6 leaky_relu elu selu celu softplus mish hardswish hardsigmoid erf erfc
    special_erfc special_ndtr
    abs square sign softsign softshrink hardshrink tanhshrink rrelu prelu threshold hardtanh
    """,
)
operation('bound', 'clamp clamp_min', params='input min max')
operation('bound', 'clamp_max', params='input max')
operation('bound', 'round floor ceil trunc frac remainder fmod')
operation('normaliser', 'rsqrt sqrt reciprocal reciprocal_scaled')
operation('power', 'pow', params='input exponent')
operation(
    'statistic',
    'var var_mean std std_mean norm vector_norm linalg_vector_norm linalg_norm matrix_norm linalg_matrix_norm',
)
operation('exp', 'exp')

# ------------------------------------------------------------------------------------------------ softmax, attention
operation('softmax', 'softmax _softmax', params='input dim')
operation('log_softmax', 'log_softmax _log_softmax', params='input dim')
operation('logsumexp', 'logsumexp', params='input dim keepdim')
operation(
    'attention',
    'scaled_dot_product_attention',
    params='query key value attn_mask dropout_p is_causal scale enable_gqa',
)
operation('normalisation', 'layer_norm', params='input normalized_shape weight bias eps')
operation('normalisation', 'rms_norm', params='input normalized_shape weight eps')
operation('normalisation', 'normalize', params='input p dim eps')
operation('running_norm', 'batch_norm', params='input weight bias running_mean running_var training momentum eps')
operation(
    'running_norm', 'instance_norm', params='input weight bias running_mean running_var use_input_stats momentum eps'
)
operation('decomposed', 'multi_head_attention_forward glu softmin lerp addcdiv hypot cosine_similarity group_norm')

# ------------------------------------------------------------------------------------------------ refused
operation(
    'refused',
    'expm1 exp2 log log1p log2 log10 xlogy logaddexp logaddexp2 logit special_xlog1py',
    reason='an exponential or logarithm of relevance-carrying values (outside attention logits: the decay of a '
    'state-space model, the features of linear attention, a probability), which AttnLRP has no rule for; an '
    'activation written with one (ELU with expm1, softplus as log1p(exp(x)) or logaddexp(x, 0)) gets its rule when '
    'called as its torch function (F.elu, F.softplus)',
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


def check_overrides(overrides: Mapping | None) -> dict[str, Override]:
    """The rules of single operations that a composite gives instead of the engine's, checked against the registry.

    Parameters
    ----------
    overrides: mapping of str to rule, optional
        Operation name (as :py:func:`op_name` gives it, or an alias: ``'multiply'`` is ``'mul'``) -> its rule: a
        :py:class:`~zennit_attn.rules.products.ProductRule` for a product (rules ``product``, ``elements``,
        ``scatter``, ``attention``: how the product shares its relevance among its relevance-carrying factors), an
        activation rule for an element-wise function (rules ``elementwise``, ``bound``, ``normaliser``, ``power``,
        ``exp``: an object, or a class of objects, with ``elementwise(input, output, gate)`` returning ``output`` with
        the rule's gradient, e.g. :py:class:`~zennit_attn.rules.gradient.Identity`), or for any operation a
        function ``function(func, args, kwargs)`` that returns the operation's output ``func(*args, **kwargs)``
        computed with the gradient of the rule (e.g. with
        :py:func:`~zennit_attn.rules.base.scaled_gradient` or
        :py:func:`~zennit_attn.rules.base.gradient_map`); the relevance-carrying tensors among ``args`` and
        ``kwargs`` are those that require gradients.

    Returns
    -------
    dict of str to Override

    Raises
    ------
    ValueError
        For an operation the registry does not know (naming the known ones), or a rule object that does not fit the
        operation (a product rule for an element-wise function).
    TypeError
        For a rule that is neither a product rule, an activation rule nor a callable.
    """
    checked = {}
    for key, rule in dict(overrides or {}).items():
        if isinstance(rule, Override):  # checked before
            checked[rule.name] = rule
            continue
        name = ALIASES.get(key, key) if isinstance(key, str) else None
        entry = OPERATIONS.get(name)
        if entry is None or entry.rule == 'metadata':
            known = ', '.join(sorted(name for name, entry in OPERATIONS.items() if entry.rule != 'metadata'))
            raise ValueError(f'overrides: {key!r} is not an operation of the registry; known operations: {known}')
        checked[name] = _override(name, entry, rule)
    return checked


def _override(name: str, entry: Operation, rule) -> Override:
    accepts = RULE_TABLE[entry.rule].accepts
    if isinstance(rule, ProductRule) or (isinstance(rule, type) and issubclass(rule, ProductRule)):
        if accepts != 'product':
            raise ValueError(
                f'overrides: {name} is not a product (rule {entry.rule!r}); a ProductRule applies to products: give '
                f'{_fitting(accepts)} or a function'
            )
        return Override(name, product_rule=rule() if isinstance(rule, type) else rule)
    if hasattr(rule, 'elementwise'):
        if accepts != 'activation':
            raise ValueError(
                f'overrides: {name} is not an element-wise function (rule {entry.rule!r}); an activation rule applies '
                f'to element-wise functions: give {_fitting(accepts)} or a function'
            )
        return Override(name, activation_rule=rule() if isinstance(rule, type) else rule)
    if callable(rule):
        return Override(name, function=rule)
    raise TypeError(
        f'overrides: the rule of {name} must be {_fitting(accepts)} or a function function(func, args, kwargs), got '
        f'{rule!r}'
    )


def _fitting(accepts: str | None) -> str:
    return {
        'product': 'a ProductRule (Uniform(), ConstantGates(), ...)',
        'activation': 'an activation rule (an object with elementwise(input, output, gate), e.g. Identity())',
    }.get(accepts, 'no rule object')
