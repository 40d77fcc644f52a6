"""What the engine knows of a tensor that carries relevance: its *marks*, set by the classifying mode on the outputs of
the operations it classifies, as the registry declares them (:py:mod:`~zennit_attn.operations.registry`: each
operation's rule says which marks it produces, and its ``keeps`` which marks of its inputs it passes on), whatever
the spelling of the operations in between.

Marks are kept per autograd node (the ``grad_fn`` of the tensor: a tensor changed in place has a new one) for one
forward pass (:py:class:`Marks`). The outputs of the composite's own module rules, which the mode does not classify,
are read from their nodes (:py:func:`~zennit_attn.rules.base.rule_node`): an activation's identity rule makes a
gate, a rescaling by a constant of the relevance pass keeps the marks of its input.

- *gate* (:py:attr:`Mark.gate`): ``'softmax'`` for a softmax output (also written as ``exp`` of a log-softmax, or the
  mass of an attention sink), ``'activation'`` for the output of an element-wise non-linearity: a constant factor of
  CP-LRP (Ali et al. 2022) where it enters a product. A linear function of softmax outputs alone, with constant
  coefficients, is a softmax gate however it is written (views, selections, joins, writes into a constant tensor,
  masks, sums, rescalings, contractions with constants: combined or mixed attention weights ``p1 - 0.3 p2``, routing
  weights summed, scattered into a dense matrix or renormalised). What moves or combines outputs of activations
  element by element keeps them gates (views, selections, joins, writes, masks, shifts and rescalings by constants,
  products of gates); what sums them over positions or contracts them (``sum``, ``silu(h) @ W``, a linear layer, and
  so also ``(silu(h)[..., None] * W).sum(-2)``) is ``'mixed'``: a value for the product rules (an MLP's output), a
  gate only as the divisor of gates (``w / w.sum()``: a renormalisation). A function of a gate and another
  relevance-carrying tensor is not a gate, nor is anything a declared recurrence computes (its values mixed with
  input-dependent coefficients, which it holds constant: :py:mod:`~zennit_attn.operations.recurrences`);
- *scores* of a softmax gate: the logits its softmaxes were computed from (their autograd nodes, casts looked
  through), and *attention*: the scores of the softmax factors of a matrix product (an attention output), *sink*:
  the scores of an attention sink's mass ``sigmoid(logsumexp(z) - s)``
  (:py:mod:`~zennit_attn.operations.softmax`);
- *contraction*: a contraction of relevance-carrying tensors without a softmax (``k^T v``), which must not meet
  another product (linear attention: :py:mod:`~zennit_attn.operations.products`);
- *log-softmax*, *logsumexp*, *sum of exponentials* (``exp(z).sum(d)``, the normaliser of a softmax written out)
  (:py:mod:`~zennit_attn.operations.softmax`), *bias* (an exponential that must end in attention logits or be
  normalised into a softmax), *normaliser* ``g(x)`` (:py:mod:`~zennit_attn.operations.elementwise`) and *term*
  of a recurrence (:py:mod:`~zennit_attn.operations.recurrences`): an operation on a tensor with one of these
  marks goes to the mark's handler (:py:data:`ROUTES`), which decides what the use is.

Besides the marks, :py:class:`Marks` keeps what a tensor is a view, cast or centring of (:py:meth:`Marks.sources`),
from which the engine tells whether a normaliser normalises a tensor
(:py:func:`~zennit_attn.operations.graph.normalises`), and the logits a cast of logits stands for
(:py:meth:`Marks.scores`), and what a tensor is a multiple of by a number (:py:meth:`Marks.root`), from which it
tells an activation written out as a product, ``x * sigmoid(x)``: a gate, as ``silu(x)`` is
(:py:meth:`Marks.activation_of`).
"""

from __future__ import annotations

import torch

from ..rules.base import rule_input, rule_node
from ..rules.products import ACTIVATION, SOFTMAX
from .calls import is_number, tensor_position

