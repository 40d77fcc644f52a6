"""Products in the classifying mode: the product rule (:py:mod:`zennit_attn.rules.products`) on every product of
relevance-carrying tensors, whatever its spelling; the handlers of the registry's rules ``product``, ``elements``,
``scatter``, ``solve`` and ``attention``.

- multilinear operations (``a * b``, ``q @ k^T``, ``einsum``, ``linear`` with a relevance-carrying weight): the rule's
  share for each relevance-carrying factor (Prop. 3.2; Prop. 3.3 for matrix products), an additive term (``addmm``'s
  input, ``linear``'s bias) keeping its plain gradient; one relevance-carrying factor: linear, the plain gradient;
- the product of the elements of one tensor (``prod``): the rule's share for N factors of one kind;
- scatters that multiply (``scatter_reduce(..., 'prod')``): the rule per output, over the factors scattered to it;
- ``scaled_dot_product_attention``: the rule on its two products, ``q k^T`` and ``softmax(.) V`` (Props. 3.1, 3.3);
- an attention sink ``(softmax(z) @ V) * sigmoid(logsumexp(z) - s)``: the product of the extended softmax
  ``softmax([z, s])`` with ``[V; 0]`` (see :py:mod:`~zennit_attn.operations.softmax`);
- linear attention (a contraction of relevance-carrying factors without a softmax, used in another product) is
  refused; inside modules named like state-space or linear-attention mixers, products are gates of a declared
  recurrence (:py:mod:`~zennit_attn.operations.recurrences`), refused elsewhere.

The marks of a product (:py:func:`multiplied`): a gate where every relevance-carrying input is one
(:py:func:`~zennit_attn.operations.marks.join_gates`), a contraction where it contracts relevance-carrying
factors without a softmax among them, an attention output where it contracts softmax outputs with values.
"""

from __future__ import annotations

import torch

from ..rules import scaled_gradient
from ..rules.products import ACTIVATION, SOFTMAX
from .calls import Call, in_place, is_number, out_of_place, replaced, tensor_position
from .graph import is_outer_product
from .marks import ACTIVATED, SOFTMAXED, join_gates, kind, passed, produced
from .tracking import State, refuse_bias, refuse_dropout

__all__ = [
    'product',
    'elements',
    'scatter',
    'solve',
    'attention',
    'multiplied',
    'factors',
    'note_scaling',
    'note_offset',
]


def _kinds(rule, marks: list) -> list[str | None]:
    """The kinds of factors with ``marks`` (softmax outputs, activation outputs or values) where the product ``rule``
    reads them, else Nones."""
    if not rule.needs_kinds:
        return [None] * len(marks)
    return [kind(mark) for mark in marks]


def factors(call: Call) -> tuple[list[torch.Tensor], list]:
    """The relevance-carrying factors of a product and their marks: without the additive term of ``addmm`` and its
    kind and the bias of ``linear`` and the convolutions (the declaration's ``additive``), which keeps its plain
    gradient; a tensor that is both refused."""
    additive = call.entry.additive
    term = call.argument(additive) if additive is not None else None
    if not (isinstance(term, torch.Tensor) and term.requires_grad):
        return call.carrying, call.marks
    index = next(index for index, tensor in enumerate(call.carrying) if tensor is term)
    found = call.carrying[:index] + call.carrying[index + 1 :]
    if any(tensor is term for tensor in found):
        return None, None
    return found, call.marks[:index] + call.marks[index + 1 :]


