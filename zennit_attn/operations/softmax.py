"""Softmaxes in the classifying mode: the softmax rule (Prop. 3.1) and the softmaxes written in other ways; the handlers
of the registry's rules ``softmax``, ``log_softmax`` and ``logsumexp`` and of the log-softmax and logsumexp marks.

- ``softmax``: the plain gradient, which is the softmax rule (Prop. 3.1); rows whose logits are all ``-inf`` (a NaN
  output that the model replaces by a constant) pass nothing; its output is a softmax gate;
- a log-softmax ``z - logsumexp(z)`` or ``log_softmax(z)``, cast, viewed or selected (top-k, gather), then ``exp``:
  ``softmax(z)`` (routing weights computed in log space), its plain gradient (Prop. 3.1), a softmax gate; any other
  use of a log-softmax is refused;
- a softmax written out, ``exp(z) / exp(z).sum(d, keepdim=True)`` (or ``e / e.sum(d).unsqueeze(d)``, ``e *
  e.sum(d, keepdim=True).reciprocal()``, ``e /= e.sum(...)``; the same ``z`` exponentiated once or twice, shifted by
  its maximum or not): ``softmax(z, d)``, its plain gradient (Prop. 3.1), a softmax gate, as the one-call spelling
  gets (:py:func:`sum_of_exponentials`, :py:func:`exp_sum_use`); any other use of the sum of exponentials is refused;
- ``sigmoid(logsumexp(z) - s)``: the mass of the real columns of a softmax extended by a constant sink logit ``s``:
  ``softmax([z, s])_i = softmax(z)_i * sigmoid(logsumexp(z) - s)``, so ``(softmax(z) @ V) * sigmoid(logsumexp(z) -
  s)`` is the attention ``softmax([z, s]) @ [V; 0]`` with a sink column whose value is zero. Its plain gradient is the
  softmax rule (Prop. 3.1) on the extended softmax, and it is a softmax gate (a sink mass, see
  :py:mod:`~zennit_attn.operations.products`); any other use of a ``logsumexp`` is refused.
"""

from __future__ import annotations

import torch

from ..rules.products import SOFTMAX
from .calls import Call, in_place
from .graph import SoftmaxInput
from .marks import CASTS, Mark, produced
from .tracking import State

__all__ = [
    'softmax',
    'log_softmax',
    'logsumexp',
    'sink_mass',
    'log_softmax_use',
    'softmaxed',
    'log_softmaxed',
    'summed_exponentials',
    'sum_of_exponentials',
    'exp_sum_use',
]


def softmax(call: Call, state: State):
    """The plain gradient (Prop. 3.1), zero for rows that the softmax turns into NaN (every logit ``-inf``): the
    model replaces their output by a constant (``masked_fill``), so no relevance flows through them."""
    alias = SoftmaxInput.apply(call.argument('input'))
    output = call.run(input=alias)
    dim = call.argument('dim', None)
    # a row of a softmax is NaN everywhere or nowhere (its normaliser is NaN): its first entry tells, and the node keeps
    # that mask instead of the output (which a checkpointed block must not keep alive)
    alias.grad_fn.nan_rows = torch.isnan(output.detach() if dim is None else output.detach().narrow(dim, 0, 1))
    call.note = 'the softmax rule (Prop. 3.1): its plain gradient'
    return output


def log_softmax(call: Call, state: State):
    """``log_softmax(z)``: the softmax's plain gradient, marked as a log-softmax (:py:func:`log_softmax_use`)."""
    output = softmax(call, state)
    call.note = 'a log-softmax: only exponentiated (exp of it is softmax(z), Prop. 3.1)'
    return output


def logsumexp(call: Call, state: State):
    """``logsumexp(z)``: its plain gradient, marked with the dimensions it reduced (:py:func:`sink_mass`)."""
    call.note = 'a logsumexp: only the normaliser of a log-softmax or the mass of an attention sink'
    return call.run()


def softmaxed(call: Call, output, state: State) -> None:
    """The marks of a softmax: a softmax gate with the logits it was computed from; over a dimension of one element
    (the routing weight of one selected expert, ``softmax(top_1_logits)``) the constant 1, a unit (a constant factor
    of every product rule, :py:func:`~zennit_attn.operations.products.product`)."""
    input, dim = call.argument('input'), call.argument('dim', None)
    scores = frozenset([state.marks.scores(input)])
    unit = isinstance(dim, int) and input.dim() > 0 and input.shape[dim] == 1
    state.marks.set(produced(call, output), Mark(gate=SOFTMAX, scores=scores, unit=unit))


