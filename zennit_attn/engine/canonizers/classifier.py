"""The classifying mode of the engine: the rule of every torch operation a model performs on tensors that carry
relevance.

:py:class:`Classifier` is a :py:class:`torch.overrides.TorchFunctionMode` that the
:py:class:`~zennit_attn.engine.canonizers.operations.OperationCanonizer` enters for the time of a model's forward. For
each torch function called on a tensor that carries relevance (one that requires a gradient: the model's parameters
are frozen for the time of the context, so these are exactly the tensors computed from the explained inputs) it

1. names the operation and looks it up in the registry (:py:mod:`~zennit_attn.engine.canonizers.registry`);
2. inside a sequence mixer that is not softmax attention, holds the constants of its recurrence constant
   (:py:mod:`~zennit_attn.engine.canonizers.recurrences`), and checks where its operands come from: a custom
   autograd function (a kernel) is refused, a tensor computed without gradients inside the forward must not meet
   relevance again (:py:mod:`~zennit_attn.engine.canonizers.tracking`);
3. routes operations on marked tensors (a log-softmax or logsumexp, an attention-logit bias, a normaliser) to the
   handler of that mark;
4. applies the rule the registry declares, by :py:data:`HANDLERS`: the handlers live in
   :py:mod:`~zennit_attn.engine.canonizers.products`, :py:mod:`~zennit_attn.engine.canonizers.elementwise` and
   :py:mod:`~zennit_attn.engine.canonizers.softmax`; an operation the registry does not know, or declares refused, is
   refused by name (:py:class:`~zennit_attn.engine.errors.UnsupportedModelError`);
5. audits it (:py:mod:`zennit_attn.engine.audit`): each relevance-carrying operand must have been produced or
   sanctioned by the engine (or be an explained input), and the output is recorded as produced.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from ..audit import AUDITED_GETTERS, AUDITED_METADATA, Audit
from .elementwise import Elementwise
from .graph import log_softmax_scores, lse_scores
from .products import Products
from .recurrences import Recurrences
from .registry import OPERATIONS, in_place, op_name
from .softmax import Softmaxes
from .tracking import tensors_of

__all__ = ['Classifier', 'HANDLERS']

#: The handler (a method of :py:class:`Classifier`) of each rule of the registry; ``metadata`` is not dispatched.
HANDLERS = {
    'plain': 'plain',
    'product': 'product',
    'elements': 'elements',
    'scatter': 'scatter',
    'division': 'division',
    'solve': 'solve',
    'elementwise': 'elementwise',
    'bound': 'elementwise',
    'normaliser': 'elementwise',
    'power': 'elementwise',
    'exp': 'elementwise',
    'statistic': 'statistic',
    'softmax': 'softmax',
    'log_softmax': 'log_softmax',
    'logsumexp': 'logsumexp',
    'attention': 'attention',
    'normalisation': 'normalisation',
    'running_norm': 'running_norm',
    'decomposed': 'decomposed',
    'refused': 'refused',
}


class Classifier(Products, Elementwise, Softmaxes, Recurrences, TorchFunctionMode):
    """The torch function mode of :py:class:`~zennit_attn.engine.canonizers.operations.OperationCanonizer` (see the
    module's description); ``canonizer`` holds the composite's rules and what the mode tracks across the operations of
    one forward, and refuses what has no rule."""

    def __init__(self, canonizer):
        super().__init__()
        self.canonizer = canonizer
        #: what the engine produced or sanctioned in this forward (:py:mod:`zennit_attn.engine.audit`)
        self.audit = Audit(canonizer.root)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        canonizer = self.canonizer
        name = op_name(func)
        entry = OPERATIONS.get(name)
        if entry is not None and entry.rule == 'metadata':
            if self.audit.open and (name in AUDITED_METADATA or (name == 'get' and func in AUDITED_GETTERS)):
                return self.audit.metadata(canonizer, name, func, args, kwargs)
            return func(*args, **kwargs)
        gradients = torch.is_grad_enabled()
        if gradients and canonizer.opaque:
            return func(*args, **kwargs)
        tensors = tensors_of(args, tensors_of(list(kwargs.values()), []) if kwargs else [])
        if not gradients:
            return canonizer.cut_off(name, args, func(*args, **kwargs), tensors)
        carrying = [tensor for tensor in tensors if tensor.requires_grad]
        division = entry is not None and entry.rule == 'division'
        if canonizer.cut and canonizer.meets_cut(name, args, kwargs, tensors, carrying, division):
            return canonizer.cut_off(name, args, func(*args, **kwargs), tensors)
        if canonizer.runs:  # inside a sequence mixer: the constants of its recurrence
            args, kwargs, carrying = self.held_constant(args, kwargs, carrying)
        if not carrying:
            return func(*args, **kwargs)
        for tensor in carrying:
            canonizer.check_origin(tensor)
        return self.audited(name, func, args, kwargs, tensors, carrying)

    def audited(self, name: str, func, args, kwargs, tensors: list[torch.Tensor], carrying: list[torch.Tensor]):
        """Refuse an operand the engine did not produce or sanction
        (:py:meth:`~zennit_attn.engine.audit.Audit.refusal`), classify the operation (:py:meth:`marked`) and record
        its outputs, and the tensors it changed in place, as produced by the engine."""
        refusal = self.audit.refusal(carrying)
        if refusal is not None:
            self.canonizer.refuse(name, *refusal)
        output = self.marked(name, func, args, kwargs, carrying)
        self.audit.record(output)
        if name == 'setitem' or _writes(func, kwargs):
            self.audit.record_changed(tensors)
        return output

    def marked(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """Route an operation on a tensor with a mark of the engine to the mark's handler (a log-softmax, a logsumexp,
        an attention-logit bias, a normaliser, a term of a recurrence), else :py:meth:`dispatch`
        it."""
        canonizer = self.canonizer
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
        if canonizer.terms and any(tensor in canonizer.terms for tensor in carrying):
            return self.term_use(name, func, args, kwargs, carrying)
        return self.dispatch(name, func, args, kwargs, carrying)

    def dispatch(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """Apply the rule the registry declares for the operation ``name`` (``func``) on relevance-carrying tensors
        (``carrying``); refuse an operation it does not declare."""
        entry = OPERATIONS.get(name)
        if entry is None:
            self.canonizer.refuse(name)
        return getattr(self, HANDLERS[entry.rule])(name, func, args, kwargs, carrying)

    def plain(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """The plain gradient (linear, structural, selection and constant-valued operations: Eq. 8 with epsilon ->
        0); a constant the model adds to, or joins with, relevance-carrying tensors is noted (it absorbs relevance,
        like a bias: :py:meth:`~zennit_attn.engine.canonizers.tracking.Tracking.note_constant`)."""
        if OPERATIONS[name].shape in {'shift', 'join'}:
            self.canonizer.note_constant(name, args, kwargs)
        return func(*args, **kwargs)

    def refused(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """An operation the registry refuses, with its reason."""
        self.canonizer.refuse(name, OPERATIONS[name].reason)


#: Whether each function changes its first argument in place (by its name: ``mul_``, ``__imul__``), by function: the
#: audit asks for every classified operation.
_IN_PLACE: dict = {}


def _writes(func, kwargs: dict) -> bool:
    """Whether ``func`` called with ``kwargs`` changes its first argument in place
    (:py:func:`~.registry.in_place`)."""
    try:
        changes = _IN_PLACE[func]
    except KeyError:
        changes = _IN_PLACE[func] = in_place(func)
    except TypeError:  # an unhashable callable
        changes = in_place(func)
    return changes or kwargs.get('inplace') is True
