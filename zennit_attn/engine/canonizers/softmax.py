"""Softmaxes in the classifying mode: the softmax rule (Prop. 3.1) and the softmaxes written in other ways.

- ``softmax``: the plain gradient, which is the softmax rule (Prop. 3.1); rows whose logits are all ``-inf`` (a NaN
  output that the model replaces by a constant) pass nothing;
- a log-softmax ``z - logsumexp(z)`` or ``log_softmax(z)``, cast, viewed or selected (top-k, gather), then ``exp``:
  ``softmax(z)`` (routing weights computed in log space), its plain gradient (Prop. 3.1), a softmax output where it
  enters a product; any other use of a log-softmax is refused;
- ``sigmoid(logsumexp(z) - s)``: the mass of the real columns of a softmax extended by a constant sink logit ``s``
  (an attention sink, see :py:mod:`~zennit_attn.engine.canonizers.graph`); any other use of a ``logsumexp`` is
  refused.
"""

from __future__ import annotations

import torch

from .graph import (
    ExpLogSoftmax,
    LogSoftmaxMark,
    LogSumExpMark,
    SinkMass,
    SoftmaxInput,
    is_log_softmax,
    log_softmax_scores,
    lse_scores,
    scores_node,
)
from .registry import in_place, keeps
from .tracking import tensors_of

__all__ = ['Softmaxes']


class Softmaxes:
    """The softmax handlers of :py:class:`~zennit_attn.engine.canonizers.classifier.Classifier` (a mixin: it reads
    ``self.canonizer``)."""

    canonizer: object

    @staticmethod
    def softmax(name: str, func, args, kwargs, carrying: list[torch.Tensor] | None = None):
        """The plain gradient (Prop. 3.1), zero for rows that the softmax turns into NaN (every logit ``-inf``): the
        model replaces their output by a constant (``masked_fill``), so no relevance flows through them."""
        input = args[0] if args else kwargs.pop('input')
        alias = SoftmaxInput.apply(input)
        output = func(alias, *args[1:], **kwargs)
        dim = args[1] if len(args) > 1 else kwargs.get('dim')
        # a row of a softmax is NaN everywhere or nowhere (its normaliser is NaN): its first entry tells, and the node
        # keeps that mask instead of the output (which a checkpointed block must not keep alive)
        alias.grad_fn.nan_rows = torch.isnan(output.detach() if dim is None else output.detach().narrow(dim, 0, 1))
        return output

    def log_softmax(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """``log_softmax(z)``: the softmax's plain gradient, marked as a log-softmax (:py:meth:`log_softmax_use`)."""
        self.canonizer.lse = True
        return LogSoftmaxMark.apply(self.softmax(name, func, args, kwargs), scores_node(carrying[0]))

    def logsumexp(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """``logsumexp(z)``: marked with the dimensions it reduced (:py:meth:`sink_mass`)."""
        self.canonizer.lse = True
        dim = args[1] if len(args) > 1 else kwargs.get('dim', ())
        dims = [item % carrying[0].dim() for item in ((dim,) if isinstance(dim, int) else dim)]
        return LogSumExpMark.apply(func(*args, **kwargs), scores_node(carrying[0]), dims)

    def sink_mass(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """An operation on a ``logsumexp(z)``: ``sigmoid(logsumexp(z) - s)`` for a constant sink logit ``s`` is the
        mass of the real columns of the softmax of ``z`` extended by ``s``, its plain gradient (Prop. 3.1 on the
        extended softmax); ``z - logsumexp(z)`` is a log-softmax (marked, see :py:meth:`log_softmax_use`); views,
        selections and constant shifts (not negations: ``s - logsumexp(z)`` is another function) keep it a
        logsumexp; any other use is refused."""
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
        shifted = name not in {'neg', 'rsub'} and (name != 'sub' or args[0] is carrying[0])
        if len(carrying) == 1 and not reflected and keeps('logsumexp', name) and shifted:
            return func(*args, **kwargs)
        self.canonizer.refuse(
            f'logsumexp (used by {name})',
            'a logsumexp that is not the mass sigmoid(logsumexp(z) - s) of a softmax extended by a constant sink logit '
            's (an attention sink) nor the normaliser of a log-softmax z - logsumexp(z)',
        )

    def log_softmax_use(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """An operation on a log-softmax of ``z``: casts, views and selections keep it one; its ``exp`` is
        ``softmax(z)`` (a selection of it), marked as a softmax output
        (:py:class:`~zennit_attn.engine.canonizers.graph.ExpLogSoftmax`) with its plain gradient, the softmax rule
        (Prop. 3.1); any other use is refused."""
        changed = in_place(func, kwargs)
        if len(carrying) == 1 and not changed and name == 'exp' and args and args[0] is carrying[0]:
            return ExpLogSoftmax.apply(func(*args, **kwargs), log_softmax_scores(carrying[0]))
        if len(carrying) == 1 and not changed and keeps('log_softmax', name):
            output = func(*args, **kwargs)
            outputs = tensors_of(output if isinstance(output, (list, tuple)) else [output], [])
            if all(log_softmax_scores(tensor) is not None for tensor in outputs if tensor.requires_grad):
                return output
        self.canonizer.refuse(
            f'log_softmax (used by {name})',
            'a log-softmax z - logsumexp(z) that is not exponentiated (exp(z - logsumexp(z)) is softmax(z), Prop. 3.1; '
            'a log-softmax itself has no AttnLRP rule)',
        )
