"""The state of the classifying mode across the operations of one forward (:py:class:`State`), which every handler of
the registry receives, and what it keeps track of:

- *marks* of relevance-carrying tensors (:py:mod:`~zennit_attn.operations.marks`);
- *constants*: non-zero numbers and constant tensors (not additive masks) that the model adds to, or concatenates
  with, tensors that carry relevance: biases written into the model's code (sinusoidal positions computed in the
  forward, learned start states of a stream), which absorb relevance, so no conservation check can be exact;
- *cut-off tensors*: tensors computed from relevance-carrying ones while gradients are off (``torch.no_grad()``
  inside the forward, e.g. truncated backpropagation through a recurrence); combined with relevance-carrying tensors
  again, the relevance that flowed through them would be lost silently, so that is refused;
- *logit biases*: outputs of ``exp``, which has a rule (the identity rule, Eq. 9, for an element-wise function) only
  as part of an additive bias of attention logits ``z = q k^T / sqrt(d) + m`` (Doge's dynamic mask): such a tensor may
  pass through views, selections and masking, and must end in a softmax or as the mask of
  ``scaled_dot_product_attention``, or be normalised by its own sum into a softmax written out
  (``exp(z) / exp(z).sum(d, keepdim=True)``, :py:mod:`~zennit_attn.operations.softmax`); any other use, or leaving the
  model, is refused;
- for a dry run (:py:class:`RuleTable`), the rule each operation got and why.
"""

from __future__ import annotations

import functools
import inspect
import re
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ..core.audit import Audit, sanction
from ..core.errors import UnsupportedModelError
from ..rules.base import rule_node
from ..rules.products import ProductRule
from .calls import Call, is_number, tensors_of
from .marks import Mark, Marks

__all__ = [
    'State',
    'TensorMarks',
    'ConstantTensor',
    'RuleTable',
    'RuleRow',
    'Override',
    'refuse_bias',
    'refuse_dropout',
    'produced_tensors',
    'KERNEL_HINTS',
    'TRUSTED_FUNCTIONS',
]


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
    """The largest magnitude of a constant tensor that the model adds (see :py:meth:`State.note_constant`); formats
    as a description of the tensor."""

    def __new__(cls, value: float, shape):
        result = super().__new__(cls, value)
        result.shape = tuple(shape)
        return result

    def __format__(self, spec: str) -> str:
        return f'tensor of shape {list(self.shape)} (largest |value| {float(self):{spec or "g"}})'


#: The arguments of a shift (``add``, ``sub``, ``neg``, ...) that it adds, by name (:py:meth:`State.note_constant`).
_ADDED = ('input', 'other')

#: Packages whose autograd functions are trusted (their outputs are the ones the rules produce or plain torch).
TRUSTED_FUNCTIONS = ('torch.', 'zennit.', 'zennit_attn.', 'bitsandbytes.')

#: What to do when transformers calls the kernel of an installed package for a recurrence (by the package's import
#: name): transformers chooses the kernel when the package is importable, with no per-model switch; its torch path is
#: the same function, which zennit-attn explains (:py:mod:`~zennit_attn.operations.recurrences`).
KERNEL_HINTS = {
    package: (
        f'transformers runs this kernel because {distribution} is installed; zennit-attn explains the torch path of '
        f'the same recurrence, which transformers runs where {distribution} is not installed: explain in an '
        f'environment without it (pip uninstall {distribution}).'
    )
    for package, distribution in {
        'mamba_ssm': 'mamba-ssm',
        'causal_conv1d': 'causal-conv1d',
        'fla': 'flash-linear-attention',
    }.items()
}


