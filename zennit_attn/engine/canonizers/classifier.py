"""The classifying mode of the general mechanism: the rule of every torch operation a model performs on tensors that
carry relevance (the table is in :py:mod:`~zennit_attn.engine.canonizers.general`).

:py:class:`Classifier` is a :py:class:`torch.overrides.TorchFunctionMode` that
:py:class:`~zennit_attn.engine.canonizers.general.GeneralCanonizer` enters for the time of a model's forward: it names each
operation (:py:func:`op_name`), looks it up in the sets of operations below and applies the rule in the gradient
formulation, or refuses the operation through the canonizer.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from ..rules import elementwise_identity, layer_norm_identity, scaled_gradient
from .decompositions import DECOMPOSED, STATISTICS
from .graph import (
    ExpLogSoftmax,
    LogSoftmaxMark,
    LogSumExpMark,
    SinkMass,
    SoftmaxInput,
    attention_scores,
    gate_kind,
    is_gate,
    is_log_softmax,
    is_outer_product,
    log_softmax_scores,
    lse_scores,
    normalises,
    reaches,
    scores_node,
    sink_scores,
)
from .tracking import tensors_of

names = str.split
#: Linear, structural and selection operations, and operations whose outputs carry no gradient: plain gradient.
FREE = frozenset(
    names("""
    add sub rsub neg positive cat concat concatenate stack hstack vstack dstack view view_as reshape reshape_as flatten
    unflatten squeeze unsqueeze permute transpose swapaxes swapdims movedim moveaxis t contiguous clone expand
    expand_as broadcast_to broadcast_tensors repeat repeat_interleave tile narrow narrow_copy select index_select
    gather take_along_dim getitem setitem split split_with_sizes tensor_split hsplit vsplit chunk unbind flip fliplr
    flipud roll rot90 tril triu diagonal diag_embed masked_fill where sum mean nansum cumsum to type type_as float
    double half bfloat16 cpu cuda detach dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout pad
    constant_pad_nd interpolate upsample avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d
    adaptive_avg_pool3d pixel_shuffle pixel_unshuffle unfold fold as_strided index_put index_add index_copy index_fill
    scatter_add masked_scatter masked_select copy zero fill max min amax amin topk sort kthvalue
    maximum minimum fmax fmin msort argsort argmax argmin eq ne lt le gt ge equal isnan isinf isfinite isclose allclose
    all any signbit count_nonzero nonzero contains iter reversed new_zeros new_ones new_empty new_full new_tensor
    zeros_like ones_like empty_like full_like rand_like randn_like randint_like numpy pin_memory share_memory
    record_stream split_size unsqueeze_copy expand_copy view_copy permute_copy transpose_copy squeeze_copy slice_copy
    select_copy flatten_copy chunk_copy real imag conj resolve_conj resolve_neg align_to rename refine_names embedding
    embedding_bag one_hot diff bucketize searchsorted histc cummax cummin logical_and logical_or logical_not
    logical_xor bitwise_and bitwise_or bitwise_not floor_divide view_as_complex view_as_real complex nan_to_num
""")
)
#: Operations that read metadata, detach or register hooks: nothing to check (they run in the rules' hooks too).
METADATA = frozenset(
    names("""
    get detach numel dim size stride storage_offset data_ptr element_size is_contiguous is_floating_point is_complex
    item tolist bool len format repr hash requires_grad retain_grad register_hook untyped_storage
""")
)
#: Multilinear operations: linear when one operand carries relevance, a product (uniform rule) when several do.
PRODUCTS = frozenset(
    names("""
    mul multiply matmul mm bmm einsum linear bilinear conv1d conv2d conv3d conv_transpose1d conv_transpose2d
    conv_transpose3d addmm addbmm baddbmm addmv addcmul outer inner dot vdot tensordot kron prod _grouped_mm
    grouped_mm_fallback
""")
)
#: Element-wise non-linearities: identity rule (Eq. 9).
ACTIVATIONS = frozenset(
    names("""
    tanh sigmoid log_sigmoid silu gelu relu relu6 leaky_relu elu selu celu softplus mish hardswish hardtanh hardsigmoid
    erf clamp clamp_min clamp_max clip abs threshold square sign round floor ceil trunc frac remainder fmod softsign
    softshrink hardshrink tanhshrink rrelu prelu
