"""The general mechanism: AttnLRP on any transformer, applied at the operations the model performs.

A model that the family table (:py:mod:`~zennit_attn.canonizers.families`) does not list is explained by
:py:class:`GeneralCanonizer`: while the model's forward runs (and autograd records it), a
:py:class:`torch.overrides.TorchFunctionMode` sees every torch function called on a tensor that carries relevance
(one that requires a gradient: the model's parameters are frozen for the time of the context, so these are exactly
the tensors computed from the explained inputs) and classifies it:

- linear, structural and selection operations (add, cat, reshape, index, sum, linear layers on frozen weights,
  max, top-k, ...): the plain gradient (epsilon rule with epsilon -> 0, Eq. 8), nothing to change;
- products of several relevance-carrying tensors (``a * b``, ``q @ k^T``, einsum) or of the elements of one (``prod``):
  the uniform rule (Prop. 3.2; Prop. 3.3 for matrix products), each of the N factors gets 1/N; CP-LRP: factors that
  are the output of a non-linearity or a softmax (also selected by ``max``/``topk``/indexing, padded or concatenated:
  routing weights) are constants (:py:func:`~zennit_attn.canonizers.graph.is_gate`);
- softmax: the plain gradient, which is the softmax rule (Prop. 3.1); rows whose logits are all ``-inf`` (a NaN
  output that the model replaces by a constant) pass nothing;
- an attention sink written as ``(softmax(z) @ V) * sigmoid(logsumexp(z) - s)``: the softmax of ``[z, s]`` (Prop. 3.1
  on the extended softmax, Prop. 3.3 for its product with ``[V; 0]``);
- a log-softmax ``z - logsumexp(z)`` or ``log_softmax(z)``, cast, viewed or selected (top-k, gather), then ``exp``:
  ``softmax(z)`` (routing weights computed in log space), its plain gradient (Prop. 3.1), a softmax output where it
  enters a product; any other use of a log-softmax or a ``logsumexp`` is refused;
- ``scaled_dot_product_attention``: query and key 1/4, value 1/2 (Props. 3.1, 3.3), a relevance-carrying float mask
  (an additive term of the logits) 1/2; CP-LRP: query, key and mask constant;
- element-wise non-linearities (tanh, SiLU, GELU, sigmoid, clamp, ``x ** 2``, sign, roundings, remainders, ...): the
  identity rule (Eq. 9; not their zero or unit gradient); ``exp`` only where its output enters attention logits
  additively (a logit bias such as Doge's dynamic mask), else refused;
- operations under ``torch.no_grad()`` inside the forward: tensors they compute from relevance-carrying ones must not
  meet relevance again (truncated backpropagation would lose relevance silently): refused
  (:py:mod:`~zennit_attn.canonizers.tracking`, which also records the constants a model adds);
- a division ``a / b`` by a relevance-carrying ``b``: ``b`` is a constant (the normaliser ``g(x)`` of Prop. 3.4);
  a renormalised softmax (top-k routing weights) keeps its plain gradient: it is the softmax of the selected logits;
- ``rsqrt``, ``sqrt``, norms, variances: constants (normalisers, Prop. 3.4);
- ``layer_norm``, ``rms_norm``, ``normalize``: the identity rule on ``x / g(x)`` (Prop. 3.4);
- anything else: refused, :py:class:`UnsupportedModelError` naming the operation, the module path and what to do.

Activation, LayerNorm and RMSNorm *modules* get their rules from the composite as before (the mode leaves their
inside alone); other modules named like a normalisation are classified inside like any code (a channels-first
LayerNorm's variance is a normaliser, MobileBERT's ``NoNorm`` is an element-wise affine map); outputs of autograd
functions defined outside torch, zennit and zennit-attn (custom kernels) are refused where they are used. Attention
implementations that the mode cannot see into (flash attention, flex attention, kernels) run as SDPA for the time
of the context (as eager where a model has no SDPA path), experts of mixtures of experts that run as kernels as
their plain loop (transformers' grouped and batched products stay: the mode sees them); the results agree to
floating-point rounding. Everything is set on the model instance and put back on :py:meth:`remove`.
"""
from __future__ import annotations

import functools
import re
from typing import Callable, Mapping