@dataclass(frozen=True)
class Override:
    """The rule a composite gives one operation instead of the engine's (see
    :py:func:`~zennit_attn.operations.registry.check_overrides`): a product rule, an activation rule (an object
    with ``elementwise(input, output, gate)``) or a function ``function(func, args, kwargs)`` that computes the
    operation's output with the gradient of its rule."""

    name: str
    product_rule: ProductRule | None = None
    activation_rule: object = None
    function: Callable | None = None

    def __str__(self) -> str:
        rule = self.function if self.function is not None else (self.product_rule or self.activation_rule)
        return getattr(rule, '__qualname__', None) or repr(rule)


@dataclass(frozen=True)
class RuleRow:
    """One line of a :py:class:`RuleTable`: an operation in a module (layers of a stack merged: ``layers.*``), the rule
    the registry declares for it and what the engine does there, how often."""

    module: str
    operation: str
    rule: str
    how: str
    count: int


#: Indices of a stack of modules in a module path (``model.layers.3.mlp``): merged in a rule table.
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$|')|^\d+(?=\.|$)")


@dataclass
class RuleTable:
    """Which rule each operation of a model gets under a composite, and why, found in one forward pass without a
    backward pass (:py:meth:`~zennit_attn.composites.attnlrp.AttnLRPComposite.rule_table`).

    Attributes
    ----------
    model: str
        The model's class name.
    composite: str
        The composite (its class name and product rule).
    refusals: list of str
        What the explanation would refuse (the first refusal stops an explanation; the dry run goes on past each with
        the plain gradient to show the rest).
    """

    model: str
    composite: str
    refusals: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter, repr=False)

    @property
    def rows(self) -> list[RuleRow]:
        """One per operation, module (the layers of a stack merged) and rule, in the order first met."""
        return [RuleRow(*key, count) for key, count in self.counts.items()]

    def record(self, module: str, operation: str, rule: str, how: str) -> None:
        """Count one operation."""
        self.counts[(_INDEX.sub('*', module), operation, rule, how)] += 1

    def refuse(self, message: str) -> None:
        """Note a refusal (each once, the layers of a stack merged)."""
        message = _INDEX.sub('*', message)
        if message not in self.refusals:
            self.refusals.append(message)

    def operations(self) -> dict[str, set[str]]:
        """``{operation: {rule, ...}}`` over the whole model."""
        found: dict[str, set[str]] = {}
        for row in self.rows:
            found.setdefault(row.operation, set()).add(row.rule)
        return found

    def __str__(self) -> str:
        header = ('module', 'operation', 'rule', 'what the engine does', 'count')
        lines = [(row.module or '(model)', row.operation, row.rule, row.how, str(row.count)) for row in self.rows]
        widths = [max(len(line[index]) for line in [header, *lines]) for index in range(4)]
        text = [f'rules of {self.model} under {self.composite} (dry run: no backward pass)']
        for line in [header, *lines]:
            text.append('  '.join(value.ljust(width) for value, width in zip(line[:4], widths)) + '  ' + line[4])
        text += [f'refused: {message}' for message in self.refusals] or ['refused: nothing']
        return '\n'.join(text)


