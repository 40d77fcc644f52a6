"""Element-wise functions, normalisers and normalisations in the classifying mode: the handlers of the registry's
rules ``elementwise``, ``bound``, ``normaliser``, ``power``, ``exp``, ``statistic``, ``division``, ``normalisation``,
``running_norm`` and ``decomposed``, and of the normaliser mark.

- element-wise non-linearities (tanh, SiLU, GELU, sigmoid, clamp, ``x ** 2``, sign, roundings, remainders, ...): the
  composite's activation rule (the identity rule, Eq. 9, not their zero or unit gradient), from the first input of a
  chain of them (``sigmoid(relu(x))`` keeps ``sigmoid(0)``: :py:func:`~zennit_attn.rules.elementwise_identity`),
  also where the model computes them in place (``x.tanh_()``, ``F.silu(x, inplace=True)``); their outputs are gates
  (CP-LRP), a bound or rounding only where its input is one; ``exp`` is an attention-logit bias
  (:py:mod:`~zennit_attn.operations.tracking`), inside a sequence mixer a term of its recurrence;
- a number added to the output of an element-wise non-linearity (``1 + erf(x / sqrt(2))``, ``1 - sigmoid(x)``) is
  part of that non-linearity, not a bias that absorbs relevance (:py:func:`activation_shift`): the activation rule
  applies to the shifted output, so that a function written out (GELU as ``0.5 x (1 + erf(x / sqrt(2)))``,
  ``1 - sigmoid(x)``) gets the rule of its one-call spelling (``gelu(x)``, ``sigmoid(-x)``);
- normalisers ``g(x)`` (``rsqrt``, ``sqrt``, ``1 / x``, powers below 1, variances and norms): constants (Prop. 3.4)
  where they multiply the tensor they are computed from (``x * rsqrt(mean(x^2))``, :py:func:`normaliser_use`) or
  divide anything (:py:func:`division`); anywhere else values, with the activation rule (element-wise) or the rules
  of their decomposition (variances, norms: :py:data:`~.decompositions.STATISTICS`);
- ``layer_norm``, ``rms_norm`` and ``normalize``: the identity rule on ``x / g(x)`` (Prop. 3.4).
"""

from __future__ import annotations

import torch

from ..rules import contiguous_gradient, elementwise_identity, gradient_map, layer_norm_identity
from ..rules.products import ACTIVATION, SOFTMAX
from .calls import Call, in_place, is_number, out_of_place, tensor_position, tensors_of
from .graph import normalises
from .marks import ACTIVATED, Mark, kind, note_copy, passed, produced
from .tracking import ConstantTensor, State

__all__ = [
    'elementwise',
    'shifts_activation',
    'activation_shift',
    'statistic',
    'normaliser_use',
    'division',
    'normalisation',
    'running_norm',
    'decomposed',
    'activated',
    'bounded',
    'exponentiated',
    'normalising',
    'divided',
    'COMPARISONS',
    'note_sign',
    'rectifies_by_sign',
]


def elementwise(call: Call, state: State):
    """An element-wise function of one relevance-carrying tensor (rules ``elementwise``, ``bound``,
    ``normaliser``, ``power``, ``exp``): the activation rule, in place on a copy where the model computes it in
    place (the result copied back)."""
    args, carrying = call.args, call.carrying
    if len(carrying) != 1 or not isinstance(args[0], torch.Tensor) or args[0] is not carrying[0]:
        what = (
            'a power with a relevance-carrying exponent'
            if call.name == 'pow'
            else 'an element-wise non-linearity of more than one relevance-carrying tensor'
        )
        state.refuse(call.name, what)
    gate = call.entry.rule != 'bound' or kind(call.marks[0]) is not None or rectifies(call)
    rule = call.activation_rule if call.activation_rule is not None else state.activation_rule
    call.note = f'{type(rule).__name__} (Eq. 9)' if rule is not None else 'the plain gradient (no activation rule)'
    if in_place(call.func, call.kwargs):
        if call.name == 'exp':
            state.refuse(call.func.__name__, 'an exponential computed in place')
        target, source = args[0], args[0].clone()  # the input's values, kept for the rule
        changed = source.clone()
        call.func(changed, *args[1:], **call.kwargs)
        return target.copy_(state.activation(call, source, changed, gate))
    return state.activation(call, args[0], call.run(), gate)