def product(call: Call, state: State):
    """A multilinear operation: the product rule on its relevance-carrying factors (see the module's list)."""
    if len(call.carrying) < 2:
        call.note = 'one relevance-carrying factor: linear, the plain gradient (Eq. 8)'
        return call.func(*call.args, **call.kwargs)
    found, marks = factors(call)
    if found is None:
        state.refuse(call.name, 'a product with a relevance-carrying tensor that is also its additive term')
    units = _units(call, found, marks)
    if units:  # the constant 1 computed from relevance-carrying tensors: a constant factor (no share, no gradient)
        return _with_constant_units(call, state, units)
    if len(found) < 2:
        call.note = 'one relevance-carrying factor: linear, the plain gradient (Eq. 8)'
        return call.run()
    if in_place(call.func, call.kwargs):
        return out_of_place(call, state, product)
    _refuse_linear_attention(call, state, marks)
    rule = state.product_rule_of(call)
    sinks = [index for index, mark in enumerate(marks) if mark is not None and mark.sink is not None]
    kinds = _kinds(rule, marks)
    shares = _sink_shares(rule, state, found, marks, sinks) if sinks else rule.shares(kinds)
    value = _activated_value(found, marks, None, state) if call.name == 'mul' else None
    if value is not None:  # one element-wise function of ``value``, not a product of factors (tested once)
        return _activation_written_out(call, state, value, _shared(call, found, shares))
    chained = call.entry.elementwise_product and not sinks
    if chained:
        shares, count = _chained(rule, state, found, marks, kinds, shares)
    call.note = f'{rule!r}: shares {_rounded(shares)} of the factors {_named(kinds, sinks)}'
    output = _shared(call, found, shares)
    if chained:
        output = _distributed(call, state, found, shares, output)
        if count > 1 and isinstance(output, torch.Tensor) and output.requires_grad:
            state.marks.factors[output.grad_fn] = count
    return output


def _units(call: Call, found: list, marks: list) -> dict[int, torch.Tensor]:
    """The factors of an element-wise product that are units (:py:attr:`~.marks.Mark.unit`: the constant 1 computed
    from relevance-carrying tensors, ``w / w.sum()`` of one routing weight), detached, by id; none where the product
    changes one of them in place, and none in contractions and broadcast outer products (attention weights over one
    key, ``softmax(q k^T) @ v`` at the first position, keep the rule they get where other keys are masked out)."""
    units = {id(tensor): tensor.detach() for tensor, mark in zip(found, marks) if mark is not None and mark.unit}
    if not units or not call.entry.elementwise_product or (len(found) == 2 and is_outer_product(*found)):
        return {}
    if in_place(call.func, call.kwargs) and call.args and id(call.args[0]) in units:
        return {}
    return units


def _with_constant_units(call: Call, state: State, units: dict[int, torch.Tensor]):
    """The product with its units (:py:func:`_units`) as the constants they are: the product rule among the other
    relevance-carrying factors (a unit times an expert's output is linear in the output, as the product with the
    number 1 is: before, AttnLRP's uniform rule gave the unit half of the relevance, which its zero gradient lost)."""
    carrying = [tensor for tensor in call.carrying if id(tensor) not in units]
    marks = [mark for tensor, mark in zip(call.carrying, call.marks) if id(tensor) not in units]
    constant = Call(
        call.func,
        call.name,
        call.entry,
        replaced(tuple(call.args), units),
        {key: replaced(value, units) for key, value in call.kwargs.items()},
        carrying,
        marks,
    )
    constant.held, constant.product_rule, constant.activation_rule = call.held, call.product_rule, call.activation_rule
    output = product(constant, state) if carrying else constant.run()
    call.note = f'a unit factor (the constant 1) held constant; {constant.note}'
    return output


def _chained(rule, state: State, found: list, marks: list, kinds: list, shares: tuple) -> tuple[tuple, int]:
    """``(shares, factors)`` of an element-wise product whose factors may be element-wise products themselves:
    ``(a * b) * c`` is the product of the three factors ``a``, ``b``, ``c`` (Prop. 3.2 for N factors: AttnLRP 1/3
    each, as ``torch.stack([a, b, c]).prod(0)`` gives them), so the factor ``a * b`` gets the rule's shares of its own
    factors (each of its kind) together, 2/3, and passes them on by halves; before, ``c`` got 1/2 and ``a`` and ``b``
    1/4 (26% of the largest relevance apart). ``factors``: how many factors with a share the product multiplies,
    recorded on its output (:py:attr:`~.marks.Marks.factors`) and read through copies and multiples by numbers or
    constant tensors of it (:py:meth:`~.marks.Marks.root`: ``(a * b).clone() * c``, ``(a * b).mul_(c)``). A rule
    whose shares do not sum to 1 (relevance patching's plain gradient) keeps its shares, and a product that is one
    factor of the products it enters (:py:func:`_one_function`: a product of gates, ``x * x``, ``x * sigmoid(x)``, as
    ``x ** 2`` and ``silu(x)`` are) is recorded as none."""
    counts = [state.marks.factors.get(state.marks.root(tensor_position(tensor))[0], 1) for tensor in found]
    if abs(sum(shares) - 1) > 1e-9 or _one_function(state, found, marks):
        return shares, 0
    if any(count > 1 for count in counts):
        expanded = rule.shares([kind for kind, count in zip(kinds, counts) for _ in range(count)])
        grouped, start = [], 0
        for count in counts:
            grouped.append(sum(expanded[start : start + count]))
            start += count
        shares = tuple(grouped)
    return shares, sum(count for count, share in zip(counts, shares) if share > 0)