__all__ = [
    'Mark',
    'Marks',
    'ROUTES',
    'CASTS',
    'COPIES',
    'note_copy',
    'EXTREMA',
    'extremum_of_multiples',
    'ACTIVATED',
    'SOFTMAXED',
    'MIXED',
    'join_gates',
    'kind',
    'produced',
    'passed',
    'same_elements',
]

#: The marks whose tensors go to a handler of their own, in the order in which one is chosen where the operands of an
#: operation carry several.
ROUTES = ('log_softmax', 'lse', 'exp_sum', 'bias', 'normaliser', 'term')


#: The fields of a :py:class:`Mark`.
_FIELDS = (
    'gate',
    'scores',
    'sink',
    'attention',
    'contraction',
    'log_softmax',
    'lse',
    'exp_sum',
    'bias',
    'normaliser',
    'term',
    'unit',
)


class Mark:
    """The marks of one tensor (see the module's description); not changed once made (:py:meth:`with_` makes
    another).

    Attributes
    ----------
    gate: str or None
        ``'softmax'`` or ``'activation'`` for a gate, ``'mixed'`` for a sum or contraction of gates, else None.
    scores: frozenset
        For a softmax gate: the autograd nodes of the logits of its softmaxes.
    sink: object
        For the mass of an attention sink: the node of its logits.
    attention: frozenset
        For a matrix product with softmax factors: the nodes of their logits.
    contraction: bool
        A contraction of relevance-carrying tensors without a softmax.
    log_softmax: object
        For a log-softmax: the node of its logits.
    lse: tuple or None
        For a logsumexp ``logsumexp(z)``: ``(node of z, dimensions reduced, whether shifted by a constant)``.
    exp_sum: tuple or None
        For a sum of exponentials ``exp(z).sum(d)``: ``(node of z, d, whether d is kept with size 1, whether it is
        the sum's reciprocal)`` (:py:func:`~zennit_attn.operations.softmax.exp_sum_use`).
    bias: tuple or None
        For an exponential that must end in attention logits (or be divided by its sum into a softmax): the module
        path where it was computed.
    normaliser: str or None
        For a normaliser ``g(x)``: the operation that computed it.
    term: tuple or None
        For a term of a recurrence: ``(module path, operation, what computed it)``.
    unit: bool
        The constant 1 computed from relevance-carrying tensors (a tensor divided by itself: a softmax over one
        element, routing weights renormalised over one selected expert), and linear functions of such alone: a
        constant factor of every product rule (:py:func:`~zennit_attn.operations.products.product`).
    route: str or None
        The first of :py:data:`ROUTES` it carries (set from the fields).
    """

    __slots__ = _FIELDS + ('route',)

    def __init__(
        self,
        gate: str | None = None,
        scores: frozenset = frozenset(),
        sink=None,
        attention: frozenset = frozenset(),
        contraction: bool = False,
        log_softmax=None,
        lse: tuple | None = None,
        exp_sum: tuple | None = None,
        bias: tuple | None = None,
        normaliser: str | None = None,
        term: tuple | None = None,
        unit: bool = False,
    ):
        self.gate, self.scores, self.sink, self.attention, self.contraction = gate, scores, sink, attention, contraction
        self.log_softmax, self.lse, self.exp_sum, self.bias = log_softmax, lse, exp_sum, bias
        self.normaliser, self.term, self.unit = normaliser, term, unit
        routes = (log_softmax, lse, exp_sum, bias, normaliser, term)  # in the order of ROUTES
        self.route = next((name for name, value in zip(ROUTES, routes) if value is not None), None)

    def with_(self, **fields) -> Mark:
        """This mark with ``fields`` changed."""
        values = {name: getattr(self, name) for name in _FIELDS}
        values.update(fields)
        return Mark(**values)

    def __repr__(self) -> str:
        fields = ', '.join(f'{name}={getattr(self, name)!r}' for name in _FIELDS if getattr(self, name) != _EMPTY[name])
        return f'Mark({fields})'