def shifts_activation(call: Call, state: State) -> bool:
    """Whether ``call`` (a shift: ``add``, ``sub``, ``rsub``) adds a number to the output of an element-wise
    non-linearity (its one relevance-carrying operand is an activation gate, :py:func:`~.marks.kind`), outside a
    declared recurrence (whose gates are terms it holds constant), under a composite with an activation rule, and
    not in place on a constant (``c.add_(gate)``). A constant tensor added to an activation output (an attention
    mask added to soft-capped scores, a position bias) is not part of the non-linearity: it keeps its plain gradient,
    a bias absorbing its share."""
    if not (len(call.carrying) == 1 and call.name in _SHIFTS and kind(call.marks[0]) == ACTIVATION):
        return False
    input = call.carrying[0]
    added = [value for value in (*call.args, *call.kwargs.values()) if value is not input]
    return (
        all(is_number(value) for value in added)
        and any(value != 0 for value in added)  # ``a + 0`` (FastViT's branch sums from 0) is ``a``: no new function
        and not state.in_recurrence
        and (call.activation_rule is not None or state.activation_rule is not None)
        and (not in_place(call.func, call.kwargs) or call.args[0] is input)
    )


def activation_shift(call: Call, state: State):
    """A number added to the output ``a = f(x)`` of an element-wise non-linearity (:py:func:`shifts_activation`):
    ``a + c`` is the element-wise function ``f(x) + c`` of ``x``, so the activation rule applies to it as to ``f``
    (the identity rule, Eq. 9: from the first input of the chain, ``x``), and ``c`` absorbs no relevance. A written-out
    function thereby gets the rule of its one-call spelling: ``1 - sigmoid(x)`` that of ``sigmoid(-x)``, GELU written
    as ``0.5 x (1 + erf(x / sqrt(2)))`` (ESM) that of ``gelu(x)`` (the uniform rule shares ``x`` and ``1 + erf(.)``
    by halves, Prop. 3.2, and both halves reach ``x`` whole). A constant added to a value (the bias of a linear map,
    ``W x + b``, also before a non-linearity) keeps absorbing its share (Eq. 8)."""
    input = call.carrying[0]
    call.note = 'a number added to an activation output, part of the element-wise function: the activation rule'
    if not in_place(call.func, call.kwargs):
        return state.activation(call, input, call.run(), gate=True)
    source = input.clone()  # the input's values, kept for the rule
    state.marks.scale(source, input, 1)
    changed = source.clone()
    call.func(changed, *call.args[1:], **call.kwargs)
    result = state.activation(call, source, changed, gate=True)
    input.copy_(result)
    state.marks.scale(input, result, 1)  # the tensor changed in place holds the rule's output
    return input


#: The shifts that may add a constant to an activation output (:py:func:`shifts_activation`; ``neg`` adds none).
_SHIFTS = frozenset({'add', 'sub', 'rsub'})


def activated(call: Call, output, state: State) -> None:
    """The marks of an element-wise non-linearity (rules ``elementwise``, ``normaliser``, ``power``): its output is a
    gate; a normaliser (``rsqrt``, ``sqrt``, ``1 / x``, a power below 1) is marked as one."""
    outputs = produced(call, output)
    rule = call.entry.rule
    if rule == 'normaliser' or (rule == 'power' and not _power_at_least_one(call)):
        name = NEGATIVE_POWER if rule == 'power' and _negative_power(call) else call.name
        state.marks.set(outputs, Mark(gate=ACTIVATED.gate, normaliser=name))
    else:
        state.marks.set(outputs, ACTIVATED)