def _rounded(shares) -> str:
    return '(' + ', '.join(f'{share:.3g}' for share in shares) + ')'


def _named(kinds, sinks=()) -> str:
    names = ['sink mass' if index in sinks else (kind or 'value') for index, kind in enumerate(kinds)]
    return '(' + ', '.join(names) + ')'


def _shared(call: Call, found: list[torch.Tensor], shares):
    """Run the product with each factor's gradient scaled by its share; where every relevance-carrying tensor is a
    factor with one share, the output's gradient is scaled once instead (one pass over the output in the backward
    instead of one per factor)."""
    if len(set(shares)) == 1 and len(found) == len(call.carrying):
        return scaled_gradient(call.run(), shares[0])
    scales, scaled = {}, {}
    for tensor, share in zip(found, shares):
        scales[id(tensor)] = share

    def swap(value):
        # each distinct tensor scaled once: ``x * x`` gives x the gradient 2 x g / 2, its relevance x^2 g
        if isinstance(value, torch.Tensor) and value.requires_grad:
            if id(value) not in scaled:
                scaled[id(value)] = scaled_gradient(value, scales.get(id(value), 1.0))
            return scaled[id(value)]
        if isinstance(value, (list, tuple)):
            return type(value)(swap(item) for item in value)
        return value

    return call.func(*swap(tuple(call.args)), **{key: swap(value) for key, value in call.kwargs.items()})


def _one_function(state: State, found: list, marks: list) -> bool:
    """Whether a product of two factors (with ``marks``) is one factor of the products it enters: a product of gates
    (a gate itself: ``sigmoid(a) * sigmoid(a)``, as ``sigmoid(a) ** 2`` is), or an element-wise function of one tensor,
    the tensor times itself up to numbers or constant tensors (``x * x``, ``x * (2 * x)``) or a value times an
    activation of it (``x * sigmoid(x)``: :py:meth:`~.marks.Marks.activation_of`)."""
    if len(found) != 2:
        return False
    if all(kind(mark) is not None for mark in marks):
        return True
    return _square(found, marks, None, state) or _activation_product(found, marks, None, state)


def _distributed(call: Call, state: State, found: list, shares, output):
    """The product ``a * (c + v)`` of a factor ``a`` and a factor offset by a number ``c`` (:py:func:`note_offset`)
    is the sum ``c a + a v`` (distributivity): ``c a``, a multiple of ``a``, passes its whole relevance to ``a``, and
    the product rule shares only ``a v`` (Prop. 3.2). With the rule's shares ``s`` (``_shared``) alone, ``a`` got the
    share ``s`` of ``c a`` and ``c`` absorbed the rest like a bias: Gemma 3n's AltUp correction ``innovation *
    (coefs + 1)`` kept 0.455 of the logit in two layers under CP-LRP, GPT-OSS's ``(up + 1) * glu`` 0.91, and ``a *
    (1 + v)`` got another relevance than ``a + a * v``. Here ``a``'s gradient gains ``(1 - s) c`` times the output's
    (a term of value 0, ``a - a.detach()``): its relevance is then ``s a v + c a`` of the output's, ``v``'s ``(1 -
    s) a v`` by the add, and the relevance is conserved. A factor whose offset is part of an activation (``1 +
    tanh(x)``: :py:func:`~.elementwise.activation_shift`) is none: its rule passes all of its relevance on."""
    if len(found) != 2 or found[0] is found[1]:
        return output
    for index, (tensor, share) in enumerate(zip(found, shares)):
        number = state.marks.offset_of(found[1 - index]) if share != 1 else None
        if number is not None:
            output = output + (1 - share) * number * (tensor - tensor.detach())
            call.note = f'{call.note}; the part of a factor offset by a number passed to the other factor whole'
    return output