#: The gate of a sum or contraction of gates (see the module's description).
MIXED = 'mixed'
#: The mark of an activation's output.
ACTIVATED = Mark(gate=ACTIVATION)
_MIXED = Mark(gate=MIXED)
#: The mark of a softmax output.
SOFTMAXED = Mark(gate=SOFTMAX)
_EMPTY = {name: getattr(Mark(), name) for name in _FIELDS}
_MISSING = object()


def join_gates(marks, mixes: bool = False) -> Mark | None:
    """The gate of a linear or multilinear function of tensors with ``marks`` (one per relevance-carrying input): a
    gate where every input is one: ``'softmax'`` where all are softmax outputs (their scores joined), ``'mixed'``
    where the function sums or contracts outputs of activations (``mixes``) or some input is mixed, else
    ``'activation'``; None where some input is not a gate."""
    if len(marks) == 1 and not mixes:
        mark = marks[0]
        if mark is None or mark.gate is None:
            return None
        if mark.sink is None and not mark.attention and not mark.contraction and mark.route is None:
            return mark
        return Mark(gate=mark.gate, scores=mark.scores, unit=mark.unit)
    kinds, scores = set(), set()
    for mark in marks:
        if mark is None or mark.gate is None:
            return None
        kinds.add(mark.gate)
        scores |= mark.scores
    if kinds == {SOFTMAX}:
        return Mark(gate=SOFTMAX, scores=frozenset(scores), unit=all(mark.unit for mark in marks))
    if mixes or MIXED in kinds:
        return _MIXED
    return ACTIVATED


def kind(mark: Mark | None) -> str | None:
    """The kind of a factor with ``mark`` as the product rules read it: ``'softmax'``, ``'activation'``, else None (a
    value, also a mixed gate)."""
    if mark is None or mark.gate == MIXED:
        return None
    return mark.gate


def produced(call, output) -> list[torch.Tensor]:
    """The relevance-carrying tensors an operation produced: those of its output, or its first argument where it
    changes that in place and returns nothing (``x[i] = y``)."""
    if output is None:
        first = call.args[0] if call.args else None
        return [first] if isinstance(first, torch.Tensor) and first.requires_grad else []
    if isinstance(output, torch.Tensor):
        return [output] if output.requires_grad else []
    if isinstance(output, (list, tuple)):
        return [item for item in output if isinstance(item, torch.Tensor) and item.requires_grad]
    return []


#: Casts and copies: they change neither a tensor's values nor their places, so what the engine knows of the tensor
#: holds for their output (a sum of exponentials, :py:func:`~.softmax.exp_sum_use`; a sign,
#: :py:func:`~.elementwise.note_sign`).
CASTS = frozenset('to type type_as float double half bfloat16 contiguous clone cpu cuda'.split())

#: Operations whose output is a copy of their input's values in their order (casts, reshapes) and reductions that are
#: one where every dimension they reduce has one element (:py:meth:`Marks.copy_of`).
COPIES = CASTS | frozenset('view view_as reshape reshape_as flatten unflatten squeeze unsqueeze'.split())
_ONE_ELEMENT_REDUCTIONS = frozenset({'sum', 'mean', 'nansum'})
_STABILISERS = frozenset({'add', 'sub', 'clamp', 'clamp_min', 'clip'})

#: Element-wise extrema of two tensors: of a tensor and a multiple of it (``maximum(x, 0.1 x)``), a piecewise linear
#: element-wise function of it (leaky ReLU, PReLU with a weight tensor), an activation
#: (:py:func:`extremum_of_multiples`).
EXTREMA = frozenset({'maximum', 'minimum', 'fmax', 'fmin'})