@dataclass(eq=False)
class State:
    """What the classifying mode knows during one forward of a model: the composite's rules, the marks of the tensors
    it produced, what it keeps track of (see the module's description) and how to refuse. Every handler of the
    registry receives it with the :py:class:`~zennit_attn.operations.calls.Call` it handles.

    Attributes
    ----------
    rules: list of ProductRule
        The product rules of the scopes being run, innermost last (shared with the engine, which pushes and pops).
    activation_rule: object or None
        The rule of element-wise non-linearities (``elementwise(input, output, gate)``), None for the plain gradient.
    overrides: mapping of str to Override
        Rules of single operations that replace the engine's (by operation name).
    constants: list
        ``(module path, value)`` of every non-zero number the model adds to relevance (shared with the engine).
    refuse: callable
        ``refuse(op, what=None, hint=None, path=None)``: raise the refusal of an operation (never returns).
    module_path: callable
        ``module_path()``: the modules being run, outermost first, with their names.
    gradients: bool
        Whether gradients were enabled when the model's forward began.
    opaque: int
        How many modules whose inside is left to their module rule are being run.
    runs: list of MixerRun
        The sequence mixers that are not softmax attention being run, innermost last
        (:py:class:`~zennit_attn.operations.recurrences.MixerRun`).
    marks: Marks
        The marks of the tensors produced in this forward.
    cut: TensorMarks
        Cut-off tensors with the module path where they arose.
    trusted: set
        Autograd node classes whose outputs were accepted (custom functions of trusted packages, torch's own).
    table: RuleTable or None
        Where a dry run records the rule of each operation.
    dispatch: callable
        ``dispatch(call, state)``: apply the rule the registry declares (set by the mode).
    mode: TorchFunctionMode or None
        The classifying mode, entered again by the handlers of composite functions.
    audit: Audit
        What the engine produced or sanctioned in this forward (:py:mod:`zennit_attn.core.audit`).
    layers: dict
        The parameters of the layers whose rule of the composite changes their gradient, by ``id``: a list of
        ``(module path, module, rule in words)``, one per layer that holds the parameter
        (:py:meth:`~zennit_attn.canonizers.OperationCanonizer.guard_layers`).
    running: dict
        How many calls of each of those layers are being run, by ``id`` of the module.
    inline: dict
        The parameters of modules that are not layers, by ``id``: ``(path, module, rule, rule in words)``, the rule of
        a linear map the model computes with them.
    signs: TensorMarks
        Outcomes of comparing a relevance-carrying tensor with 0 (``x > 0``): ``(position of the tensor compared, its
        sign where true)`` (:py:func:`~.elementwise.note_sign`), by which a rectifier written with them is told.
    """

    rules: list
    activation_rule: object = None
    overrides: Mapping[str, Override] = field(default_factory=dict)
    constants: list = field(default_factory=list)
    refuse: Callable = None
    module_path: Callable = list
    gradients: bool = True
    opaque: int = 0
    runs: list = field(default_factory=list)
    marks: Marks = field(default_factory=Marks)
    cut: TensorMarks = field(default_factory=TensorMarks)
    trusted: set = field(default_factory=set)
    table: RuleTable | None = None
    dispatch: Callable = None
    mode: object = None
    audit: Audit = field(default_factory=lambda: Audit(open=False))
    layers: dict = field(default_factory=dict)
    running: dict = field(default_factory=dict)
    inline: dict = field(default_factory=dict)
    signs: TensorMarks = field(default_factory=TensorMarks)

    @property
    def product_rule(self) -> ProductRule:
        """The product rule of the innermost scope being run."""
        return self.rules[-1]

    def product_rule_of(self, call: Call) -> ProductRule:
        """The product rule of ``call``: the composite's override of its operation, else that of the innermost scope
        being run."""
        return call.product_rule if call.product_rule is not None else self.rules[-1]

    @property
    def in_recurrence(self) -> bool:
        """Whether the operation being classified runs inside a declared recurrence."""
        return bool(self.runs) and self.runs[-1].current is not None

    def recorded(self, check: Callable, *args):
        """Run ``check(*args)`` and return what it returns; in a dry run (:py:attr:`table`) a refusal it raises is
        recorded instead (and None returned)."""
        if self.table is None:
            return check(*args)
        try:
            return check(*args)
        except UnsupportedModelError as error:
            self.table.refuse(str(error))
            return None

    def here(self) -> str:
        """The name of the innermost module of the model being run ('' for the model itself)."""
        path = self.module_path()
        return path[-1][0] if path else ''

    def activation(self, call: Call, input: torch.Tensor, output: torch.Tensor, gate: bool = True) -> torch.Tensor:
        """``output``, an element-wise function of ``input``, with the activation rule of ``call`` (``gate``: the
        output of a non-linearity, as opposed to a bound or rounding)."""
        rule = call.activation_rule if call.activation_rule is not None else self.activation_rule
        if rule is None:
            return output
        if not _takes_compute(getattr(rule.elementwise, '__func__', rule.elementwise)):  # one's own: three arguments
            return rule.elementwise(input, output, gate=gate)
        return rule.elementwise(input, output, gate=gate, compute=call.again(input))

    def check_origin(self, tensor: torch.Tensor) -> None:
        """Refuse a tensor computed by an autograd function of another package (a custom kernel); a function of terms
        of a recurrence is a term itself."""
        node = type(tensor.grad_fn)
        forward = getattr(node, '_forward_cls', None)  # a class attribute of the nodes of Python autograd functions
        if forward is not None and not forward.__module__.startswith(TRUSTED_FUNCTIONS):
            if self.marks.routed and self.of_terms(tensor):  # a function of terms of a recurrence: a term itself
                self.mark_term(tensor, (self.module_path(), forward.__qualname__, 'a custom function of terms'))
                sanction(tensor)
                return
            package = forward.__module__.split('.')[0]
            self.refuse(
                f'{forward.__module__}.{forward.__qualname__}',
                'a custom autograd function (kernel)',
                hint=KERNEL_HINTS.get(package),
            )
        if rule_node(tensor.grad_fn) is not None:
            self.marks.rule_nodes.add(node)
        self.trusted.add(node)

    # ---------------------------------------------------------------------------------------------- constants
    def note_constant(self, shape: str, args: tuple, kwargs: dict) -> None:
        """Record a non-zero number, or a constant tensor that is not an additive mask (entries 0 or <= -1e4), added to
        or subtracted from (``shape`` ``'shift'``: the arguments ``input`` and ``other``, the first two) or concatenated
        with (``'join'``: the tensors of the first argument, ``tensors``) tensors that carry relevance."""
        if shape == 'shift':
            values = [*args[:2], *(value for key, value in kwargs.items() if key in _ADDED)]
        else:
            values = tensors_of([kwargs.get('tensors', args[:1])], [])
        if all(isinstance(value, torch.Tensor) and value.requires_grad for value in values):
            return  # relevance-carrying tensors only (a residual connection): nothing added
        numbers = [value for value in values if is_number(value) and value != 0]
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

    # ------------------------------------------------------------------------------------------- cut-off tensors
    def cut_off(self, entry, args, output, tensors: list[torch.Tensor]):
        """Mark the floating-point outputs of an operation (declared ``entry``) run without gradients
        (``torch.no_grad()`` inside the model's forward) whose values depend on relevance-carrying tensors: the
        relevance through them is cut off."""
        shape = entry.shape if entry is not None else None
        if not self.gradients or shape == 'constant':  # values, or booleans and indices, of no relevance
            return output
        sources = args[:1] if shape == 'view' else tensors  # ``x.view_as(y)``: the values of ``x``
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

    def meets_cut(self, name: str, entry, args, kwargs, tensors, carrying) -> bool:
        """Refuse an operation that combines a cut-off tensor (see :py:meth:`cut_off`) with relevance-carrying ones
        (the relevance that flowed through it would be lost; a cut-off normaliser ``g(x)`` in a division is fine, it
        is a constant by Prop. 3.4); True for an operation on cut-off tensors alone (its output is cut off too)."""
        # the outputs of autograd functions (computed without gradients inside ``apply``) carry relevance afterwards
        cut = [tensor for tensor in tensors if not tensor.requires_grad and tensor in self.cut]
        if not cut or (entry is not None and entry.shape == 'constant'):  # comparisons, indices: no relevance
            return False
        if not carrying:
            return True
        numerator = args[0] if args else kwargs.get('input')
        if entry is not None and entry.rule == 'division' and not any(tensor is numerator for tensor in cut):
            return False
        self.refuse(
            name,
            f'a tensor computed without gradients (torch.no_grad()) from relevance-carrying tensors in '
            f'{self.cut[cut[0]]!r} meets relevance-carrying tensors: the relevance that flowed through it '
            'would be lost',
            hint='The model cuts the gradient there (e.g. truncated backpropagation through '
            'a recurrence); explain it with a configuration that computes every step with gradients.',
        )

    # ------------------------------------------------------------------------------------------------- terms
    def mark_term(self, output, origin) -> None:
        """Mark the relevance-carrying tensors of ``output`` as terms of a recurrence (``origin``: the module path, the
        operation and a description of what computed them)."""
        tensors = [tensor for tensor in tensors_of(output, []) if tensor.requires_grad]
        self.marks.set(tensors, Mark(term=origin))

    def of_terms(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` was computed (by a custom autograd function) from terms of a recurrence only."""
        inputs = [node for node, _ in tensor.grad_fn.next_functions if node is not None]
        marks = [self.marks.get(node) for node in inputs]
        return bool(inputs) and all(mark is not None and mark.term is not None for mark in marks)

    # -------------------------------------------------------------------------------------------- logit biases
    def mark_bias(self, output, origin=None) -> None:
        """Mark the relevance-carrying floating-point tensors of ``output`` as (parts of) an additive bias of attention
        logits that must end in a softmax."""
        origin = tuple(self.module_path()) if origin is None else origin
        tensors = [tensor for tensor in produced_tensors(output) if tensor.is_floating_point()]
        self.marks.set(tensors, Mark(bias=origin))

    def check_biases(self, tensors) -> None:
        """Refuse a logit bias among the outputs of the model (it never reached a softmax)."""
        for tensor in tensors:
            mark = self.marks.of(tensor)
            if mark is not None and mark.bias is not None:
                refuse_bias(self, 'exp', mark.bias)


def produced_tensors(output) -> list[torch.Tensor]:
    """The relevance-carrying tensors of ``output`` (a tensor, or lists and tuples of them)."""
    return [tensor for tensor in tensors_of(output, []) if tensor.requires_grad]


def refuse_bias(state: State, op: str, origin) -> None:
    """Refuse the operation ``op`` on an exponential computed at ``origin`` (a module path) that is not (yet) an
    additive bias of attention logits."""
    state.refuse(
        op,
        'an exponential that does not only enter attention logits additively (such a bias of the '
        'logits gets its share of the softmax rule, Prop. 3.1; any other use of exp has no AttnLRP rule). An '
        'activation written with exp (SiLU as x / (1 + exp(-x)), softplus as log(1 + exp(x)), tanh as (exp(2x) - '
        '1) / (exp(2x) + 1)) gets its rule when called as its torch function (F.silu, F.softplus, torch.tanh)',
        path=list(origin),
    )


def refuse_dropout(state: State, op: str, p) -> None:
    """Refuse the operation ``op``, dropout that drops (probability ``p > 0`` in training mode) on relevance-carrying
    tensors: the explanation would be that of one random draw, another at every call, of a logit that is not the
    model's (a dropout module outside the module tree, which ``model.eval()`` does not reach, or ``training=True``
    written into the code)."""
    state.refuse(
        op,
        f'dropout with probability {p} in training mode (it drops values at random: the explanation would be that '
        'of one random draw, another at every call, of a logit the model does not compute in evaluation mode)',
        hint='Explain the model without dropout: call model.eval() (also on dropout modules it keeps outside its '
        'module tree), pass training=False (or self.training) to functional dropout, dropout_p=0 to '
        'scaled_dot_product_attention.',
    )


@functools.lru_cache(maxsize=256)
def _takes_compute(elementwise) -> bool:
    """Whether an activation rule's ``elementwise`` takes ``compute=`` (the function again, so that the rule need not
    keep the output: :py:meth:`~zennit_attn.rules.gradient.Identity.elementwise`); rules of one's own may take only
    ``(input, output, gate)``."""
    try:
        return 'compute' in inspect.signature(elementwise).parameters
    except (TypeError, ValueError):
        return False