def bounded(call: Call, output, state: State) -> None:
    """The marks of a bound or rounding: a gate where its input is one, mixed where it is mixed (``clamp(w.sum(),
    eps)``; a copy where it changes no value of a copy, :py:func:`~.marks.note_copy`); a rectifier
    (``x.clamp(min=0)``, ``clamp_min(x, 0)``, ``x.clamp(0, 6)``: ReLU and ReLU6 spelled as a bound,
    :py:func:`rectifies`) is an activation, its output a gate as that of ``relu`` and ``relu6`` is."""
    mark = call.marks[0] if len(call.marks) == 1 else None
    note_copy(call.name, call.carrying, produced(call, output), state.marks)  # a bound that changes no value
    if rectifies(call):
        state.marks.set(produced(call, output), ACTIVATED)
    elif mark is not None and mark.gate is not None:
        state.marks.set(produced(call, output), ACTIVATED if kind(mark) is not None else Mark(gate=mark.gate))


#: Comparisons of a tensor with the number 0 (:py:func:`note_sign`): name -> the sign of the tensor where the outcome
#: is true (``x > 0``, ``x >= 0``: 1; ``x < 0``, ``x <= 0``: -1).
COMPARISONS = {'gt': 1, 'ge': 1, 'lt': -1, 'le': -1}


def note_sign(name: str, args: tuple, input: torch.Tensor, output, state: State) -> None:
    """Note the outcome ``output`` of comparing the relevance-carrying ``input`` with the number 0 (``x > 0``,
    ``x.ge(0)``, ``x < 0``; :py:data:`COMPARISONS`) as the sign of ``input`` (``State.signs``), by which
    :py:func:`rectifies_by_sign` tells a rectifier written with it."""
    if len(args) == 2 and args[0] is input and is_number(args[1]) and args[1] == 0 and isinstance(output, torch.Tensor):
        state.signs[output] = (state.marks.root(tensor_position(input)), COMPARISONS[name])


def rectifies_by_sign(name: str, args: tuple, kwargs: dict, carrying: list, state: State) -> bool:
    """Whether an operation selects by the sign of a relevance-carrying tensor ``x`` (:py:func:`note_sign`) between
    ``x`` and 0 or a multiple of ``x``: ``where(x > 0, x, 0)``, ``where(x > 0, x, 0.1 * x)``, ``where(x < 0, 0, x)``,
    ``x.masked_fill(x < 0, 0)``, ``x * (x > 0)``: an element-wise piecewise linear function of ``x`` through 0 (ReLU,
    leaky ReLU), whose output is a gate as that of ``relu`` is (its plain gradient is the identity rule's, Eq. 9)."""
    if kwargs or not carrying:
        return False
    if name == 'where' and len(args) == 3:
        sign = state.signs.get(args[0])
        if sign is None:
            return False
        kept, other = (args[1], args[2]) if sign[1] > 0 else (args[2], args[1])
        return _is_multiple(kept, sign[0], state) and (
            (is_number(other) and other == 0) or _is_multiple(other, sign[0], state)
        )
    if name == 'masked_fill' and len(args) == 3:
        sign = state.signs.get(args[1])
        return sign is not None and _is_multiple(args[0], sign[0], state) and is_number(args[2]) and args[2] == 0
    if name == 'mul' and len(args) == 2 and len(carrying) == 1:
        mask = args[1] if args[0] is carrying[0] else args[0]
        sign = state.signs.get(mask) if isinstance(mask, torch.Tensor) else None
        return sign is not None and _is_multiple(carrying[0], sign[0], state)
    return False


def _is_multiple(value, root: tuple, state: State) -> bool:
    """Whether ``value`` is a relevance-carrying tensor that is the tensor at the position ``root``, or a multiple of
    it by numbers or constant tensors (:py:meth:`~.marks.Marks.root`)."""
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        return False
    return state.marks.multiple_of(tensor_position(value), root)


def rectifies(call: Call) -> bool:
    """Whether a bound is a rectifier: ``clamp`` or ``clamp_min`` of one relevance-carrying tensor with the lower bound
    the number 0 and no upper bound (the function ``relu``) or a number above 0 (``relu6``, ``hardtanh(x, 0, c)``)."""
    if call.name not in ('clamp', 'clamp_min') or len(call.carrying) != 1:
        return False
    lower, upper = call.argument('min'), call.argument('max')
    return is_number(lower) and lower == 0 and (upper is None or (is_number(upper) and upper > 0))