import torch
from torch.overrides import TorchFunctionMode
from zennit.canonizers import Canonizer

from ..module_kinds import UnsupportedModelError, is_activation, model_configs, norm_kind
from ..rules import elementwise_identity, layer_norm_identity, scaled_gradient
from .decompositions import DECOMPOSED
from .graph import (ExpLogSoftmax, LogSoftmaxMark, LogSumExpMark, SinkMass, SoftmaxInput, attention_scores, is_gate,
                    is_log_softmax, log_softmax_scores, lse_scores, scores_node, sink_scores)
from .tracking import Tracking, tensors_of

#: Attention implementations whose arithmetic the mode sees (the others run as ``sdpa`` during the context).
VISIBLE_ATTENTION = ('eager', 'sdpa')
#: Experts implementations of mixtures of experts whose arithmetic the mode sees: the plain loop, and transformers'
#: batched and grouped matrix products (``bmm``, ``torch._grouped_mm`` or transformers' ``grouped_mm_fallback``: per
#: expert, a product of the tokens with the frozen expert weights); the others (kernels) run as the loop.
VISIBLE_EXPERTS = ('eager', 'batched_mm', 'grouped_mm')

#: The general mechanism's exceptions: per model class, an attribute of its instances set for the context, from a
#: function of the instance. HRM-Text runs all but the last ``L_bp_cycles`` of its inner cycles under ``no_grad``
#: (to save training memory), which would cut relevance off: every cycle is computed with gradients instead.
INSTANCE_SETTINGS: dict[str, tuple[str, Callable]] = {
    'transformers.models.hrm_text.modeling_hrm_text.HrmTextModel':
        ('L_bp_cycles_padded', lambda module: [module.config.L_cycles] * module.config.H_cycles),
}

_names = str.split
#: Linear, structural and selection operations, and operations whose outputs carry no gradient: plain gradient.
FREE = frozenset(_names("""
    add sub rsub neg positive cat concat concatenate stack hstack vstack dstack view view_as reshape reshape_as flatten
    unflatten squeeze unsqueeze permute transpose swapaxes swapdims movedim moveaxis t contiguous clone expand
    expand_as broadcast_to broadcast_tensors repeat repeat_interleave tile narrow narrow_copy select index_select
    gather take_along_dim getitem setitem split split_with_sizes tensor_split hsplit vsplit chunk unbind flip fliplr
    flipud roll rot90 tril triu diagonal diag_embed masked_fill where sum mean nansum cumsum to type type_as float
    double half bfloat16 cpu cuda detach dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout pad
    constant_pad_nd interpolate upsample avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d
    adaptive_avg_pool3d pixel_shuffle pixel_unshuffle unfold fold as_strided index_put index_add index_copy index_fill
    scatter scatter_add scatter_reduce masked_scatter masked_select copy zero fill max min amax amin topk sort kthvalue
    maximum minimum fmax fmin msort argsort argmax argmin eq ne lt le gt ge equal isnan isinf isfinite isclose allclose
    all any signbit count_nonzero nonzero contains iter reversed new_zeros new_ones new_empty new_full new_tensor
    zeros_like ones_like empty_like full_like rand_like randn_like randint_like numpy pin_memory share_memory
    record_stream split_size unsqueeze_copy expand_copy view_copy permute_copy transpose_copy squeeze_copy slice_copy
    select_copy flatten_copy chunk_copy real imag conj resolve_conj resolve_neg align_to rename refine_names embedding
    embedding_bag one_hot diff bucketize searchsorted histc cummax cummin logical_and logical_or logical_not
    logical_xor bitwise_and bitwise_or bitwise_not floor_divide view_as_complex view_as_real complex
"""))
#: Operations that read metadata, detach or register hooks: nothing to check (they run in the rules' hooks too).
METADATA = frozenset(_names("""
    get detach numel dim size stride storage_offset data_ptr element_size is_contiguous is_floating_point is_complex
    item tolist bool len format repr hash requires_grad retain_grad register_hook untyped_storage
"""))
#: Multilinear operations: linear when one operand carries relevance, a product (uniform rule) when several do.
PRODUCTS = frozenset(_names("""
    mul multiply matmul mm bmm einsum linear bilinear conv1d conv2d conv3d conv_transpose1d conv_transpose2d
    conv_transpose3d addmm addbmm baddbmm addmv addcmul outer inner dot vdot tensordot kron prod _grouped_mm
    grouped_mm_fallback
"""))
#: Element-wise non-linearities: identity rule (Eq. 9).
ACTIVATIONS = frozenset(_names("""
    tanh sigmoid log_sigmoid silu gelu relu relu6 leaky_relu elu selu celu softplus mish hardswish hardtanh hardsigmoid
    erf clamp clamp_min clamp_max clip abs threshold square sign round floor ceil trunc frac remainder fmod
"""))
#: Bounds and roundings among them: a clamped or rounded value is not a gate (a gate only where its input is one).
BOUNDS = frozenset(_names('clamp clamp_min clamp_max clip hardtanh round floor ceil trunc frac remainder fmod'))
#: Computations of a normaliser ``g(x)`` (Prop. 3.4): constants.
NORMALISERS = frozenset(_names('rsqrt sqrt reciprocal norm vector_norm linalg_vector_norm matrix_norm std var std_mean '
                               'var_mean'))