def extremum_of_multiples(call, state) -> bool:
    """Whether ``call`` is an element-wise extremum (:py:data:`EXTREMA`) of a relevance-carrying tensor and a multiple
    of it by a number or a constant tensor (:py:meth:`Marks.root`), outside a declared recurrence: a piecewise linear
    element-wise function of that tensor (``maximum(x, 0.1 x)`` is ``leaky_relu(x, 0.1)``), whose output is a gate as
    an activation's is (its plain gradient is the identity rule's, Eq. 9)."""
    if call.name not in EXTREMA or len(call.carrying) != 2 or call.held or state.in_recurrence:
        return False
    if call.carrying[0].shape != call.carrying[1].shape:  # broadcast against each other: not element by element
        return False
    first, second = (tensor_position(tensor) for tensor in call.carrying)
    return state.marks.multiple_of(first, state.marks.root(second))


def same_elements(output: torch.Tensor, input: torch.Tensor, copies: bool = True) -> bool:
    """Whether ``output``, a view, cast or copy of ``input``, holds the elements of ``input`` in their order: a copy of
    its shape (``clone``, ``contiguous``, a cast), a view of its shape over the same memory with the same strides (a
    transpose or permutation of equal sizes is not: ``x.T`` of a square ``x``), or a view of a contiguous ``input`` that
    reshapes it (``x[None]``, ``x.view(-1)``, ``x.unsqueeze(1)``: its elements in the same order, contiguous).
    ``copies``: whether ``output`` is computed by a view or cast, so that a copy of ``input``'s shape holds its
    elements in their order (not a selection: ``x[[2, 1, 0]]`` is a copy of a square ``x``'s shape)."""
    if output.shape == input.shape and not output._is_view():
        return copies
    if not output._is_view() or output.data_ptr() != input.data_ptr():
        return False
    if output.shape == input.shape and output.stride() == input.stride():
        return True
    return output.numel() == input.numel() and output.is_contiguous() and input.is_contiguous()


def passed(call, output, state, mixes: bool | None = None) -> None:
    """The marks of a linear operation (by its declaration's ``keeps`` and ``mixes``): a gate where every
    relevance-carrying input is one and the operation keeps gates (:py:func:`join_gates`, mixed where it ``mixes``;
    not inside a declared recurrence, nor where the engine holds relevance-carrying factors constant); where one input
    carries relevance, its sink mass, attention output and contraction where the operation keeps them. A view or cast
    of one tensor, a shift and a selection note what they are computed from (:py:func:`_noted`). ``mixes``: whether
    it contracts its inputs (default: its declaration's)."""
    shape, marks, carrying = call.entry.shape, call.marks, call.carrying
    if shape not in _NOTED and not any(marks):
        return
    outputs = produced(call, output)
    if not outputs:
        return
    if shape == 'view' and len(carrying) > 1:  # ``x.type_as(y)``, ``x.view_as(y)``: the values of ``x``
        first = call.args[0] if call.args else None
        marks = [mark for tensor, mark in zip(carrying, marks) if tensor is first] or marks
        carrying = [tensor for tensor in carrying if tensor is first] or carrying
    _noted(shape, outputs, carrying, state)
    note_copy(call.name, carrying, outputs, state.marks)
    if any(marks):
        mark = _passed(call, marks, state, call.entry.mixes if mixes is None else mixes)
        if mark is not None:
            state.marks.set(outputs, mark)


#: The shapes of linear operations that note what their outputs are computed from (:py:func:`_noted`).
_NOTED = frozenset({'view', 'shift', 'selection'})


def _noted(shape: str, outputs: list, carrying: list, state) -> None:
    """Note what the ``outputs`` of a linear operation of ``shape`` are computed from: a view or cast of one tensor
    what it views (:py:meth:`Marks.viewed`, :py:meth:`Marks.sources`), a shift what it shifts (:py:meth:`Marks.derive`),
    a selection of one tensor that views all its elements the tensor (:py:meth:`Marks.selected`)."""
    if shape == 'view' and len(carrying) == 1:
        for tensor in outputs:
            state.marks.viewed(tensor, carrying[0])
    elif shape == 'shift':
        state.marks.derive(outputs, carrying)
    elif shape == 'selection' and len(carrying) == 1:
        for tensor in outputs:
            state.marks.selected(tensor, carrying[0])


