"""Softmaxes in the classifying mode: the softmax rule (Prop. 3.1) and the softmaxes written in other ways; the handlers
of the registry's rules ``softmax``, ``log_softmax`` and ``logsumexp`` and of the log-softmax and logsumexp marks.

- ``softmax``: the plain gradient, which is the softmax rule (Prop. 3.1); rows whose logits are all ``-inf`` (a NaN
  output that the model replaces by a constant) pass nothing; its output is a softmax gate;
- a log-softmax ``z - logsumexp(z)`` or ``log_softmax(z)``, cast, viewed or selected (top-k, gather), then ``exp``:
  ``softmax(z)`` (routing weights computed in log space), its plain gradient (Prop. 3.1), a softmax gate; any other
  use of a log-softmax is refused;
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
from .marks import Mark, produced
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
    """The marks of a softmax: a softmax gate with the logits it was computed from."""
    scores = frozenset([state.marks.scores(call.argument('input'))])
    state.marks.set(produced(call, output), Mark(gate=SOFTMAX, scores=scores))


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