def _refuse_linear_attention(call: Call, state: State, marks: list) -> None:
    """Check a product of several relevance-carrying tensors inside a sequence mixer that is not softmax attention
    (:py:func:`_mixer_product`), and refuse a product with a contraction of relevance-carrying tensors none of which
    is a softmax output (``q (k^T v)``: linear attention outside a declared recurrence)."""
    if state.runs:
        _mixer_product(call, state, state.runs[-1], marks)
    if any(mark is not None and mark.contraction for mark in marks):
        state.refuse(
            call.name,
            'a product with a contraction of relevance-carrying tensors that has no softmax (q (k^T v): linear '
            'attention, not softmax attention)',
            hint='AttnLRP (Achtibat et al. 2024) defines rules for softmax attention; zennit-attn explains '
            'linear attention where a declared recurrence computes it (zennit_attn.operations.recurrences: '
            'its keys and queries held constant), not written inline.',
        )


def _mixer_product(call: Call, state: State, run, marks: list) -> None:
    """A product of several relevance-carrying tensors (with ``marks``) inside a module named like a sequence mixer
    (``run``, a :py:class:`~zennit_attn.operations.recurrences.MixerRun`): inside a declared recurrence,
    refused unless the recurrence has gates (the product rule applies to them); in the mixer's own code, noted (the
    mixer is refused when it returns without having run a declared recurrence, unless a softmax output was a factor
    of one of its products: then it computes softmax attention, whatever its name)."""
    run.softmax = run.softmax or any(kind(mark) == SOFTMAX for mark in marks)
    recurrence = run.current
    if recurrence is not None and not recurrence.gates:
        state.refuse(
            call.name,
            f'a product of relevance-carrying tensors inside the recurrence {recurrence.name} '
            f'({recurrence.layer}), which is linear in its values once its constants are held',
        )
    if recurrence is None and run.product is None:
        run.product = (call.name, state.module_path())


def _sink_shares(rule, state: State, found: list, marks: list, sinks: list[int]) -> tuple[float, ...]:
    """``(softmax(z) @ V) * sigmoid(logsumexp(z) - s)`` is ``softmax([z, s]) @ [V; 0]`` (an attention sink): the
    product rule on that one product gives the extended softmax its share of the attention (AttnLRP 1/2, CP-LRP
    0), which the sink mass passes on, and the attention output its full gradient (its matrix product already
    shared it)."""
    share = rule.shares([SOFTMAX, None])[0]
    others = [mark for index, mark in enumerate(marks) if index not in sinks]
    if (
        len(sinks) != 1
        or len(others) != 1
        or not (share == 0 or (others[0] is not None and marks[sinks[0]].sink in others[0].attention))
    ):
        state.refuse(
            'sigmoid(logsumexp)',
            'an attention-sink mass that does not scale the attention output softmax(z) @ V of its own scores z',
        )
    return tuple(share if index == sinks[0] else 1.0 for index in range(len(found)))


def solve(call: Call, state: State):
    """A linear solve ``A^-1 B`` (``linalg.solve_triangular(A, B)``, ``linalg.solve(A, B)``: the UT transform of a
    chunked delta rule): linear in the right-hand side ``B``, the plain gradient; a relevance-carrying matrix
    ``A`` (the inverse of a relevance-carrying tensor) is refused."""
    matrix = call.argument('A', call.argument('input'))
    if isinstance(matrix, torch.Tensor) and matrix.requires_grad:
        state.refuse(call.name, 'a linear solve with a relevance-carrying matrix (its inverse)')
    return call.run()


def elements(call: Call, state: State):
    """``prod`` of the elements of one tensor along ``dim`` (all without): N factors of one kind, the product
    rule's share for N (1/N: Prop. 3.2)."""
    dim = call.argument('dim')
    count = call.carrying[0].numel() if dim is None else call.carrying[0].shape[dim]
    rule = state.product_rule_of(call)
    share = rule.shares(_kinds(rule, call.marks[:1]) * max(count, 1))[0]
    call.note = f'{rule!r}: share {share:.3g} of each of its {count} factors'
    return scaled_gradient(call.run(), share)