DIVISIONS = frozenset(_names('div divide true_divide'))
#: Products with an additive term (position, keyword): ``addmm(input, a, b) = input + a @ b``, the bias of ``linear``
#: and of the convolutions; it keeps its plain gradient, only the factors share the product's.
ADDITIVE = {**dict.fromkeys(_names('addmm addbmm baddbmm addmv addcmul'), (0, 'input')),
            **dict.fromkeys(_names('linear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d'),
                            (2, 'bias')),
            'bilinear': (3, 'bias'), '_grouped_mm': (3, 'bias')}
SOFTMAX = frozenset(_names('softmax _softmax'))
LOG_SOFTMAX = frozenset(_names('log_softmax _log_softmax'))
#: Operations that keep a log-softmax one (casts, views, selections): its ``exp`` is still a softmax.
_LOG_SOFTMAX_VIEWS = frozenset(_names('to type type_as float double half bfloat16 view view_as reshape reshape_as '
                                      'flatten unflatten squeeze unsqueeze expand expand_as contiguous clone getitem '
                                      'select narrow index_select gather take_along_dim topk sort transpose permute t '
                                      'movedim swapaxes split split_with_sizes chunk unbind'))
#: What keeps ``logsumexp(z)`` a shifted log-normaliser: constants added or subtracted, casts, views, selections.
_LSE_SHIFTS = frozenset(_names('add sub to type type_as float double view reshape unsqueeze squeeze expand contiguous '
                               'clone getitem select narrow'))

#: Packages whose autograd functions are trusted (their outputs are the ones the rules produce or plain torch).
_TRUSTED_FUNCTIONS = ('torch.', 'zennit.', 'zennit_attn.', 'bitsandbytes.')
#: Class names of sequence mixers that are not softmax attention.
_RECURRENT = re.compile(r'Mamba|SSM|Ssm|Delta|ForgetGate|LinearAttention|Linear_?Attn|Rwkv|RWKV|Retention|Hyena|Xlstm|xLSTM|'
                        r'LSTM|GRU|Lightning|Recurrent|ShortConv|Mixer|Lfm2Short')

#: Reflected operators whose operand order changes what they compute (``c - x``, ``c / x``, ``c ** x``).
_REFLECTED = {'rsub': 'sub', 'rtruediv': 'reciprocal_scaled', 'rpow': 'rpow'}
#: Operators whose reflected (``__rmul__``) and in-place (``__imul__``) forms compute the same as the plain one.
_SWAPPABLE = frozenset(_names('add sub mul matmul truediv floordiv pow mod and or xor'))
_ALIASES = {'truediv': 'div', 'floordiv': 'floor_divide', 'mod': 'remainder', 'and': 'logical_and',
            'or': 'logical_or', 'xor': 'logical_xor'}

#: The names :py:func:`_op_name` gave, by function (the mode asks for each operation of every forward).
_OP_NAMES: dict = {}