def note_copy(name: str, carrying: list, outputs: list, marks: Marks) -> None:
    """Note an output of the operation ``name`` that is a copy of its one relevance-carrying input's values in their
    order (:py:data:`COPIES`; a sum or mean over dimensions of one element; a copy shifted or bounded by a constant
    that changes none of its values, the stabiliser of a renormalisation, ``w.sum(-1, keepdim=True) + 1e-20`` of
    DeepSeek-V3's router, ``clamp(w.sum(-1, keepdim=True), min=1e-12)`` of ERNIE-4.5-MoE's) in
    :py:attr:`Marks.copies`."""
    if len(carrying) != 1 or len(outputs) != 1 or outputs[0].grad_fn is carrying[0].grad_fn:
        return
    if (
        name in COPIES
        or (name in _ONE_ELEMENT_REDUCTIONS and outputs[0].numel() == carrying[0].numel())
        or (
            name in _STABILISERS
            and carrying[0].grad_fn in marks.copies
            and outputs[0].shape == carrying[0].shape
            and torch.equal(outputs[0], carrying[0])
        )
    ):
        marks.copies[outputs[0].grad_fn] = carrying[0].grad_fn


def _passed(call, marks: list, state, mixes: bool) -> Mark | None:
    """The mark a linear operation passes from its inputs' ``marks`` (see :py:func:`passed`)."""
    keeps = call.entry.keeps
    gate = None
    if 'gate' in keeps and not call.held and not state.in_recurrence:
        gate = join_gates(marks, mixes)
    single = marks[0] if len(marks) == 1 else None
    if single is None or not (single.sink is not None or single.attention or single.contraction):
        return gate
    sink = single.sink if 'sink' in keeps and gate is not None else None
    attention = single.attention if 'attention' in keeps else frozenset()
    contraction = single.contraction and 'contraction' in keeps
    if gate is None and not attention and not contraction:
        return None
    fields = {'gate': gate.gate, 'scores': gate.scores} if gate is not None else {}
    return Mark(sink=sink, attention=attention, contraction=contraction, **fields)