def scatter(call: Call, state: State):
    """A scatter: the plain gradient for sums, means, maxima and minima; for a product (``reduce='prod'``,
    ``'multiply'``) each output is the product of the input's entry (unless ``include_self=False``) and the
    source entries scattered to it: a factor the product rule makes constant (CP-LRP: a gate among input and
    source) is detached, and the output's gradient is divided by the number of its other relevance-carrying
    factors (Prop. 3.2)."""
    if call.argument('reduce') not in ('prod', 'multiply'):
        return call.run()
    if in_place(call.func, call.kwargs):
        return out_of_place(call, state, scatter)
    input, dim, index = call.argument('input'), call.argument('dim'), call.argument('index')
    source = next(call.argument(key) for key in ('src', 'source', 'value') if call.given(key))
    found = [tensor for tensor in (input, source) if isinstance(tensor, torch.Tensor) and tensor.requires_grad]
    marks = [state.marks.of(tensor) for tensor in found]
    rule = state.product_rule_of(call)
    shares = rule.shares(_kinds(rule, marks)) if len(found) > 1 else (1.0,)
    detached = {id(tensor): tensor.detach() for tensor, share in zip(found, shares) if share == 0}
    call.note = f'{rule!r}: a constant factor where its share is 0, else 1/N per output'
    if detached:
        call = call.without(detached)
        input, source = (replaced(item, detached) for item in (input, source))
    output = call.run()
    with torch.no_grad():
        counts = torch.zeros_like(output)
        if input.requires_grad and call.argument('include_self', True):
            counts += 1
        if isinstance(source, torch.Tensor) and source.requires_grad:
            if call.name == 'index_reduce':
                counts = counts.index_add(dim, index, torch.ones_like(source, dtype=output.dtype))
            else:
                counts = counts.scatter_add(
                    dim, index, torch.ones(index.shape, dtype=output.dtype, device=output.device)
                )
    return scaled_gradient(output, 1 / counts.clamp_min(1))


def attention(call: Call, state: State):
    """``scaled_dot_product_attention(q, k, v, mask)``: the product rule on ``q k^T`` and on ``softmax(.) V``,
    the softmax between them passing its share by its plain gradient (Prop. 3.1): query and key get their share
    of the scores' share (AttnLRP: 1/4 each), the values their share of the attention (AttnLRP: 1/2); a float mask
    that carries relevance is an additive term of the logits, the scores' share (CP-LRP: query, key and mask
    constant)."""
    dropout = call.argument('dropout_p', 0.0)
    if dropout:
        refuse_dropout(state, call.name, dropout)
    names = ('query', 'key', 'value')
    operands = [call.argument(name) for name in names]
    marks = [state.marks.of(tensor) if isinstance(tensor, torch.Tensor) else None for tensor in operands]
    biased = [mark for mark in marks if mark is not None and mark.bias is not None]
    if biased:  # an exponential in query, key or value
        refuse_bias(state, 'exp (used by scaled_dot_product_attention)', biased[0].bias)
    rule = state.product_rule_of(call)
    kinds = _kinds(rule, marks)
    scores_share, value_share = rule.shares([SOFTMAX, kinds[2]])
    query_share, key_share = rule.shares(kinds[:2])
    scales = {'query': query_share * scores_share, 'key': key_share * scores_share, 'value': value_share}
    values = {}
    for name, tensor in zip(names, operands):
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
            values[name] = scaled_gradient(tensor, scales[name])
    mask = call.argument('attn_mask')
    if isinstance(mask, torch.Tensor) and mask.requires_grad:
        values['attn_mask'] = scaled_gradient(mask, scores_share)
    call.note = (
        f'{rule!r}: query {scales["query"]:.3g}, key {scales["key"]:.3g}, value {scales["value"]:.3g} '
        f'(softmax rule between, Prop. 3.1)'
    )
    return call.run(**values)