def _op_name(func: Callable) -> str:
    """``torch.mul``, ``Tensor.__rmul__`` and ``Tensor.mul_`` all give ``'mul'``."""
    try:
        return _OP_NAMES[func]
    except KeyError:
        name = _OP_NAMES[func] = _name_of(func)
        return name
    except TypeError:  # an unhashable callable
        return _name_of(func)


def _in_place(func: Callable) -> bool:
    """Whether ``func`` changes its first argument in place by its name (``mul_``, not ``__mul__``)."""
    name = getattr(func, '__name__', '') or ''
    return name.endswith('_') and not name.startswith('__')


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


class _Classifier(TorchFunctionMode):
    """The torch function mode of :py:class:`GeneralCanonizer`; see the module's table."""
    def __init__(self, canonizer: 'GeneralCanonizer'):
        super().__init__()
        self.canonizer = canonizer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        canonizer = self.canonizer
        name = _op_name(func)
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
        if name in DIVISIONS:
            return self.division(func, args, kwargs)
        if name in ACTIVATIONS or name == 'exp' or (name == 'pow' and self.power(args, kwargs) >= 1):
            if len(carrying) != 1 or not isinstance(args[0], torch.Tensor) or args[0] is not carrying[0]:
                canonizer.refuse(name, 'an element-wise non-linearity of more than one relevance-carrying tensor')
            output = canonizer.activation(args[0], func(*args, **kwargs), name not in BOUNDS or is_gate(args[0]))
            return canonizer.mark_bias(output) if name == 'exp' else output
        if name in NORMALISERS or name in {'pow', 'reciprocal_scaled'}:
            with torch.no_grad():
                return func(*args, **kwargs)
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
        :py:mod:`~zennit_attn.canonizers.graph`); ``z - logsumexp(z)``: a log-softmax (marked, see
        :py:meth:`log_softmax_use`); any other use of a ``logsumexp`` is refused."""
        reflected = getattr(func, '__name__', '') in {'__rsub__', 'rsub'}
        if name == 'sub' and not reflected and len(carrying) == 2 and len(args) > 1 and kwargs.get('alpha', 1) == 1 \
                and is_log_softmax(args[0], args[1]):
            return LogSoftmaxMark.apply(func(*args, **kwargs), lse_scores(args[1]))
        if len(carrying) == 1 and name == 'sigmoid':
            return SinkMass.apply(func(*args, **kwargs), lse_scores(carrying[0]))
        if len(carrying) == 1 and not reflected and name in _LSE_SHIFTS and (name != 'sub' or args[0] is carrying[0]):
            return func(*args, **kwargs)
        self.canonizer.refuse(f'logsumexp (used by {name})', 'a logsumexp that is not the mass sigmoid(logsumexp(z) - '
                              's) of a softmax extended by a constant sink logit s (an attention sink) nor the '
                              'normaliser of a log-softmax z - logsumexp(z)')

    def log_softmax_use(self, name, func, args, kwargs, carrying):
        """A log-softmax of ``z``: casts, views and selections keep it one; its ``exp`` is ``softmax(z)`` (a selection
        of it), marked as a softmax output (:py:class:`~zennit_attn.canonizers.graph.ExpLogSoftmax`) with its plain
        gradient, the softmax rule (Prop. 3.1); any other use is refused."""
        in_place = _in_place(func)
        if len(carrying) == 1 and not in_place and name == 'exp' and args and args[0] is carrying[0]:
            return ExpLogSoftmax.apply(func(*args, **kwargs), log_softmax_scores(carrying[0]))
        if len(carrying) == 1 and not in_place and name in _LOG_SOFTMAX_VIEWS:
            output = func(*args, **kwargs)
            outputs = tensors_of(output if isinstance(output, (list, tuple)) else [output], [])
            if all(log_softmax_scores(tensor) is not None for tensor in outputs if tensor.requires_grad):
                return output
        self.canonizer.refuse(f'log_softmax (used by {name})', 'a log-softmax z - logsumexp(z) that is not '
                              'exponentiated (exp(z - logsumexp(z)) is softmax(z), Prop. 3.1; a log-softmax itself has '
                              'no AttnLRP rule)')

    @staticmethod
    def power(args, kwargs) -> float:
        exponent = args[1] if len(args) > 1 else kwargs.get('exponent')
        return float(exponent) if isinstance(exponent, (int, float)) else float('nan')

    def product(self, name, func, args, kwargs, carrying: list[torch.Tensor]):
        if name == 'prod':  # of the elements of one tensor along ``dim`` (all without): each 1/n (Prop. 3.2)
            dim = args[1] if len(args) > 1 else kwargs.get('dim')
            count = carrying[0].numel() if dim is None else carrying[0].shape[dim]
            return scaled_gradient(func(*args, **kwargs), 1.0 / max(count, 1))
        factors = self.factors(name, args, kwargs, carrying)
        if len(factors) < 2:
            return func(*args, **kwargs)
        if _in_place(func):
            self.canonizer.refuse(func.__name__, 'an in-place product of relevance-carrying tensors')
        sinks = [tensor for tensor in factors if sink_scores(tensor) is not None]
        if sinks:
            scales = self.sink_factors(factors, sinks)
        else:
            constant = ({id(tensor) for tensor in factors if is_gate(tensor)} if self.canonizer.constant_gates
                        else set())
            free = [tensor for tensor in factors if id(tensor) not in constant]
            share = 1.0 / len(free) if len(free) > 1 else 1.0
            if not constant and len(factors) == len(carrying):  # equal shares: scale the output's gradient once
                return scaled_gradient(func(*args, **kwargs), share)
            scales = {id(tensor): 0.0 if id(tensor) in constant else share for tensor in factors}
        replaced = {}

        def swap(value):
            # each distinct tensor scaled once: ``x * x`` gives x the gradient 2 x g / 2, its relevance x^2 g
            if isinstance(value, torch.Tensor) and value.requires_grad:
                if id(value) not in replaced:
                    replaced[id(value)] = scaled_gradient(value, scales.get(id(value), 1.0))
                return replaced[id(value)]
            if isinstance(value, (list, tuple)):
                return type(value)(swap(item) for item in value)
            return value
        return func(*swap(tuple(args)), **{key: swap(value) for key, value in kwargs.items()})

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
        if len(sinks) != 1 or len(others) != 1 or not (self.canonizer.constant_gates or any(
                node is sink_scores(sinks[0]) for node in attention_scores(others[0]))):
            self.canonizer.refuse('sigmoid(logsumexp)', 'an attention-sink mass that does not scale the attention '
                                  'output softmax(z) @ V of its own scores z')
        return {id(others[0]): 1.0, id(sinks[0]): share}

    def division(self, func, args, kwargs):
        numerator, denominator = (list(args) + [kwargs.get('other')])[:2]
        if not (isinstance(denominator, torch.Tensor) and denominator.requires_grad):
            return func(*args, **kwargs)
        if is_gate(denominator) and isinstance(numerator, torch.Tensor) and is_gate(numerator):
            return func(*args, **kwargs)  # renormalised softmax: the softmax of the selected logits (Prop. 3.1)
        rest = {key: value for key, value in kwargs.items() if key != 'other'}
        return func(numerator, denominator.detach(), *args[2:], **rest)

    def attention(self, func, args, kwargs):
        names = ('query', 'key', 'value')
        scales = self.canonizer.attention_scales
        args = list(args)
        biased = [tensor for tensor in args[:3] + [kwargs.get(key) for key in names]
                  if isinstance(tensor, torch.Tensor) and tensor in self.canonizer.biases]
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


#: torch modules that compute a linear map of what carries relevance (a selection for ``Embedding``): the mode
#: classifies their operations like any other, and called on their own their plain gradient is their rule.
_LINEAR_LEAVES = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Dropout, torch.nn.Identity, torch.nn.Conv1d,
                  torch.nn.Conv2d, torch.nn.Conv3d)


def _plain_torch_leaf(module: torch.nn.Module) -> bool:
    """Whether ``module`` is exactly one of :py:data:`_LINEAR_LEAVES`: :py:class:`GeneralCanonizer` gives it no hooks
    (a refusal of what enters it names the module that calls it)."""
    return type(module) in _LINEAR_LEAVES


class GeneralCanonizer(Tracking, Canonizer):
    """Explain any transformer at the operations it performs (see the module's table).

    Applying it to a model (the composites do, for a model the family table does not list) freezes the model's
    parameters, sets attention implementations the mode cannot see into to SDPA (eager without SDPA), experts
    implementations it cannot see into (:py:data:`VISIBLE_EXPERTS`) to their plain loop, the attributes of
    :py:data:`INSTANCE_SETTINGS`, and enters the classifying mode for the time of each forward of the model;
    :py:meth:`remove` puts everything back.

    Parameters
    ----------
    constant_gates: bool
        CP-LRP (Ali et al. 2022): the outputs of non-linearities and softmaxes are constants where they enter a
        product, and query and key receive nothing in SDPA. False (AttnLRP): the uniform rule.
    """
    def __init__(self, constant_gates: bool = False, constants: list | None = None):
        super().__init__()
        self.constant_gates = constant_gates
        #: ``(module path, value)`` of every non-zero number the model adds to relevance (a bias written into its
        #: code: it absorbs relevance); shared with the copies :py:meth:`apply` registers
        self.constants = [] if constants is None else constants
        self.attention_scales = ({'query': 0.0, 'key': 0.0, 'value': 1.0} if constant_gates
                                 else {'query': 0.25, 'key': 0.25, 'value': 0.5})
        self.opaque = 0
        # whether the forward computed a ``logsumexp`` or ``log_softmax`` (:py:meth:`_Classifier.sink_mass`, ...)
        self.lse = False
        self.start_tracking()
        self.path: list[tuple[str, torch.nn.Module]] = []
        self.handles: list = []
        self.frozen: list[torch.nn.Parameter] = []
        self.settings: list[tuple[object, str, object]] = []
        self.modes: list[_Classifier] = []
        self.forwards: list[tuple[torch.nn.Module, object]] = []
        self.refusal: UnsupportedModelError | None = None
        #: autograd node classes whose outputs :py:meth:`check_origin` accepted (it runs for every operand)
        self.trusted_nodes: set[type] = set()

    def copy(self) -> 'GeneralCanonizer':
        return type(self)(self.constant_gates, self.constants)

    def apply(self, root_module: torch.nn.Module) -> list[Canonizer]:
        instance = self.copy()
        try:
            instance.register(root_module)
        except BaseException:
            instance.remove()
            raise
        return [instance]

    def register(self, model: torch.nn.Module) -> None:
        for config in model_configs(model):
            implementation = getattr(config, '_attn_implementation_internal', None)
            if implementation is not None and implementation not in VISIBLE_ATTENTION:
                sdpa = getattr(model, '_supports_sdpa', True) is not False
                self._set(config, '_attn_implementation_internal', 'sdpa' if sdpa else 'eager')
            if getattr(config, '_experts_implementation_internal', None) not in (None, *VISIBLE_EXPERTS):
                self._set(config, '_experts_implementation_internal', 'eager')
        self.guard(model)
        for name, module in model.named_modules():
            for parameter in module._parameters.values():
                if parameter is not None and parameter.requires_grad:  # once: a shared one is frozen then
                    parameter.requires_grad_(False)
                    self.frozen.append(parameter)
            setting = INSTANCE_SETTINGS.get(f'{type(module).__module__}.{type(module).__qualname__}')
            if setting is not None:
                self._set(module, setting[0], setting[1](module))
            if name and _plain_torch_leaf(module):
                continue
            opaque = name != '' and self.is_opaque(module)
            self.handles.append(module.register_forward_pre_hook(self._enter(name, module, opaque)))
            self.handles.append(module.register_forward_hook(self._leave(opaque), always_call=True))

    def guard(self, model: torch.nn.Module) -> None:
        """Wrap the forward of the model instance so that a refusal raised inside an operator reaches the caller as
        the :py:class:`UnsupportedModelError` it is (put back by :py:meth:`remove`)."""
        forward, previous = model.forward, model.__dict__.get('forward')

        @functools.wraps(forward)  # keeps the signature, which transformers' generate inspects
        def guarded(*args, **kwargs):
            self.refusal = None
            try:
                return forward(*args, **kwargs)
            except TypeError as error:
                if self.refusal is None or isinstance(error, UnsupportedModelError):
                    raise
                raise self.refusal from error

        model.forward = guarded
        self.forwards.append((model, previous))

    @staticmethod
    def is_opaque(module: torch.nn.Module) -> bool:
        """Modules whose output the composite's rule replaces as a whole (activations, LayerNorm and RMSNorm,
        softmax): the operations inside them are not classified. Other modules named like a normalisation
        (``norm_kind`` ``'probe'``) are classified inside: the composites give them no rule of their own here."""
        return is_activation(module) or norm_kind(module) in ('layer', 'rms') or isinstance(module, torch.nn.Softmax)

    def _set(self, target, attribute: str, value) -> None:
        self.settings.append((target, attribute, getattr(target, attribute)))
        setattr(target, attribute, value)

    def _enter(self, name: str, module: torch.nn.Module, opaque: bool):
        def hook(module, args):
            if not self.path:
                self.lse = False
                self.start_tracking()
                mode = _Classifier(self)
                mode.__enter__()
                self.modes.append(mode)
            self.path.append((name, module))
            self.opaque += opaque
        return hook

    def _leave(self, opaque: bool):
        def hook(module, args, output):
            if self.path:
                self.path.pop()
                self.opaque -= opaque
            if not self.path:
                while self.modes:
                    self.modes.pop().__exit__(None, None, None)
                values = list(output.values()) if isinstance(output, Mapping) else output
                outputs = [tensor for tensor in tensors_of(values, []) if tensor.requires_grad]
                for tensor in outputs:
                    self.check_origin(tensor)
                self.check_biases(outputs)
        return hook

    def check_origin(self, tensor: torch.Tensor) -> None:
        """Refuse a tensor computed by an autograd function of another package (a custom kernel)."""
        node = type(tensor.grad_fn)
        if node in self.trusted_nodes:
            return
        forward = getattr(node, '_forward_cls', None)  # a class attribute of the nodes of Python autograd functions
        if forward is not None and not forward.__module__.startswith(_TRUSTED_FUNCTIONS):
            self.refuse(f'{forward.__module__}.{forward.__qualname__}', 'a custom autograd function (kernel)')
        self.trusted_nodes.add(node)

    def activation(self, input: torch.Tensor, output: torch.Tensor, gate: bool = True) -> torch.Tensor:
        return elementwise_identity(input, output, gate=gate)

    def refuse(self, op: str, what: str | None = None, hint: str | None = None, path: list | None = None):
        path = self.path if path is None else path
        name, module = path[-1] if path else ('', None)
        cls = type(module).__name__ if module is not None else '?'
        where = f"'{name}' ({cls})" if name else f'the model ({cls})'
        outer = next((type(item).__name__ for _, item in reversed(path) if _RECURRENT.search(type(item).__name__)), None)
        description = what or 'an operation without an AttnLRP rule'
        if hint is None and outer is not None:
            hint = (f'{outer} is not softmax attention: AttnLRP (Achtibat et al. 2024) defines rules for softmax '
                    'attention, linear layers, element-wise non-linearities, products and normalisations; the '
                    'recurrences of state-space, linear-attention and convolutional sequence mixers are outside '
                    'them, so zennit-attn does not explain this model.')
        elif hint is None:
            hint = ('Route it through a module that the composite has a rule for, add a Family entry '
                    '(zennit_attn.canonizers.families), or report the model.')
        # kept for the guard of :py:meth:`register`: raised inside an operator (``a + b``), torch turns the error (a
        # TypeError) into NotImplemented and Python raises a TypeError without it
        self.refusal = UnsupportedModelError(f'zennit-attn cannot explain {op} in {where}: {description}, computed on '
                                             f'tensors that carry relevance. {hint}')
        raise self.refusal

    def remove(self) -> None:
        while self.modes:
            self.modes.pop().__exit__(None, None, None)
        for handle in self.handles:
            handle.remove()
        for parameter in self.frozen:
            parameter.requires_grad_(True)
        for target, attribute, value in reversed(self.settings):
            setattr(target, attribute, value)
        for model, previous in reversed(self.forwards):
            if previous is None:
                model.__dict__.pop('forward', None)
            else:
                model.forward = previous
        self.forwards = []
        self.handles, self.frozen, self.settings, self.path, self.opaque = [], [], [], [], 0