def log_softmaxed(call: Call, output, state: State) -> None:
    """The marks of ``log_softmax(z)``: a log-softmax of ``z``."""
    state.marks.set(produced(call, output), Mark(log_softmax=state.marks.scores(call.argument('input'))))


def summed_exponentials(call: Call, output, state: State) -> None:
    """The marks of ``logsumexp(z)``: a logsumexp of ``z`` over the dimensions it reduced."""
    input = call.argument('input')
    dim = call.argument('dim', ())
    dims = tuple(item % input.dim() for item in ((dim,) if isinstance(dim, int) else dim))
    state.marks.set(produced(call, output), Mark(lse=(state.marks.scores(input), dims, False)))


def _is_log_softmax(state: State, logits, lse: torch.Tensor) -> bool:
    """Whether ``logits - lse`` is the log-softmax ``z - logsumexp(z)``: ``lse`` is the logsumexp of ``logits`` (up to
    casts) over some dimensions, kept (or unsqueezed back) so that it broadcasts along exactly those, viewed or cast,
    not shifted."""
    mark = state.marks.of(lse)
    if mark is None or mark.lse is None or not isinstance(logits, torch.Tensor):
        return False
    scores, dims, shifted = mark.lse
    if shifted or state.marks.scores(logits) is not scores:
        return False
    reduced = tuple(1 if index in dims else size for index, size in enumerate(logits.shape))
    padded = (1,) * (logits.dim() - lse.dim()) + tuple(lse.shape)
    return padded in (reduced, tuple(logits.shape))


def sink_mass(call: Call, state: State):
    """An operation on a ``logsumexp(z)``: ``sigmoid(logsumexp(z) - s)`` for a constant sink logit ``s`` is the
    mass of the real columns of the softmax of ``z`` extended by ``s``, its plain gradient (Prop. 3.1 on the
    extended softmax), a softmax gate; ``z - logsumexp(z)`` is a log-softmax (marked, see :py:func:`log_softmax_use`);
    views, selections and constant shifts (not negations: ``s - logsumexp(z)`` is another function) keep it a
    logsumexp; any other use is refused."""
    name, args, carrying = call.name, call.args, call.carrying
    scores, dims, shifted = next(mark.lse for mark in call.marks if mark is not None and mark.lse is not None)
    reflected = getattr(call.func, '__name__', '') in {'__rsub__', 'rsub'}
    if (
        name == 'sub'
        and not reflected
        and len(carrying) == 2
        and len(args) > 1
        and call.kwargs.get('alpha', 1) == 1
        and _is_log_softmax(state, args[0], args[1])
    ):
        output = call.run()
        state.marks.set(produced(call, output), Mark(log_softmax=scores))
        call.note = 'z - logsumexp(z): a log-softmax'
        return output
    if len(carrying) == 1 and name == 'sigmoid':
        output = call.run()
        state.marks.set(produced(call, output), Mark(gate=SOFTMAX, scores=frozenset([scores]), sink=scores))
        call.note = (
            'sigmoid(logsumexp(z) - s): the mass of a softmax extended by a sink, its plain gradient (Prop. 3.1)'
        )
        return output
    entry = call.entry
    moved = name not in {'neg', 'rsub'} and (name != 'sub' or args[0] is carrying[0])
    if len(carrying) == 1 and not reflected and entry is not None and 'lse' in entry.keeps and moved:
        output = call.run()
        lse = (scores, dims, shifted or entry.shape == 'shift')
        state.marks.set(produced(call, output), Mark(lse=lse))
        call.note = 'a logsumexp, moved or shifted by a constant'
        return output
    state.refuse(
        f'logsumexp (used by {name})',
        'a logsumexp that is not the mass sigmoid(logsumexp(z) - s) of a softmax extended by a constant sink logit '
        's (an attention sink) nor the normaliser of a log-softmax z - logsumexp(z)',
    )