def multiplied(call: Call, output, state: State) -> None:
    """The marks of a product (rules ``product``, ``elements``, ``scatter``): those of a linear operation
    (:py:func:`~zennit_attn.operations.marks.passed`: a gate where every relevance-carrying input is one, mixed
    where it contracts outputs of activations); a contraction of
    relevance-carrying factors none of which is a softmax output (a matrix product or a broadcast outer product:
    ``k^T v``) is marked a contraction, a matrix product with softmax factors an attention output (the logits of its
    softmaxes)."""
    if len(call.carrying) < 2:  # linear: marked as its factor; element-wise, a multiple of it (as on the fast path)
        if call.marks[0] is not None:
            passed(call, output, state)
        if call.entry.elementwise_product:
            note_scaling(call.func, call.args, call.kwargs, call.carrying[0], output, state, call.positions[0])
        return
    passed(call, output, state)
    if call.entry.rule != 'product':
        return
    found, marks = factors(call)
    if found is None or len(found) < 2:
        return
    if call.name == 'mul' and (
        _activation_product(found, marks, output, state) or _square(found, marks, output, state)
    ):
        state.marks.set(produced(call, output), ACTIVATED)
        return
    outer = call.name == 'mul' and len(found) == 2 and is_outer_product(*found)
    if not (call.entry.contraction or outer):
        return
    softmax = [mark for mark in marks if kind(mark) == SOFTMAX]
    outputs = produced(call, output)
    if not softmax:
        state.marks.add(outputs, contraction=True)
    elif call.entry.contraction:
        state.marks.add(outputs, attention=frozenset().union(*(mark.scores for mark in softmax)))


def _activation_product(found: list, marks: list, output, state: State) -> bool:
    """Whether a product of two relevance-carrying factors is an activation written out
    (:py:func:`_activated_value`)."""
    return _activated_value(found, marks, output, state) is not None


def _activated_value(found: list, marks: list, output, state: State) -> torch.Tensor | None:
    """The value ``x`` of a product of two relevance-carrying factors that is an activation written out: ``x`` times
    the output of an element-wise non-linearity of an element-wise function of ``x``
    (:py:meth:`~zennit_attn.operations.marks.Marks.activation_of`: ``x * sigmoid(x)``, ``x * sigmoid(1.702 x)``,
    GPT-OSS's ``gate * sigmoid(alpha * gate)``, GELU as ``0.5 x (1 + erf(x / sqrt(2)))``, hard swish as ``x *
    relu6(x + 3) / 6``), element by element: its output is an activation's output (a gate of CP-LRP), as that of
    ``silu(x)`` or ``gelu(x)`` is (``output`` None: before the product runs). None for any other product."""
    if len(found) != 2 or not (output is None or isinstance(output, torch.Tensor)):
        return None
    kinds = [kind(mark) for mark in marks]
    if ACTIVATION not in kinds or None not in kinds or marks[kinds.index(None)] is not None:
        return None
    value, gate = (found[0], found[1]) if kinds[1] == ACTIVATION else (found[1], found[0])
    if (output is None or output.shape == value.shape) and state.marks.activation_of(value, gate):
        return value
    return None


def _activation_written_out(call: Call, state: State, value: torch.Tensor, output):
    """The output of an activation written out as a product, ``x * f(x)`` (``value``: ``x``,
    :py:func:`_activated_value`), with the activation rule from ``x`` (the identity rule, Eq. 9), as its one-call
    spelling gets it: hard swish as ``x * relu6(x + 3) / 6`` that of ``hardswish(x)``, where the product rule would
    leave the number ``3`` inside ``f`` a share to absorb. Under a composite without an activation rule (the plain
    gradient) the product's own gradient."""
    call.note = 'a value times an activation of itself, one element-wise function: the activation rule'
    return state.activation(call, value, output, gate=True)


def _square(found: list, marks: list, output, state: State) -> bool:
    """Whether a product of two relevance-carrying values is a value times itself up to numbers or constant tensors
    (``x * x``, ``x * (2 * x)``: :py:meth:`~zennit_attn.operations.marks.Marks.root`), element by element: a square,
    an activation's output (a gate of CP-LRP) as that of ``x ** 2`` is. Its relevance is already the square's: both
    factors reach ``x`` whole (``output`` None: before the product runs)."""
    if len(found) != 2 or any(mark is not None for mark in marks):
        return False
    first, second = found
    shape = first.shape if output is None else getattr(output, 'shape', None)
    if not (first.shape == second.shape == shape and first.grad_fn is not None):
        return False
    return state.marks.root(tensor_position(first)) == state.marks.root(tensor_position(second))