def exponentiated(call: Call, output, state: State) -> None:
    """The marks of ``exp``: inside a sequence mixer that is not softmax attention a term of its recurrence (a
    decay), elsewhere an additive bias of attention logits, which must end in a softmax, or the numerator of a softmax
    written out (its input kept, :py:attr:`~.marks.Marks.exponentials`)."""
    if state.runs:
        state.mark_term(output, (state.module_path(), call.name, f'an exponential in {state.runs[-1].name}'))
        return
    state.mark_bias(output)
    if isinstance(output, torch.Tensor) and output.requires_grad:
        exponent = call.carrying[0]
        state.marks.exponentials[output.grad_fn] = (exponent, exponent._version)


def statistic(call: Call, state: State):
    """A variance, standard deviation or norm (:py:data:`~.decompositions.STATISTICS`): its decomposition into
    operations with rules."""
    try:
        with state.mode:
            output = call.entry.decomposition(*call.args, **call.kwargs)
    except NotImplementedError as error:
        state.refuse(call.name, f'{error} of relevance-carrying tensors')
    call.note = 'its decomposition (the square by the identity rule, the sums linear); a normaliser'
    return output


def normalising(call: Call, output, state: State) -> None:
    """The marks of a variance, standard deviation or norm: a normaliser (its first output)."""
    first = output[0] if isinstance(output, tuple) else output
    state.marks.add(produced(call, first), normaliser=call.name)


def normaliser_use(call: Call, state: State):
    """An operation on normalisers ``g(x)`` (marked by :py:func:`activated` and :py:func:`normalising`).

    A function of normalisers alone (``rsqrt(var + eps)``: an operation that keeps normalisers, its declaration's
    ``keeps``) is a normaliser too. A product of ``x`` with a normaliser computed from ``x``
    (:py:func:`~zennit_attn.operations.graph.normalises`) is a normalisation ``x / g'(x)``: the normaliser is a
    constant (Prop. 3.4); so is a divisor (see :py:func:`division`). Anywhere else a normaliser is a value, with the
    rules its operations got (the identity rule of ``sqrt``, the decomposition of a variance): ``sqrt(softplus(h))``,
    ``h + var(h)``."""
    marked = [mark is not None and mark.normaliser is not None for mark in call.marks]
    if all(marked):
        output = state.dispatch(call, state)
        if call.entry is not None and 'normaliser' in call.entry.keeps:
            state.marks.add(produced(call, output), normaliser=_normaliser_name(call))
        return output
    if call.entry is None or call.entry.rule != 'product':
        return state.dispatch(call, state)
    others = [state.marks.sources(tensor) for tensor, found in zip(call.carrying, marked) if not found]
    constants = {
        id(tensor): tensor.detach()
        for tensor, found in zip(call.carrying, marked)
        if found and any(normalises(tensor, sources) for sources in others)
    }
    what = 'the normaliser g(x) of the other factor a constant (Prop. 3.4)'
    if not constants and call.entry.elementwise_product:
        constants, what = _inverse_factors(call, marked), 'an inverse normaliser a constant divisor (Prop. 3.4)'
    if not constants:
        return state.dispatch(call, state)
    inner = call.without(constants)
    output = state.dispatch(inner, state)
    call.note = f'{what}; {inner.note or "linear"}'
    return output


#: The name of the normaliser mark of a power below 0 (``v ** -0.5``).
NEGATIVE_POWER = 'negative power'
#: The normalisers that divide by what they are computed from (``rsqrt(v)``, ``1 / v``, ``reciprocal(v)``, ``v **
#: -1``), also rescaled, viewed or cast: a tensor times one of them is divided (:py:func:`_inverse_factors`).
INVERSES = frozenset({'rsqrt', 'reciprocal', 'reciprocal_scaled', NEGATIVE_POWER})


def _normaliser_name(call: Call) -> str:
    """The name of the normaliser a function of normalisers computes: that of its one normaliser where it moves or
    rescales it (a view, a cast, a product or division with one relevance-carrying factor: ``2 * rsqrt(v)`` is an
    inverse as ``rsqrt(v)`` is), else its own."""
    if len(call.carrying) == 1 and (call.entry.shape == 'view' or call.entry.rule in ('product', 'division')):
        return call.marks[0].normaliser
    return call.name