def log_softmax_use(call: Call, state: State):
    """An operation on a log-softmax of ``z``: casts, views and selections keep it one; its ``exp`` is
    ``softmax(z)`` (a selection of it), a softmax gate with its plain gradient, the softmax rule (Prop. 3.1); any
    other use is refused."""
    name, args, carrying = call.name, call.args, call.carrying
    scores = next(mark.log_softmax for mark in call.marks if mark is not None and mark.log_softmax is not None)
    changed = in_place(call.func, call.kwargs)
    if len(carrying) == 1 and not changed and name == 'exp' and args and args[0] is carrying[0]:
        output = call.run()
        state.marks.set(produced(call, output), Mark(gate=SOFTMAX, scores=frozenset([scores])))
        call.note = 'exp of a log-softmax: a softmax, its plain gradient (Prop. 3.1)'
        return output
    if len(carrying) == 1 and not changed and call.entry is not None and 'log_softmax' in call.entry.keeps:
        output = call.run()
        state.marks.set(produced(call, output), Mark(log_softmax=scores))
        call.note = 'a log-softmax, moved'
        return output
    state.refuse(
        f'log_softmax (used by {name})',
        'a log-softmax z - logsumexp(z) that is not exponentiated (exp(z - logsumexp(z)) is softmax(z), Prop. 3.1; '
        'a log-softmax itself has no AttnLRP rule)',
    )


def sum_of_exponentials(call: Call, state: State):
    """``exp(z).sum(d)`` (over one dimension, kept or not): the normaliser of a softmax written out, its plain gradient,
    marked as the sum of the exponentials of ``z`` (:py:func:`exp_sum_use`); None where ``call`` is not such a sum (a
    sum over several dimensions, or of an exponential the engine did not record, such as one changed since)."""
    input = call.argument('input')
    exponent = state.marks.exponent(input)
    dim = call.argument('dim')
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    if exponent is None or len(call.carrying) != 1 or not isinstance(dim, int) or call.kwargs.get('dtype') is not None:
        return None
    output = call.run()
    kept = bool(call.argument('keepdim', False))
    summed = (state.marks.scores(exponent), dim % input.dim(), kept, False)
    state.marks.set(produced(call, output), Mark(exp_sum=summed))
    call.note = 'a sum of exponentials: the normaliser of a softmax written out'
    return output


def exp_sum_use(call: Call, state: State, softmax_entry):
    """An operation on a sum of exponentials ``S = exp(z).sum(d)`` (:py:func:`sum_of_exponentials`);
    ``softmax_entry``: the registry's declaration of ``softmax``.

    ``unsqueeze(d)`` of an unkept sum keeps ``d``; a cast keeps it; ``reciprocal``, ``1 / S`` and ``S ** -1`` make
    its reciprocal. ``exp(z) / S`` and ``exp(z) * (1 / S)`` (also in place), with ``S`` kept along ``d`` and the
    numerator an exponential of the same logits ``z`` (the same tensor, or ``z`` exponentiated again), are
    ``softmax(z, d)``: the values the model computes, with the plain gradient of ``softmax(z, d)`` (Prop. 3.1: the
    softmax rule, as :py:func:`softmax` applies it, or the composite's override of ``softmax``) and its marks (a
    softmax gate), so that a softmax written out is explained as the one-call spelling is. Any other use is
    refused."""
    carrying, name = call.carrying, call.name
    mark = next(mark.exp_sum for mark in call.marks if mark is not None and mark.exp_sum is not None)
    if len(carrying) == 1 and not in_place(call.func, call.kwargs):
        changed = _moved_sum(call, mark)
        if changed is not None:
            output = call.run()
            state.marks.set(produced(call, output), Mark(exp_sum=changed))
            call.note = 'a sum of exponentials, moved'
            return output
    numerator = _numerator(call, state, mark)
    if numerator is not None:
        return _written_softmax(call, state, numerator, mark[1], softmax_entry)
    state.refuse(
        f'a sum of exponentials (used by {name})',
        'exp(z).sum(d) used otherwise than to divide exp(z) into softmax(z, d) (kept along d: keepdim=True or '
        'unsqueeze(d)); a softmax written out has the softmax rule (Prop. 3.1), other uses of exp have no AttnLRP rule',
        hint='Compute the attention weights with torch.softmax, or divide exp(z) by its sum directly.',
    )