def note_scaling(
    func, args: tuple, kwargs: dict, input: torch.Tensor, output, state: State, position: tuple | None = None
) -> None:
    """Note ``output`` of an element-wise product (not a matrix product or a layer, whose output may have the shape of
    its input too) as ``input`` multiplied by a number or a constant tensor where it is (``2 * a``, ``a.mul(2)``,
    ``weight * a``: a product of two arguments, one the factor; ``position``: that of ``input`` before the product,
    which an in-place product changes; :py:meth:`~zennit_attn.operations.marks.Marks.scale`)."""
    if len(args) == 2 and not kwargs:
        state.marks.scale(output, input, args[1] if args[0] is input else args[0], position)


#: The functions of the shift ``other - alpha input`` (``torch.rsub(x, c)``; ``c - x`` calls ``Tensor.__rsub__(x, c)``),
#: and those of ``input - alpha other``; every other shift is ``input + alpha other``.
_REFLECTED_SUBTRACTIONS = frozenset({'rsub', '__rsub__'})
_SUBTRACTIONS = frozenset({'sub', 'sub_', '__sub__', '__isub__', 'subtract', 'subtract_'})


def note_offset(func, args: tuple, kwargs: dict, carrying: list, output, state: State) -> None:
    """Note ``output`` of a shift (``x + c``, ``c + x``, ``x - c``, ``c - x``, ``torch.add(x, c, alpha=2)``, in place
    too) of one relevance-carrying tensor by a non-zero number ``c`` (or a tensor of no dimension that carries no
    relevance) as offset by the constant it adds (:py:meth:`~.marks.Marks.offset`), for the product rule
    (:py:func:`_distributed`); a negation ``-x`` as a multiple of ``x`` by -1 (:py:meth:`~.marks.Marks.scale`: ``x *
    sigmoid(-x)``, ``maximum(x, -x)`` are functions of ``x``)."""
    if len(carrying) != 1:  # a residual connection: no constant
        return
    if getattr(func, '__name__', '') in _NEGATIONS and args and args[0] is carrying[0]:
        state.marks.scale(output, carrying[0], -1)
        return
    first = kwargs['input'] if 'input' in kwargs else (args[0] if args else None)
    second = kwargs['other'] if 'other' in kwargs else (args[1] if len(args) > 1 else None)
    alpha = kwargs['alpha'] if 'alpha' in kwargs else (args[2] if len(args) > 2 else 1)
    if not (first is carrying[0] or second is carrying[0]):
        return
    constant = second if first is carrying[0] else first
    if not (_offset_constant(constant) and is_number(alpha)):
        return
    name = getattr(func, '__name__', '')
    if name in _REFLECTED_SUBTRACTIONS:  # other - alpha input
        number = constant if first is carrying[0] else -alpha * constant
    elif name in _SUBTRACTIONS:  # input - alpha other
        number = -alpha * constant if first is carrying[0] else constant
    else:  # input + alpha other
        number = alpha * constant if first is carrying[0] else constant
    state.marks.offset(output, number)


#: The names of the functions that negate a tensor (not in place: a tensor changed in place is not a multiple of
#: what it was).
_NEGATIONS = frozenset({'neg', 'negative', '__neg__'})


def _offset_constant(value) -> bool:
    """Whether ``value`` is a constant offset: a non-zero number, or a tensor of no dimension that carries no
    relevance."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.requires_grad and value.is_floating_point()
    return is_number(value) and value != 0


def attended(call: Call, output, state: State) -> None:
    """The marks of ``scaled_dot_product_attention``: ``softmax(q k^T) V``, a contraction of the softmax with the
    values, is a gate where they are a gate or constant (a softmax gate where they are softmax outputs or constant,
    else mixed)."""
    value = call.argument('value')
    mark = state.marks.of(value) if isinstance(value, torch.Tensor) and value.requires_grad else SOFTMAXED
    if mark is not None and mark.gate is not None and not state.in_recurrence:
        state.marks.set(produced(call, output), join_gates([SOFTMAXED, mark], mixes=True))