def _inverse_factors(call: Call, marked: list) -> dict:
    """The inverse normalisers (:py:data:`INVERSES`) among the factors of an element-wise product of
    relevance-carrying tensors, each as a constant by ``id`` of the factor: ``a * rsqrt(v)``, ``a * (1 / v)`` and
    ``a * v ** -1`` divide ``a`` by a function of ``v``, whose divisor :py:func:`division` holds constant (before,
    AttnLRP shared the product by halves: ``a * reciprocal(v)`` got a relevance 180% of the largest apart from ``a /
    v``'s); none where another factor is a softmax gate (a renormalisation keeps its rule)."""
    if any(kind(mark) == SOFTMAX for mark in call.marks):
        return {}
    return {
        id(tensor): tensor.detach()
        for tensor, found, mark in zip(call.carrying, marked, call.marks)
        if found and mark.normaliser in INVERSES
    }


def division(call: Call, state: State):
    """``a / b``: a relevance-carrying divisor ``b`` is a constant (the normaliser ``g(x)`` of Prop. 3.4), except
    where both are softmax gates (a renormalised softmax: the softmax of the selected logits, Prop. 3.1) and where
    ``b`` is a copy of ``a`` (``w / w.sum(-1, keepdim=True)`` of one routing weight: the constant 1, whose plain
    gradient is zero; marked a unit by :py:func:`divided`). Activations divided by activations (``s / s.sum()`` of
    sigmoid scores, ``x**2 / (|x| + 1)``) are normalised: the divisor a constant, so that the element-wise function
    they compute passes its relevance as the identity rule does."""
    numerator, denominator = call.argument('input'), call.argument('other')
    if not (isinstance(denominator, torch.Tensor) and denominator.requires_grad):
        call.note = 'a constant divisor: linear, the plain gradient'
        return call.run()
    if isinstance(numerator, torch.Tensor) and state.marks.copy_of(denominator, numerator.grad_fn):
        call.note = 'a tensor divided by a copy of itself: the constant 1, its plain gradient (zero)'
        return call.run()
    if _softmax(state, denominator) and isinstance(numerator, torch.Tensor) and _softmax(state, numerator):
        call.note = 'softmax gates divided by softmax gates (a renormalised softmax): the plain gradient (Prop. 3.1)'
        return call.run()
    call.note = 'the divisor a constant (Prop. 3.4)'
    return call.run(other=denominator.detach())


