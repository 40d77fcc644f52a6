"""What :py:class:`~zennit_attn.engine.canonizers.operations.OperationCanonizer` keeps track of across the operations of
one forward.

- *constants*: non-zero numbers and constant tensors (not additive masks) that the model adds to, or concatenates
  with, tensors that carry relevance: biases written into the model's code (sinusoidal positions computed in the
  forward, learned start states of a stream), which absorb relevance, so no conservation check can be exact;
- *cut-off tensors*: tensors computed from relevance-carrying ones while gradients are off (``torch.no_grad()``
  inside the forward, e.g. truncated backpropagation through a recurrence); combined with relevance-carrying tensors
  again, the relevance that flowed through them would be lost silently, so that is refused;
- *logit biases*: outputs of ``exp``, which has a rule (the identity rule, Eq. 9, for an element-wise function) only
  as part of an additive bias of attention logits ``z = q k^T / sqrt(d) + m`` (Doge's dynamic mask): such a tensor may
  pass through views, selections and masking, and must end in a softmax or as the mask of
  ``scaled_dot_product_attention``; any other use, or leaving the model, is refused.
"""

from __future__ import annotations

import weakref

import torch

from .registry import OPERATIONS, keeps


def _shape(name: str) -> str | None:
    entry = OPERATIONS.get(name)
    return None if entry is None else entry.shape


def tensors_of(value, found: list) -> list:
    """The tensors in ``value`` (a tensor, or lists and tuples of them), appended to ``found``."""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:  # tensors appended here, without a call per item (the mode runs this for every operation)
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, (list, tuple)):
                tensors_of(item, found)
    return found


class TensorMarks(dict):
    """Values by tensor identity, the tensors held weakly: ``marks[tensor] = value``, ``tensor in marks``,
    ``marks[tensor]``, ``marks.get(tensor)``. The mode looks up the operands of every operation: a lookup here makes
    no weak reference (unlike ``torch.utils.weak.WeakTensorKeyDictionary``), and an empty one is false without a
    call."""

    def __setitem__(self, tensor: torch.Tensor, value) -> None:
        super().__setitem__(id(tensor), (weakref.ref(tensor), value))

    def _entry(self, tensor):
        entry = dict.get(self, id(tensor))
        return entry if entry is not None and entry[0]() is tensor else None  # not a later tensor with a reused id

    def __contains__(self, tensor) -> bool:
        return self._entry(tensor) is not None

    def __getitem__(self, tensor):
        entry = self._entry(tensor)
        if entry is None:
            raise KeyError('tensor not marked')
        return entry[1]

    def get(self, tensor, default=None):
        entry = self._entry(tensor)
        return default if entry is None else entry[1]


class ConstantTensor(float):
    """The largest magnitude of a constant tensor that the model adds (see :py:meth:`Tracking.note_constant`);
    formats as a description of the tensor."""

    def __new__(cls, value: float, shape):
        result = super().__new__(cls, value)
        result.shape = tuple(shape)
        return result

    def __format__(self, spec: str) -> str:
        return f'tensor of shape {list(self.shape)} (largest |value| {float(self):{spec or "g"}})'