class Marks:
    """The marks of one forward pass, by autograd node (see the module's description)."""

    def __init__(self):
        #: the marks by autograd node (None: read through a rule's function, unmarked)
        self.nodes: dict = {}
        #: what a view, cast or centring was computed from, by the node of its output: ``(node, same shape)`` for a
        #: view or cast, ``(None, nodes of the inputs)`` for a shift
        self.origins: dict = {}
        #: whether a log-softmax, a logsumexp, an attention-logit bias, a normaliser or a term was marked
        self.routed = False
        #: the classes of the autograd nodes of the rules' own functions met (:py:func:`~..rules.base.rule_node`)
        self.rule_nodes: set = set()
        #: what a tensor is a multiple of by a number or a constant tensor (``2 * a``, ``a / 2``, ``weight * a``: a
        #: weight of the model, frozen), by the node of its output: the position of the multiplied tensor
        #: (:py:func:`~.calls.tensor_position`, :py:meth:`scale`)
        self.scaled: dict = {}
        #: the number a tensor is offset by (``v + 1``, ``1 - v``: a constant plus a relevance-carrying tensor), by the
        #: node of its output (:py:meth:`offset`, :py:meth:`offset_of`)
        self.offsets: dict = {}
        #: how many factors that share its relevance an element-wise product of products multiplies (``(a * b) * c``:
        #: 3), by the node of its output (:py:func:`~zennit_attn.operations.products.product`); 1 where not recorded
        self.factors: dict = {}
        #: the input ``z`` of an exponential ``exp(z)`` computed outside a sequence mixer and ``z``'s version counter
        #: then, by the node of its output: what a softmax written out (``exp(z) / exp(z).sum(d, keepdim=True)``) is
        #: the softmax of (:py:meth:`exponent`, :py:mod:`~zennit_attn.operations.softmax`)
        self.exponentials: dict = {}
        #: what a tensor is a copy of, by the node of its output: the node of a tensor with the same values in the same
        #: order (a cast, a reshape, a sum or mean over dimensions of one element: :py:data:`COPIES`,
        #: :py:meth:`copy_of`)
        self.copies: dict = {}

    def get(self, node) -> Mark | None:
        """The mark of the tensor computed by ``node`` (None for an unmarked one); the mark of an output of the rules'
        own functions is read through them and kept."""
        mark = self.nodes.get(node, _MISSING)
        if mark is not _MISSING or node is None:
            return None if mark is _MISSING else mark
        kind = rule_node(node)
        if kind is None:
            return None
        self.rule_nodes.add(type(node))
        if kind == 'gate':
            mark = ACTIVATED
        else:
            mark = self.get(rule_input(node))
            if mark is not None and kind == 'rescaled':
                mark = Mark(gate=mark.gate, scores=mark.scores) if mark.gate is not None else None
        self.nodes[node] = mark
        return mark

    def of(self, tensor: torch.Tensor) -> Mark | None:
        """The mark of ``tensor``."""
        return self.get(tensor.grad_fn)

    def set(self, tensors, mark: Mark | None) -> None:
        """Set ``mark`` on ``tensors`` (a list), replacing what they had; None removes their marks."""
        for tensor in tensors:
            if mark is None:
                self.nodes.pop(tensor.grad_fn, None)
            else:
                self.nodes[tensor.grad_fn] = mark
        if mark is not None and mark.route is not None:
            self.routed = True

    def add(self, tensors, **fields) -> None:
        """Add the marks ``fields`` to those ``tensors`` (a list) have."""
        for tensor in tensors:
            mark = self.of(tensor)
            self.set([tensor], Mark(**fields) if mark is None else mark.with_(**fields))

    def derive(self, outputs, inputs) -> None:
        """Note that ``outputs`` are a shift of ``inputs`` (a centring ``x - mean(x)``); views and casts note what they
        view where they run (``(node, same shape)``)."""
        found = (None, tuple(tensor.grad_fn for tensor in inputs))
        for tensor in outputs:
            self.origins[tensor.grad_fn] = found

    def viewed(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """Note ``output`` as a view, cast or copy of ``input`` (``(node, same shape)``, :py:attr:`origins`); one that
        holds ``input``'s elements at their places (:py:func:`same_elements`: ``x.clone()``, ``x.view(x.shape)``,
        ``x.contiguous()``, a cast) is also ``input`` times 1 (:py:meth:`scale`), so that an element-wise function of
        one is one of the other: ``x.clone() * sigmoid(x)`` is SiLU as ``x * sigmoid(x)`` is (Eq. 9)."""
        if output.grad_fn is input.grad_fn:  # ``x.to(x.dtype)``, which returns ``x``
            return
        self.origins[output.grad_fn] = (input.grad_fn, output.shape == input.shape)
        if same_elements(output, input):
            self.scale(output, input, 1)

    def selected(self, output, input: torch.Tensor) -> None:
        """Note ``output`` of a selection from ``input`` as ``input`` times 1 (:py:meth:`scale`) where it is a view
        that holds all of ``input``'s elements in their order (:py:func:`same_elements`: ``x[None]``, ``x[:, :]``), so
        that ``x[None] * sigmoid(x[None])`` is SiLU; no origin is noted (a selection is not followed as a view is)."""
        if isinstance(output, torch.Tensor) and output.requires_grad and same_elements(output, input, copies=False):
            self.scale(output, input, 1)

    def scale(self, output, input: torch.Tensor, factor, position: tuple | None = None) -> None:
        """Note ``output`` as ``input`` multiplied (or divided) by ``factor`` where that is a number (a copy: 1) or a
        constant tensor (one that carries no relevance: a weight of the model) and ``output`` a relevance-carrying
        tensor of ``input``'s shape, an element-wise multiple of it, or a copy that reshapes it. ``position``: that
        of ``input`` (:py:func:`~.calls.tensor_position`) before the operation, where that changed ``input`` in place
        (``x.mul_(w)``)."""
        constant = is_number(factor) or (isinstance(factor, torch.Tensor) and not factor.requires_grad)
        if not (constant and isinstance(output, torch.Tensor) and output.requires_grad):
            return
        if output.shape != input.shape and not (is_number(factor) and factor == 1 and same_elements(output, input)):
            return  # a multiple of another shape; a copy may reshape (``x[None]``, :py:func:`same_elements`)
        position = tensor_position(input) if position is None else position
        if output.grad_fn is not position[0]:
            self.scaled[output.grad_fn] = position

    def offset(self, output, number) -> None:
        """Note ``output`` as a relevance-carrying tensor plus the constant ``number`` (a Python number or a tensor of
        one element that carries no relevance)."""
        if isinstance(output, torch.Tensor) and output.requires_grad:
            self.offsets[output.grad_fn] = number

    def offset_of(self, tensor: torch.Tensor):
        """The number ``tensor`` is offset by (:py:meth:`offset`), through views and casts of the offset tensor
        (``(v + 1).permute(2, 0, 1).unsqueeze(-1)``, which offset each element by the same number); None for none."""
        node = tensor.grad_fn
        for _ in range(16):
            number = self.offsets.get(node)
            if number is not None:
                return number
            origin = self.origins.get(node)
            if origin is None or origin[0] is None:  # not a view or cast
                return None
            node = origin[0]
        return None

    def root(self, position: tuple) -> tuple:
        """The position (:py:func:`~.calls.tensor_position`) of the tensor that the tensor at ``position`` is a
        multiple of by numbers or constant tensors (up to 16 scalings; ``position`` itself for none)."""
        for _ in range(16):
            if position[0] not in self.scaled:
                break
            position = self.scaled[position[0]]
        return position

    def multiple_of(self, position: tuple, target: tuple) -> bool:
        """Whether the tensor at ``position`` (:py:func:`~.calls.tensor_position`) is the tensor at ``target`` or a
        multiple of it by numbers or constant tensors (:py:meth:`root`; ``target`` a root itself)."""
        found = self.root(position)
        return found[0] is target[0] and found[1] == target[1]

    def activation_of(self, value: torch.Tensor, gate: torch.Tensor) -> bool:
        """Whether ``gate`` (the output of an element-wise non-linearity) is an element-wise function of ``value``:
        ``gate``, up to scalings by numbers or constant tensors, is the output of a chain of activations
        (:py:func:`~zennit_attn.rules.elementwise_identity`: the first input of the chain on its node) whose first
        input is an element-wise function of ``value`` (:py:meth:`elementwise_of`: ``sigmoid(1.702 x)`` of ``x``,
        ``1 + erf(x / sqrt(2))`` of ``0.5 x``, ``sigmoid(beta * x)`` of ``x`` with a weight ``beta``, ``relu6(x + 3)``
        of ``x`` in hard swish, ``1 + tanh(c (x + 0.044715 x^3))`` of ``0.5 x`` in the tanh approximation of GELU);
        not another output of the operation that computed ``value`` (``a * sigmoid(b)`` with ``a, b = x.chunk(2)``:
        GLU, a value times a gate)."""
        if not (value.shape == gate.shape and value.grad_fn is not None):
            return False
        position = self.root(tensor_position(gate))
        if rule_node(position[0]) != 'gate':
            return False
        return self.elementwise_of(position, self.root(tensor_position(value)))

    def elementwise_of(self, position: tuple, target: tuple, depth: int = 16) -> bool:
        """Whether the tensor at ``position`` (:py:func:`~.calls.tensor_position`) is an element-wise function of the
        tensor at ``target`` alone: that tensor up to scalings by numbers or constant tensors (:py:meth:`root`), the
        output of a chain of activations whose first input is one, or a shift of such functions (``x + 3``, ``x +
        0.044715 x^3``; a shift's constants add element by element), within ``depth`` steps. A reduction (``x -
        mean(x)``), a product of two tensors and another output of the operation that computed ``target`` are not
        followed."""
        if self.multiple_of(position, target):
            return True
        node = self.root(position)[0]
        if depth <= 0 or node is None:
            return False
        if rule_node(node) == 'gate':
            source = getattr(node, 'source', None)
            return (
                source is not None
                and source.grad_fn is not None
                and self.elementwise_of(tensor_position(source), target, depth - 1)
            )
        origin = self.origins.get(node)
        if origin is None or origin[0] is not None:  # not a shift
            return False
        terms = [term for term in node.next_functions if term[0] is not None]
        return bool(terms) and all(self.elementwise_of(term, target, depth - 1) for term in terms)

    def sources(self, tensor: torch.Tensor) -> set:
        """The nodes ``tensor`` is (a view, cast, multiple or centring of): its own and those of what it was derived
        from (views, casts and multiples by numbers or by constant tensors, through the inputs of one shift, such as a
        centring; up to 32 nodes). A normaliser computed from any of them, times ``tensor``, is a normalisation:
        ``weight * x * rsqrt(mean(x^2))`` as ``x * rsqrt(mean(x^2)) * weight``, ``(w x - w mean(x)) / std(x)``."""
        queue, found = [(tensor.grad_fn, False)], set()  # (node, whether a shift was passed on the way to it)
        while queue and len(found) < 32:
            node, shifted = queue.pop()
            if node in found:
                continue
            found.add(node)
            origin = self.origins.get(node)
            if origin is not None and origin[0] is not None:  # a view or cast
                queue.append((origin[0], shifted))
            elif origin is not None and not shifted:  # a shift: its inputs (once)
                queue.extend((input, True) for input in origin[1])
            elif origin is None and node in self.scaled:
                queue.append((self.scaled[node][0], shifted))
        for node in list(found):  # an identity rule's output: a function of its chain's first input
            if rule_node(node) in ('gate', 'rescaled') and node.next_functions:
                found.add(node.next_functions[0][0])
        return found

    def copy_of(self, tensor: torch.Tensor, node) -> bool:
        """Whether ``tensor`` is a copy of the tensor computed by ``node``: that tensor's values in their order, through
        up to 16 casts, reshapes and sums over dimensions of one element (:py:attr:`copies`), so that the tensor
        divided by ``tensor`` is the constant 1 (``w / w.sum(-1, keepdim=True)`` of one routing weight)."""
        found = tensor.grad_fn
        for _ in range(16):
            found = self.copies.get(found)
            if found is None:
                return False
            if found is node:
                return True
        return False

    def exponent(self, tensor) -> torch.Tensor | None:
        """The input ``z`` of the exponential ``tensor = exp(z)`` (:py:attr:`exponentials`); None where ``tensor`` is
        not the output of one, or where ``z`` was changed in place since."""
        found = self.exponentials.get(tensor.grad_fn) if isinstance(tensor, torch.Tensor) else None
        if found is None or found[0]._version != found[1]:
            return None
        return found[0]

    def scores(self, tensor: torch.Tensor):
        """The node of the logits that ``tensor`` (logits, cast or copied) stands for."""
        node = tensor.grad_fn
        for _ in range(16):
            origin = self.origins.get(node)
            if origin is None or origin[1] is not True:
                break
            node = origin[0]
        return node