def _softmax(state: State, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a softmax gate (a linear function of softmax outputs)."""
    return kind(state.marks.of(tensor)) == SOFTMAX


def divided(call: Call, output, state: State) -> None:
    """The marks of ``a / b``: those of a linear function of ``a`` (the divisor a constant, also where it is kept as a
    gate: a renormalisation); divided by a number, a multiple of ``a`` (:py:meth:`~.marks.Marks.scale`); divided by
    the output of an element-wise non-linearity of ``a`` (``a / (1 + |a|)``: softsign written out,
    :py:meth:`~.marks.Marks.activation_of`), an activation's output, as ``softsign(a)``'s is."""
    numerator = call.argument('input')
    index = next((index for index, tensor in enumerate(call.carrying) if tensor is numerator), None)
    if index is None:
        return
    denominator = call.argument('other')
    if (
        call.marks[index] is None
        and isinstance(denominator, torch.Tensor)
        and kind(state.marks.of(denominator)) == ACTIVATION
        and isinstance(output, torch.Tensor)
        and output.shape == numerator.shape
        and state.marks.activation_of(numerator, denominator)
    ):
        state.marks.set(produced(call, output), ACTIVATED)
        return
    reduced = Call(call.func, call.name, call.entry, call.args, call.kwargs, [numerator], [call.marks[index]])
    reduced.held = call.held
    passed(reduced, output, state)
    # ``a / 2``: a multiple of ``a`` (where it was before the division: ``a.div_(2)`` changes it in place)
    state.marks.scale(output, numerator, call.argument('other'), call.positions[index])
    if (
        isinstance(denominator, torch.Tensor)
        and denominator.requires_grad
        and isinstance(output, torch.Tensor)
        and output.requires_grad
        and output.shape == numerator.shape
        and state.marks.copy_of(denominator, call.positions[index][0])
        and bool((output == 1).all())
    ):  # a tensor divided by a copy of itself (before the division, where it ran in place): the constant 1
        state.marks.add(produced(call, output), unit=True)


def normalisation(call: Call, state: State):
    """``layer_norm``, ``rms_norm``, ``normalize``: the identity rule on ``x / g(x)`` (Prop. 3.4), the weight and
    bias (constants) linear."""
    input = call.argument('input')
    others = [value for name, value in call.arguments.items() if name != 'input']
    if any(tensor.requires_grad for tensor in tensors_of(others, [])):
        state.refuse(call.name, 'a normalisation whose weight carries relevance')
    call.note = 'the identity rule on x / g(x), g constant (Prop. 3.4)'
    if call.name == 'layer_norm':
        shape = call.argument('normalized_shape')
        weight, bias, eps = call.argument('weight'), call.argument('bias'), call.argument('eps', 1e-5)
        return layer_norm_identity(input, len(shape), weight, bias, eps)
    with torch.no_grad():
        output = call.run()
    return elementwise_identity(input, output, compute=call.again(input))  # output computed again: it may be changed


def running_norm(call: Call, state: State):
    """``batch_norm(x, running_mean, running_var, weight, bias, training=False)``: with running statistics an
    affine map per channel, ``x w / sqrt(var + eps) + (b - mean w / sqrt(var + eps))``, linear in ``x`` (the
    plain gradient, Eq. 8), its shift a constant that absorbs relevance (noted); normalised by the statistics of
    the batch (``training=True``, or no running statistics; ``instance_norm``) it is a normalisation over
    positions, refused."""
    mean, variance = call.argument('running_mean'), call.argument('running_var')
    if call.name != 'batch_norm' or call.argument('training', False) or mean is None or variance is None:
        state.refuse(call.name, 'a normalisation by the statistics of the batch or of the positions')
    others = [value for name, value in call.arguments.items() if name != 'input']
    if any(isinstance(value, torch.Tensor) and value.requires_grad for value in others):
        state.refuse(call.name, 'a batch normalisation whose statistics or weight carry relevance')
    call.note = 'an affine map per channel: the plain gradient (Eq. 8), its shift a constant'
    output = call.run()
    with torch.no_grad():
        shift = call.run(input=torch.zeros_like(call.argument('input')[:1]))
    if bool(shift.any()):
        state.constants.append((state.here(), ConstantTensor(float(shift.abs().max()), shift.shape)))
    return gradient_map(output, contiguous_gradient)


def decomposed(call: Call, state: State):
    """A composite function (:py:data:`~.decompositions.DECOMPOSED`): its arithmetic, with the mode classifying
    each operation of it. Computed in place (``a.lerp_(b, w)``, ``c.addcdiv_(a, b)``, ``a.hypot_(b)``), that of a copy
    of the changed tensor, written into it (:py:func:`~.calls.out_of_place`); before, the decomposition's result was
    returned and the tensor left unchanged: the model computed on with ``a``'s old values (its output changed) where
    it used ``a`` after ``a.lerp_(b, w)``."""
    if in_place(call.func, call.kwargs):
        return out_of_place(call, state, decomposed)
    call.note = 'its decomposition, each operation with its own rule'
    try:
        with state.mode:
            return call.entry.decomposition(*call.args, **call.kwargs)
    except NotImplementedError as error:
        state.refuse(call.name, f'{error}, which is not softmax attention')


def _negative_power(call: Call) -> bool:
    """Whether the exponent of ``pow`` is a negative number (``x ** -0.5``: an inverse normaliser)."""
    exponent = call.argument('exponent')
    return isinstance(exponent, (int, float)) and exponent < 0


def _power_at_least_one(call: Call) -> bool:
    """Whether the exponent of ``pow`` is at least 1 (everywhere, for a tensor of exponents): below 1 a power can be a
    normaliser (``x ** -0.5``)."""
    exponent = call.argument('exponent')
    if isinstance(exponent, torch.Tensor):
        return bool((exponent >= 1).all())
    return isinstance(exponent, (int, float)) and exponent >= 1