def _moved_sum(call: Call, mark: tuple) -> tuple | None:
    """The mark of a sum of exponentials after ``call`` moved it without changing what it is: ``unsqueeze(d)`` of
    a sum that did not keep ``d``, a cast or copy, the reciprocal (``reciprocal``, ``1 / S``, ``S ** -1``) of one that
    is not a reciprocal yet; None for any other operation."""
    scores, dim, kept, inverse = mark
    name, args, input = call.name, call.args, call.carrying[0]
    if name in ('unsqueeze', 'getitem') and not kept and args and args[0] is input:
        where = _unsqueezed(call, input)
        return (scores, dim, True, inverse) if where == dim else None
    if name in CASTS:
        return mark  # the same values at the same places
    if inverse:
        return None
    if name == 'reciprocal' or (name == 'reciprocal_scaled' and _number(call, input) == 1):
        return (scores, dim, kept, True)
    if name == 'pow' and args[0] is input and call.argument('exponent') == -1:
        return (scores, dim, kept, True)
    return None


def _unsqueezed(call: Call, input: torch.Tensor) -> int | None:
    """The dimension ``call`` inserts into ``input`` (of the output, from 0): ``unsqueeze(d)``, or ``input[..., None]``
    (the last); None for any other operation."""
    if call.name == 'unsqueeze':
        where = call.args[1] if len(call.args) > 1 else call.kwargs.get('dim')
        return where % (input.dim() + 1) if isinstance(where, int) else None
    index = call.args[1] if len(call.args) > 1 else None
    return input.dim() if index == (Ellipsis, None) else None


def _number(call: Call, input: torch.Tensor):
    """The number ``c`` of ``c / input`` (None where it is not a number)."""
    others = [value for value in (*call.args, *call.kwargs.values()) if value is not input]
    return others[0] if len(others) == 1 and isinstance(others[0], (int, float)) else None


def _numerator(call: Call, state: State, mark: tuple) -> torch.Tensor | None:
    """The exponential ``exp(z)`` that ``call`` divides by its sum ``S`` (``e / S``, ``e * (1 / S)``, in place or not),
    None where ``call`` is not that division: ``S`` kept along its dimension (the exponential's shape with 1 there),
    ``e`` an exponential of the logits ``S`` sums the exponentials of."""
    scores, dim, kept, inverse = mark
    args, carrying = call.args, call.carrying
    if len(carrying) != 2 or len(args) < 2 or not kept or call.kwargs.get('rounding_mode') is not None:
        return None
    first, second = args[0], args[1]
    if call.name == 'div' and not inverse and getattr(call.func, '__name__', '') != '__rtruediv__':
        pairs = [(first, second)]
    elif call.name == 'mul' and inverse:
        pairs = [(first, second), (second, first)]
    else:
        return None
    for numerator, divisor in pairs:
        exponent = state.marks.exponent(numerator)
        divisor_mark = state.marks.of(divisor) if isinstance(divisor, torch.Tensor) else None
        if exponent is None or divisor_mark is None or divisor_mark.exp_sum != mark:
            continue
        if state.marks.scores(exponent) is not scores or dim >= numerator.dim():
            continue
        shape = list(numerator.shape)
        shape[dim] = 1
        if list(divisor.shape) == shape:
            return numerator
    return None


def _written_softmax(call: Call, state: State, numerator: torch.Tensor, dim: int, entry):
    """``softmax(z, dim)`` for ``call``, the division of ``numerator = exp(z)`` by its sum: the model's own values
    (``call`` run, in place where it changes ``numerator``), with the gradient and the marks of ``torch.softmax`` as
    the registry declares it (``entry``, applied by the mode's dispatch: the softmax rule, or the composite's override
    of ``softmax``)."""
    exponent = state.marks.exponent(numerator)
    values = call.run()
    softmax_call = Call(torch.softmax, 'softmax', entry, (exponent, dim), {}, [exponent], [state.marks.of(exponent)])
    probabilities = state.dispatch(softmax_call, state)
    mark = state.marks.of(probabilities)
    explained = values.detach() + (probabilities - probabilities.detach())
    if in_place(call.func, call.kwargs):  # the model keeps the tensor it divided: it holds the softmax now
        explained = values.copy_(explained)
    state.marks.set([explained], mark)
    call.note = 'exp(z) / exp(z).sum(d): a softmax written out, its plain gradient (Prop. 3.1)'
    return explained