class Tracking:
    """The bookkeeping of :py:class:`~zennit_attn.engine.canonizers.operations.OperationCanonizer` (see the module's
    description); the canonizer provides ``module_path()`` (the modules being run), ``constants`` and ``refuse``."""

    constants: list

    def here(self) -> str:
        """The name of the innermost module of the model being run ('' for the model itself)."""
        path = self.module_path()
        return path[-1][0] if path else ''

    def start_tracking(self) -> None:
        """Forget the tensors of a previous forward (at the start of the model's forward)."""
        #: whether gradients were enabled when the model's forward began
        self.gradients = torch.is_grad_enabled()
        #: cut-off tensors and logit biases, each with the module path where it arose; normalisers ``g(x)`` (Prop. 3.4)
        #: with the operation that computed them
        #: (:py:meth:`~zennit_attn.engine.canonizers.elementwise.Elementwise.normaliser_use`)
        self.cut, self.biases, self.normalisers = TensorMarks(), TensorMarks(), TensorMarks()
        #: terms of recurrences (decays, gates: constants of the relevance pass) with the module path and what made
        #: them, and their autograd nodes (:py:meth:`~zennit_attn.engine.canonizers.recurrences.Recurrences.term_use`)
        self.terms, self.term_nodes = TensorMarks(), set()
        #: autograd nodes of contractions of relevance-carrying tensors without a softmax (``k^T v``: see
        #: :py:meth:`~zennit_attn.engine.canonizers.classifier.Classifier.refuse_linear_attention`)
        self.contractions: set = set()

    def note_constant(self, name: str, args, kwargs) -> None:
        """Record a non-zero number, or a constant tensor that is not an additive mask (entries 0 or <= -1e4), added to,
        subtracted from or concatenated with tensors that carry relevance."""
        values = (
            list(args[:2]) + [kwargs.get('other')]
            if name in {'add', 'sub'}
            else tensors_of(list(args[:1]) + [kwargs.get('tensors')], [])
        )
        numbers = [
            value for value in values if isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0
        ]
        if numbers:
            self.constants.append((self.here(), numbers[0]))
            return
        for tensor in values if not self.constants else ():  # a tensor's check reads its values: the first only
            if (
                isinstance(tensor, torch.Tensor)
                and tensor.is_floating_point()
                and not tensor.requires_grad
                and tensor not in self.cut
            ):
                data = tensor.detach()
                bias = data.masked_fill((data == 0) | (data <= -1e4), 0).abs()
                if bool(bias.any()):
                    self.constants.append((self.here(), ConstantTensor(float(bias.max()), tensor.shape)))
                    return

    def cut_off(self, name: str, args, output, tensors: list[torch.Tensor]):
        """Mark the floating-point outputs of an operation run without gradients (``torch.no_grad()`` inside the
        model's forward) whose values depend on relevance-carrying tensors: the relevance through them is cut off."""
        if not self.gradients or _shape(name) == 'constant':  # values, or booleans and indices, of no relevance
            return output
        sources = args[:1] if _shape(name) == 'view' else tensors  # ``x.view_as(y)``: the values of ``x``
        origin = next(
            (
                self.cut.get(tensor) or self.here()
                for tensor in sources
                if isinstance(tensor, torch.Tensor)
                and tensor.is_floating_point()
                and (tensor.requires_grad or tensor in self.cut)
            ),
            None,
        )
        if origin is not None:
            for tensor in tensors_of(output if isinstance(output, (list, tuple)) else [output], []):
                if tensor.is_floating_point() and not tensor.requires_grad:
                    self.cut[tensor] = origin
        return output

    def meets_cut(self, name: str, args, kwargs, tensors, carrying, division: bool) -> bool:
        """Refuse an operation that combines a cut-off tensor (see :py:meth:`cut_off`) with relevance-carrying ones
        (the relevance that flowed through it would be lost; a cut-off normaliser ``g(x)`` in a division is fine, it
        is a constant by Prop. 3.4); True for an operation on cut-off tensors alone (its output is cut off too)."""
        # the outputs of autograd functions (computed without gradients inside ``apply``) carry relevance afterwards
        cut = [tensor for tensor in tensors if not tensor.requires_grad and tensor in self.cut]
        if not cut or _shape(name) == 'constant':  # comparisons, indices: no relevance flows through them
            return False
        if not carrying:
            return True
        numerator = args[0] if args else kwargs.get('input')
        if division and not any(tensor is numerator for tensor in cut):
            return False
        self.refuse(
            name,
            f'a tensor computed without gradients (torch.no_grad()) from relevance-carrying tensors in '
            f'{self.cut[cut[0]]!r} meets relevance-carrying tensors: the relevance that flowed through it '
            'would be lost',
            hint='The model cuts the gradient there (e.g. truncated backpropagation through '
            'a recurrence); explain it with a configuration that computes every step with gradients.',
        )

    def mark_term(self, output, origin) -> None:
        """Mark the relevance-carrying tensors of ``output`` as terms of a recurrence (``origin``: the module path, the
        operation and a description of what computed them)."""
        for tensor in tensors_of(output if isinstance(output, (list, tuple)) else [output], []):
            if tensor.requires_grad:
                self.terms[tensor] = origin
                self.term_nodes.add(tensor.grad_fn)

    def of_terms(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` was computed (by a custom autograd function) from terms of a recurrence only."""
        inputs = [node for node, _ in tensor.grad_fn.next_functions if node is not None]
        return bool(inputs) and all(node in self.term_nodes for node in inputs)

    def mark_bias(self, output: torch.Tensor, origin=None) -> torch.Tensor:
        """Mark ``output`` as (part of) an additive bias of attention logits that must end in a softmax."""
        self.biases[output] = tuple(self.module_path()) if origin is None else origin
        return output

    def bias_use(self, name: str, func, args, kwargs, carrying):
        """Run an operation on a logit bias: views, selections, masking and adding keep it one (marked), a softmax or
        :py:meth:`attention` consumes it; anything else is refused (see the module's description). Returns None for
        the two consuming operations (the caller applies their rules)."""
        origin = next(self.biases[tensor] for tensor in carrying if tensor in self.biases)
        if name in {'softmax', '_softmax', 'scaled_dot_product_attention'}:
            return None
        if not keeps('bias', name):
            self.refuse_bias(f'exp (used by {name})', origin)
        output = func(*args, **kwargs)
        for tensor in tensors_of(output if isinstance(output, (list, tuple)) else [output], []):
            if tensor.requires_grad and tensor.is_floating_point():
                self.mark_bias(tensor, origin)
        return output

    def check_biases(self, tensors) -> None:
        """Refuse a logit bias among the outputs of the model (it never reached a softmax)."""
        for tensor in tensors:
            if tensor in self.biases:
                self.refuse_bias('exp', self.biases[tensor])

    def refuse_bias(self, op: str, origin) -> None:
        self.refuse(
            op,
            'an exponential that does not only enter attention logits additively (such a bias of the '
            'logits gets its share of the softmax rule, Prop. 3.1; any other use of exp has no AttnLRP rule)',
            path=list(origin),
        )