""")
)
#: Bounds and roundings among them: a clamped or rounded value is not a gate (a gate only where its input is one).
BOUNDS = frozenset(names('clamp clamp_min clamp_max clip hardtanh round floor ceil trunc frac remainder fmod'))
#: Element-wise computations of a normaliser ``g(x)`` (Prop. 3.4), with powers below 1 and ``c / x``: constants where
#: they normalise ``x`` (a divisor, or a factor of ``x``), element-wise non-linearities elsewhere (the identity rule).
#: Statistics (variances, norms: :py:data:`~zennit_attn.engine.canonizers.decompositions.STATISTICS`) are the same where
#: they normalise, their decomposition elsewhere.
NORMALISERS = frozenset(names('rsqrt sqrt reciprocal reciprocal_scaled'))
#: Operations whose output is a normaliser where every relevance-carrying input is one (``rsqrt(var + eps)``,
#: ``norm.clamp_min(eps)``, casts and views): element-wise and structural operations, not linear maps of weights.
NORMALISER_PASS = (
    (frozenset(names('mul multiply pow div divide true_divide')) | NORMALISERS) | frozenset(STATISTICS)
) | frozenset(
    names(
        'add sub neg view view_as reshape reshape_as flatten '
        'unflatten squeeze unsqueeze permute transpose t '
        'contiguous clone expand expand_as broadcast_to to '
        'type type_as float double half bfloat16 getitem '
        'select narrow clamp clamp_min clamp_max clip maximum '
        'minimum fmax fmin max min amax amin abs sum mean '
        'square'
    )
)
#: Scatters that reduce by a product (``reduce='prod'``, ``'multiply'``): the uniform rule (Prop. 3.2) per output.
SCATTERS = frozenset(names('scatter scatter_reduce index_reduce'))
#: Matrix products of factors (contractions), as opposed to element-wise products.
CONTRACTIONS = frozenset(names('matmul mm bmm einsum tensordot inner dot vdot outer'))
DIVISIONS = frozenset(names('div divide true_divide'))
#: Products with an additive term (position, keyword): ``addmm(input, a, b) = input + a @ b``, the bias of ``linear``
#: and of the convolutions; it keeps its plain gradient, only the factors share the product's.
ADDITIVE = {
    **dict.fromkeys(names('addmm addbmm baddbmm addmv addcmul'), (0, 'input')),
    **dict.fromkeys(
        names('linear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d'), (2, 'bias')
    ),
    'bilinear': (3, 'bias'),
    '_grouped_mm': (3, 'bias'),
}
SOFTMAX = frozenset(names('softmax _softmax'))
LOG_SOFTMAX = frozenset(names('log_softmax _log_softmax'))
#: Operations that keep a log-softmax one (casts, views, selections): its ``exp`` is still a softmax.
_LOG_SOFTMAX_VIEWS = frozenset(
    names(
        'to type type_as float double half bfloat16 view view_as reshape reshape_as '
        'flatten unflatten squeeze unsqueeze expand expand_as contiguous clone getitem '
        'select narrow index_select gather take_along_dim topk sort transpose permute t '
        'movedim swapaxes split split_with_sizes chunk unbind'
    )
)
#: What keeps ``logsumexp(z)`` a shifted log-normaliser: constants added or subtracted, casts, views, selections.
_LSE_SHIFTS = frozenset(
    names(
        'add sub to type type_as float double view reshape unsqueeze squeeze expand contiguous '
        'clone getitem select narrow'
    )
)


#: Class names of sequence mixers whose products of relevance-carrying tensors are not softmax attention: state-space
#: models, linear attention, recurrences (their products are refused until their rules are defined).
LINEAR_MIXERS = re.compile(
    r'Mamba|SSM|Ssm|Delta|ForgetGate|LinearAttention|Linear_?Attn|Rwkv|RWKV|Retention|Hyena|'
    r'Xlstm|xLSTM|LSTM|GRU|Lightning|Recurrent|Mixer'
)
#: Class names of sequence mixers that are not softmax attention (named in refusals): also gated short convolutions
#: (LFM's, whose products of projections are explained by the uniform rule, Prop. 3.2).
RECURRENT = re.compile(LINEAR_MIXERS.pattern + r'|ShortConv|Lfm2Short')

#: Reflected operators whose operand order changes what they compute (``c - x``, ``c / x``, ``c ** x``).
_REFLECTED = {'rsub': 'sub', 'rtruediv': 'reciprocal_scaled', 'rdiv': 'reciprocal_scaled', 'rpow': 'rpow'}
#: Operators whose reflected (``__rmul__``) and in-place (``__imul__``) forms compute the same as the plain one.
_SWAPPABLE = frozenset(names('add sub mul matmul truediv floordiv pow mod and or xor'))
#: Other names of the same operation (operators, ``torch.special``, NumPy-style names).
_ALIASES = {
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
}

#: The names :py:func:`op_name` gave, by function (the mode asks for each operation of every forward).
_OP_NAMES: dict = {}


def op_name(func: Callable) -> str:
    """``torch.mul``, ``Tensor.__rmul__`` and ``Tensor.mul_`` all give ``'mul'``."""
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
    return _ALIASES.get(name, name)


class Classifier(TorchFunctionMode):
    """The torch function mode of :py:class:`~zennit_attn.engine.canonizers.general.GeneralCanonizer` (see the table of
    :py:mod:`~zennit_attn.engine.canonizers.general`); ``canonizer`` holds what it tracks across the operations of one
    forward and refuses what has no rule."""

    def __init__(self, canonizer):
        super().__init__()
        self.canonizer = canonizer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        canonizer = self.canonizer
        name = op_name(func)
        if name in METADATA:
            return func(*args, **kwargs)
        gradients = torch.is_grad_enabled()
        if gradients and canonizer.opaque:
            return func(*args, **kwargs)
        tensors = tensors_of(args, tensors_of(list(kwargs.values()), []) if kwargs else [])
        if not gradients:
            return canonizer.cut_off(name, args, func(*args, **kwargs), tensors)
        carrying = [tensor for tensor in tensors if tensor.requires_grad]
        if canonizer.cut and canonizer.meets_cut(name, args, kwargs, tensors, carrying, name in DIVISIONS):
            return canonizer.cut_off(name, args, func(*args, **kwargs), tensors)
        if not carrying:
            return func(*args, **kwargs)
        for tensor in carrying:
            canonizer.check_origin(tensor)
        if canonizer.lse and any(log_softmax_scores(tensor) is not None for tensor in carrying):
            return self.log_softmax_use(name, func, args, kwargs, carrying)
        if canonizer.lse and any(lse_scores(tensor) is not None for tensor in carrying):
            return self.sink_mass(name, func, args, kwargs, carrying)
        if canonizer.biases and any(tensor in canonizer.biases for tensor in carrying):
            output = canonizer.bias_use(name, func, args, kwargs, carrying)
            if output is not None:
                return output
        if canonizer.normalisers and any(tensor in canonizer.normalisers for tensor in carrying):
            return self.normaliser_use(name, func, args, kwargs, carrying)
        return self.dispatch(name, func, args, kwargs, carrying)

    def dispatch(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """Apply the rule of the operation ``name`` (``func``) on relevance-carrying tensors (``carrying``)."""
        canonizer = self.canonizer
        if name in {'add', 'sub', 'cat', 'concat', 'concatenate', 'stack'}:
            canonizer.note_constant(name, args, kwargs)
        if name in FREE:
            return func(*args, **kwargs)
        if name in SOFTMAX:
            return self.softmax(func, args, kwargs)
        if name == 'logsumexp':
            canonizer.lse = True
            dim = args[1] if len(args) > 1 else kwargs.get('dim', ())
            dims = [item % carrying[0].dim() for item in ((dim,) if isinstance(dim, int) else dim)]
            return LogSumExpMark.apply(func(*args, **kwargs), scores_node(carrying[0]), dims)
        if name in LOG_SOFTMAX:
            canonizer.lse = True
            return LogSoftmaxMark.apply(self.softmax(func, args, kwargs), scores_node(carrying[0]))
        if name in PRODUCTS:
            return self.product(name, func, args, kwargs, carrying)
        if name in SCATTERS:
            return self.scatter(name, func, args, kwargs, carrying)
        if name in DIVISIONS:
            return self.division(func, args, kwargs)
        if name in ACTIVATIONS or name == 'exp' or name in NORMALISERS or name == 'pow':
            return self.elementwise(name, func, args, kwargs, carrying)
        if name in STATISTICS:
            return self.statistic(name, func, args, kwargs)
        if name == 'scaled_dot_product_attention':
            return self.attention(func, args, kwargs)
        if name in {'layer_norm', 'rms_norm', 'normalize'}:
            return self.norm(name, func, args, kwargs)
        if name in DECOMPOSED:  # composite functions: their arithmetic, with this mode classifying each operation
            try:
                with self:
                    return DECOMPOSED[name](*args, **kwargs)
            except NotImplementedError as error:
                canonizer.refuse(name, f'{error}, which is not softmax attention')
        canonizer.refuse(name)

    def elementwise(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """An element-wise non-linearity of one relevance-carrying tensor: the identity rule (Eq. 9), also where the
        model computes it in place (on a copy, the result copied back); an ``exp`` is a logit bias (see
        :py:mod:`~zennit_attn.engine.canonizers.tracking`); :py:data:`NORMALISERS` and powers below 1 are marked as
        normalisers (see :py:meth:`normaliser_use`)."""
        canonizer = self.canonizer
        if len(carrying) != 1 or not isinstance(args[0], torch.Tensor) or args[0] is not carrying[0]:
            what = (
                'a power with a relevance-carrying exponent'
                if name == 'pow'
                else 'an element-wise non-linearity of more than one relevance-carrying tensor'
            )
            canonizer.refuse(name, what)
        gate = name not in BOUNDS or is_gate(args[0])
        if in_place(func, kwargs):
            if name == 'exp':
                canonizer.refuse(func.__name__, 'an exponential computed in place')
            target, source = args[0], args[0].clone()  # the input's values, kept for the rule
            changed = source.clone()
            func(changed, *args[1:], **kwargs)
            output = target.copy_(canonizer.activation(source, changed, gate))
        else:
            output = canonizer.activation(args[0], func(*args, **kwargs), gate)
        if name == 'exp':
            return canonizer.mark_bias(output)
        if name in NORMALISERS or (name == 'pow' and not self.power_at_least_one(args, kwargs)):
            canonizer.normalisers[output] = name
        return output

    def statistic(self, name: str, func, args, kwargs):
        """A variance, standard deviation or norm (:py:data:`~zennit_attn.engine.canonizers.decompositions.STATISTICS`): its
        decomposition into operations with rules, marked as a normaliser (see :py:meth:`normaliser_use`)."""
        try:
            with self:
                output = STATISTICS[name](*args, **kwargs)
        except NotImplementedError as error:
            self.canonizer.refuse(name, f'{error} of relevance-carrying tensors')
        self.canonizer.normalisers[output[0] if isinstance(output, tuple) else output] = name
        return output

    def normaliser_use(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """An operation on normalisers ``g(x)`` (marked by :py:meth:`elementwise` and :py:meth:`statistic`).

        A function of normalisers alone (:py:data:`NORMALISER_PASS`: ``rsqrt(var + eps)``) is a normaliser too. A
        product of ``x`` with a normaliser computed from ``x`` (:py:func:`~zennit_attn.engine.canonizers.graph.normalises`)
        is a normalisation ``x / g'(x)``: the normaliser is a constant (Prop. 3.4); so is a divisor (see
        :py:meth:`division`). Anywhere else a normaliser is a value, with the rules its operations got (the identity
        rule of ``sqrt``, the decomposition of a variance): ``sqrt(softplus(h))``, ``h + var(h)``."""
        marks = self.canonizer.normalisers
        marked = [tensor for tensor in carrying if tensor in marks]
        if len(marked) == len(carrying):
            output = self.dispatch(name, func, args, kwargs, carrying)
            if name in NORMALISER_PASS:
                for tensor in tensors_of(output if isinstance(output, (list, tuple)) else [output], []):
                    if tensor.requires_grad:
                        marks[tensor] = name
            return output
        if name in PRODUCTS:
            others = [tensor for tensor in carrying if tensor not in marks]
            constants = {
                id(tensor): tensor.detach() for tensor in marked if any(normalises(tensor, other) for other in others)
            }
            if constants:
                args, kwargs = (
                    replaced(args, constants),
                    {key: replaced(value, constants) for key, value in kwargs.items()},
                )
                carrying = [tensor for tensor in carrying if id(tensor) not in constants]
        return self.dispatch(name, func, args, kwargs, carrying)

    @staticmethod
    def softmax(func, args, kwargs):
        """The plain gradient (Prop. 3.1), zero for rows that the softmax turns into NaN (every logit ``-inf``): the
        model replaces their output by a constant (``masked_fill``), so no relevance flows through them."""
        input = args[0] if args else kwargs.pop('input')
        alias = SoftmaxInput.apply(input)
        output = func(alias, *args[1:], **kwargs)
        alias.grad_fn.output = output.detach()
        return output

    def sink_mass(self, name, func, args, kwargs, carrying):
        """``sigmoid(logsumexp(z) - s)`` for a constant sink logit ``s``: the mass of the real columns of the softmax
        of ``z`` extended by ``s``, its plain gradient (Prop. 3.1 on the extended softmax; see
        :py:mod:`~zennit_attn.engine.canonizers.graph`); ``z - logsumexp(z)``: a log-softmax (marked, see
        :py:meth:`log_softmax_use`); any other use of a ``logsumexp`` is refused."""
        reflected = getattr(func, '__name__', '') in {'__rsub__', 'rsub'}
        if (
            name == 'sub'
            and not reflected
            and len(carrying) == 2
            and len(args) > 1
            and kwargs.get('alpha', 1) == 1
            and is_log_softmax(args[0], args[1])
        ):
            return LogSoftmaxMark.apply(func(*args, **kwargs), lse_scores(args[1]))
        if len(carrying) == 1 and name == 'sigmoid':
            return SinkMass.apply(func(*args, **kwargs), lse_scores(carrying[0]))
        if len(carrying) == 1 and not reflected and name in _LSE_SHIFTS and (name != 'sub' or args[0] is carrying[0]):
            return func(*args, **kwargs)
        self.canonizer.refuse(
            f'logsumexp (used by {name})',
            'a logsumexp that is not the mass sigmoid(logsumexp(z) - '
            's) of a softmax extended by a constant sink logit s (an attention sink) nor the '
            'normaliser of a log-softmax z - logsumexp(z)',
        )

    def log_softmax_use(self, name, func, args, kwargs, carrying):
        """A log-softmax of ``z``: casts, views and selections keep it one; its ``exp`` is ``softmax(z)`` (a selection
        of it), marked as a softmax output (:py:class:`~zennit_attn.engine.canonizers.graph.ExpLogSoftmax`) with its plain
        gradient, the softmax rule (Prop. 3.1); any other use is refused."""
        changed = in_place(func, kwargs)
        if len(carrying) == 1 and not changed and name == 'exp' and args and args[0] is carrying[0]:
            return ExpLogSoftmax.apply(func(*args, **kwargs), log_softmax_scores(carrying[0]))
        if len(carrying) == 1 and not changed and name in _LOG_SOFTMAX_VIEWS:
            output = func(*args, **kwargs)
            outputs = tensors_of(output if isinstance(output, (list, tuple)) else [output], [])
            if all(log_softmax_scores(tensor) is not None for tensor in outputs if tensor.requires_grad):
                return output
        self.canonizer.refuse(
            f'log_softmax (used by {name})',
            'a log-softmax z - logsumexp(z) that is not '
            'exponentiated (exp(z - logsumexp(z)) is softmax(z), Prop. 3.1; a log-softmax itself has '
            'no AttnLRP rule)',
        )

    @staticmethod
    def power_at_least_one(args, kwargs) -> bool:
        """Whether the exponent of ``pow`` is at least 1 (everywhere, for a tensor of exponents): below 1 a power
        can be a normaliser (``x ** -0.5``)."""
        exponent = args[1] if len(args) > 1 else kwargs.get('exponent')
        if isinstance(exponent, torch.Tensor):
            return bool((exponent >= 1).all())
        return isinstance(exponent, (int, float)) and exponent >= 1

    def product(self, name, func, args, kwargs, carrying: list[torch.Tensor]):
        if name == 'prod':  # of the elements of one tensor along ``dim`` (all without): each 1/n (Prop. 3.2)
            dim = args[1] if len(args) > 1 else kwargs.get('dim')
            count = carrying[0].numel() if dim is None else carrying[0].shape[dim]
            return scaled_gradient(func(*args, **kwargs), 1.0 / max(count, 1))
        factors = self.factors(name, args, kwargs, carrying)
        if len(factors) < 2:
            return func(*args, **kwargs)
        if in_place(func, kwargs):
            self.canonizer.refuse(func.__name__, 'an in-place product of relevance-carrying tensors')
        contraction = self.refuse_linear_attention(name, factors)
        output = self.product_rule(func, args, kwargs, carrying, factors)
        if contraction:  # recorded before CP-LRP's constants take its factors out of the graph
            self.canonizer.contractions.add(output.grad_fn)
        return output

    def product_rule(self, func, args, kwargs, carrying: list[torch.Tensor], factors: list[torch.Tensor]):
        """The uniform rule (Prop. 3.2) on the relevance-carrying ``factors`` of a product, CP-LRP's constant factors
        (:py:meth:`constant_factors`), an attention sink's mass (:py:meth:`sink_factors`)."""
        sinks = [tensor for tensor in factors if sink_scores(tensor) is not None]
        if sinks:
            scales = self.sink_factors(factors, sinks)
        else:
            constant = self.constant_factors(factors) if self.canonizer.constant_gates else set()
            free = [tensor for tensor in factors if id(tensor) not in constant]
            share = 1.0 / len(free) if len(free) > 1 else 1.0
            if not constant and len(factors) == len(carrying):  # equal shares: scale the output's gradient once
                return scaled_gradient(func(*args, **kwargs), share)
            scales = {id(tensor): 0.0 if id(tensor) in constant else share for tensor in factors}
        scaled = {}

        def swap(value):
            # each distinct tensor scaled once: ``x * x`` gives x the gradient 2 x g / 2, its relevance x^2 g
            if isinstance(value, torch.Tensor) and value.requires_grad:
                if id(value) not in scaled:
                    scaled[id(value)] = scaled_gradient(value, scales.get(id(value), 1.0))
                return scaled[id(value)]
            if isinstance(value, (list, tuple)):
                return type(value)(swap(item) for item in value)
            return value

        return func(*swap(tuple(args)), **{key: swap(value) for key, value in kwargs.items()})

    @staticmethod
    def constant_factors(factors: list[torch.Tensor]) -> set[int]:
        """CP-LRP's constant factors of a product (ids): its gates, where some factor is not one (``silu(g) * up``,
        routing weights times an expert's output); where every factor is a gate, the softmax outputs among
        activation outputs (``softmax(q k^T) @ silu(v)``: an activated value); none where all are of one kind
        (``gelu(a) * silu(b)``, ``relu(x) * relu(x)``): no factor gates the others, the uniform rule (Prop. 3.2)."""
        kinds = {id(tensor): gate_kind(tensor) for tensor in factors}
        gates = {key for key, kind in kinds.items() if kind is not None}
        if len(gates) < len(kinds):
            return gates
        softmaxes = {key for key, kind in kinds.items() if kind == 'softmax'}
        return softmaxes if len(softmaxes) < len(kinds) else set()

    def refuse_linear_attention(self, name: str, factors: list[torch.Tensor]) -> bool:
        """Refuse a product of several relevance-carrying tensors inside a sequence mixer that is not softmax
        attention (by its class name, :py:data:`LINEAR_MIXERS`), and a product with a contraction of relevance-carrying
        tensors none of which is a softmax output (``q (k^T v)``: linear attention): AttnLRP's rules cover softmax
        attention, the rules of these layers are not defined yet. Returns whether the product is such a contraction
        itself (a matrix product or a broadcast outer product of factors none of which is a softmax output), which
        :py:meth:`product` records."""
        canonizer = self.canonizer
        mixer = canonizer.mixer(pattern=LINEAR_MIXERS)
        if mixer is not None:
            canonizer.refuse(
                name,
                f'a product of relevance-carrying tensors inside {mixer}, a sequence mixer that is '
                'not softmax attention',
            )
        if canonizer.contractions and any(reaches(tensor, canonizer.contractions) for tensor in factors):
            canonizer.refuse(
                name,
                'a product with a contraction of relevance-carrying tensors that has no softmax '
                '(q (k^T v): linear attention, not softmax attention)',
                hint='AttnLRP (Achtibat et al. 2024) defines rules for softmax attention; linear attention '
                'and other sequence mixers are not explained yet.',
            )
        contraction = name in CONTRACTIONS or (
            name in {'mul', 'multiply'} and len(factors) == 2 and is_outer_product(*factors)
        )
        return contraction and all(gate_kind(tensor) != 'softmax' for tensor in factors)

    def scatter(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """A scatter: the plain gradient for sums, means, maxima and minima, the uniform rule (Prop. 3.2) for a
        product (``reduce='prod'``, ``'multiply'``): each output the product of the input's entry (unless
        ``include_self=False``) and the source entries scattered to it, its gradient divided by the number of its
        relevance-carrying factors (CP-LRP: a gate among input and source is a constant, see
        :py:meth:`constant_factors`)."""
        reduce = kwargs.get('reduce', args[4] if len(args) > 4 else None)
        if reduce not in ('prod', 'multiply'):
            return func(*args, **kwargs)
        if in_place(func, kwargs):
            self.canonizer.refuse(func.__name__, 'an in-place product of relevance-carrying tensors')
        input, dim, index = (
            args[0],
            args[1] if len(args) > 1 else kwargs['dim'],
            args[2] if len(args) > 2 else kwargs['index'],
        )
        source = args[3] if len(args) > 3 else next(kwargs[key] for key in ('src', 'source', 'value') if key in kwargs)
        factors = [tensor for tensor in (input, source) if isinstance(tensor, torch.Tensor) and tensor.requires_grad]
        constant = self.constant_factors(factors) if self.canonizer.constant_gates and len(factors) > 1 else set()
        if constant:
            detached = {
                key: tensor.detach() for key, tensor in ((id(item), item) for item in factors) if key in constant
            }
            args, kwargs = replaced(args, detached), {key: replaced(value, detached) for key, value in kwargs.items()}
            input, source = (
                detached.get(id(item), item) if isinstance(item, torch.Tensor) else item for item in (input, source)
            )
        output = func(*args, **kwargs)
        with torch.no_grad():
            counts = torch.zeros_like(output)
            if input.requires_grad and kwargs.get('include_self', True):
                counts += 1
            if isinstance(source, torch.Tensor) and source.requires_grad:
                ones = torch.ones(
                    index.shape if name != 'index_reduce' else source.shape, dtype=output.dtype, device=output.device
                )
                counts = (
                    counts.index_add(dim, index, ones)
                    if name == 'index_reduce'
                    else counts.scatter_add(dim, index, ones)
                )
        return scaled_gradient(output, 1 / counts.clamp_min(1))

    def factors(self, name, args, kwargs, carrying: list[torch.Tensor]) -> list[torch.Tensor]:
        """The relevance-carrying tensors among the factors of a product: without the additive term of ``addmm`` and
        its kind and the bias of ``linear`` and the convolutions (:py:data:`ADDITIVE`), which keep their plain
        gradient; a tensor that is both refused."""
        position, key = ADDITIVE.get(name, (None, None))
        term = args[position] if position is not None and len(args) > position else kwargs.get(key)
        if not (isinstance(term, torch.Tensor) and term.requires_grad):
            return carrying
        factors = list(carrying)
        factors.pop(next(index for index, tensor in enumerate(factors) if tensor is term))
        if any(tensor is term for tensor in factors):
            self.canonizer.refuse(name, 'a product with a relevance-carrying tensor that is also its additive term')
        return factors

    def sink_factors(self, carrying, sinks) -> dict[int, float]:
        """``(softmax(z) @ V) * sigmoid(logsumexp(z) - s)`` is ``softmax([z, s]) @ [V; 0]`` (an attention sink): the
        bilinear rule (Prop. 3.3) gives the extended softmax its share (1/2; CP-LRP: 0) and the rest the whole, so the
        sink mass gets the softmax's share and the attention output its full gradient (its matrix product already
        split it)."""
        others = [tensor for tensor in carrying if tensor is not sinks[0]]
        share = 0.0 if self.canonizer.constant_gates else 0.5
        if (
            len(sinks) != 1
            or len(others) != 1
            or not (
                self.canonizer.constant_gates
                or any(node is sink_scores(sinks[0]) for node in attention_scores(others[0]))
            )
        ):
            self.canonizer.refuse(
                'sigmoid(logsumexp)',
                'an attention-sink mass that does not scale the attention output softmax(z) @ V of its own scores z',
            )
        return {id(others[0]): 1.0, id(sinks[0]): share}

    @staticmethod
    def division(func, args, kwargs):
        """``a / b``: a relevance-carrying divisor ``b`` is a constant (the normaliser ``g(x)`` of Prop. 3.4), except
        where both are gates (a renormalised softmax: the softmax of the selected logits, Prop. 3.1)."""
        numerator, denominator = (list(args) + [kwargs.get('other')])[:2]
        if not (isinstance(denominator, torch.Tensor) and denominator.requires_grad):
            return func(*args, **kwargs)
        if is_gate(denominator) and isinstance(numerator, torch.Tensor) and is_gate(numerator):
            return func(*args, **kwargs)  # renormalised softmax: the softmax of the selected logits (Prop. 3.1)
        rest = {key: value for key, value in kwargs.items() if key != 'other'}
        return func(numerator, denominator.detach(), *args[2:], **rest)

    def attention(self, func, args, kwargs):
        """``scaled_dot_product_attention``: query and key 1/4, value 1/2 (Props. 3.1, 3.3); CP-LRP: query and key
        constant."""
        names = ('query', 'key', 'value')
        scales = self.canonizer.attention_scales
        args = list(args)
        biased = [
            tensor
            for tensor in args[:3] + [kwargs.get(key) for key in names]
            if isinstance(tensor, torch.Tensor) and tensor in self.canonizer.biases
        ]
        if biased:  # an exponential in query, key or value
            self.canonizer.refuse_bias('exp (used by scaled_dot_product_attention)', self.canonizer.biases[biased[0]])
        for index, name in enumerate(names):
            if index < len(args):
                if isinstance(args[index], torch.Tensor) and args[index].requires_grad:
                    args[index] = scaled_gradient(args[index], scales[name])
            elif isinstance(kwargs.get(name), torch.Tensor) and kwargs[name].requires_grad:
                kwargs[name] = scaled_gradient(kwargs[name], scales[name])
        # a float mask that carries relevance is an additive term of the logits: the scores' share (Props. 3.1, 3.3)
        share = 2 * scales['query']
        if len(args) > 3 and isinstance(args[3], torch.Tensor) and args[3].requires_grad:
            args[3] = scaled_gradient(args[3], share)
        elif isinstance(kwargs.get('attn_mask'), torch.Tensor) and kwargs['attn_mask'].requires_grad:
            kwargs['attn_mask'] = scaled_gradient(kwargs['attn_mask'], share)
        return func(*args, **kwargs)

    def norm(self, name, func, args, kwargs):
        """``layer_norm``, ``rms_norm``, ``normalize``: the identity rule on ``x / g(x)`` (Prop. 3.4)."""
        input = args[0]
        if name == 'layer_norm':
            shape = args[1] if len(args) > 1 else kwargs['normalized_shape']
            weight = args[2] if len(args) > 2 else kwargs.get('weight')
            bias = args[3] if len(args) > 3 else kwargs.get('bias')
            eps = args[4] if len(args) > 4 else kwargs.get('eps', 1e-5)
            if any(isinstance(value, torch.Tensor) and value.requires_grad for value in (weight, bias)):
                self.canonizer.refuse(name, 'a normalisation whose weight carries relevance')
            return layer_norm_identity(input, len(shape), weight, bias, eps)
        with torch.no_grad():
            output = func(*args, **kwargs)
        if any(tensor.requires_grad for tensor in tensors_of(list(args[1:]) + list(kwargs.values()), [])):
            self.canonizer.refuse(name, 'a normalisation whose weight carries relevance')
        return elementwise_identity(input, output)


def replaced(value, tensors: dict[int, torch.Tensor]):
    """``value`` (a tensor, or lists and tuples of them) with the tensors whose ids are keys of ``tensors`` replaced."""
    if isinstance(value, torch.Tensor):
        return tensors.get(id(value), value)
    if isinstance(value, (list, tuple)):
        return type(value)(replaced(item, tensors) for item in value)
    return value
