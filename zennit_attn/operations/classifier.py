"""The classifying mode of the engine: the rule of every torch operation a model performs on tensors that carry
relevance.

:py:class:`Classifier` is a :py:class:`torch.overrides.TorchFunctionMode` that the
:py:class:`~zennit_attn.canonizers.operations.OperationCanonizer` enters for the time of a model's forward. For
each torch function called on a tensor that carries relevance (one that requires a gradient: the model's parameters
are frozen for the time of the context, so these are exactly the tensors computed from the explained inputs) it

1. names the operation and looks it up in the registry (:py:mod:`~zennit_attn.operations.registry`);
2. inside a sequence mixer that is not softmax attention, holds the constants of its recurrence constant
   (:py:mod:`~zennit_attn.operations.recurrences`), and checks where its operands come from: a custom
   autograd function (a kernel) is refused, a tensor computed without gradients inside the forward must not meet
   relevance again (:py:mod:`~zennit_attn.operations.tracking`);
3. binds the call once (:py:class:`~zennit_attn.operations.calls.Call`) with the marks of its operands
   (:py:mod:`~zennit_attn.operations.marks`), and routes an operation on a tensor with a mark that has a
   handler of its own (a log-softmax, a logsumexp, an attention-logit bias, a normaliser, a term of a recurrence:
   :py:data:`ROUTES`) to that handler;
4. applies the rule the registry declares (:py:func:`dispatch`: its handler, or the composite's override of the
   operation), and marks the outputs as the registry declares; an operation the registry does not know, or declares
   refused, is refused by name (:py:class:`~zennit_attn.core.errors.UnsupportedModelError`);
5. audits it (:py:mod:`zennit_attn.core.audit`): each relevance-carrying operand must have been produced or
   sanctioned by the engine (or be an explained input), and the outputs, and the tensors it changed in place, are
   recorded as produced.

While the mode is entered, functions compiled by ``torch.compile`` that the forward calls (helpers, hooks) run as their
Python code, whose operations the mode classifies (:py:func:`eager_compiled`).

With a rule table (:py:attr:`~zennit_attn.operations.tracking.State.table`: a dry run) each operation is
recorded with its rule and what the handler decided, and a refusal is recorded and passed with the plain gradient, so
that the table covers the whole model.
"""

from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode

from ..core.audit import AUDITED_GETTERS, AUDITED_METADATA
from ..core.errors import UnsupportedModelError
from ..rules import FUNCTIONAL_EPSILON, Epsilon, epsilon_gradient
from .calls import Call, in_place, tensors_of
from .elementwise import COMPARISONS, normaliser_use, note_sign, rectifies_by_sign
from .marks import ACTIVATED, CASTS, EXTREMA, Mark, join_gates, produced
from .products import note_offset, note_scaling
from .recurrences import held_constant, term_use
from .registry import ADDING, OPERATIONS, RULE_TABLE, op_name
from .softmax import exp_sum_use, log_softmax_use, sink_mass, sum_of_exponentials
from .tracking import State, produced_tensors, refuse_bias

__all__ = ['Classifier', 'ROUTES', 'dispatch', 'eager_compiled']


def _bias_use(call: Call, state: State):
    """An operation on a logit bias: views, selections, masking and adding keep it one (marked), a softmax or
    ``scaled_dot_product_attention`` consumes it (their rules apply); anything else is refused."""
    origin = next(mark.bias for mark in call.marks if mark is not None and mark.bias is not None)
    if call.entry is not None and call.entry.rule in ('softmax', 'attention'):
        return dispatch(call, state)
    if call.name == 'sum':  # the normaliser of a softmax written out
        summed = sum_of_exponentials(call, state)
        if summed is not None:
            return summed
    if call.entry is None or 'bias' not in call.entry.keeps:
        refuse_bias(state, f'exp (used by {call.name})', origin)
    output = call.run()
    state.mark_bias(output, origin)
    call.note = 'an attention-logit bias, moved'
    return output


def _exp_sum_use(call: Call, state: State):
    """An operation on a sum of exponentials (:py:func:`~.softmax.exp_sum_use`; a softmax written out gets the rule
    the registry declares for ``softmax``)."""
    return exp_sum_use(call, state, OPERATIONS['softmax'])


#: The handler of each mark that routes the operations on its tensors, in the order in which one is chosen where the
#: operands carry several (:py:data:`~zennit_attn.operations.marks.ROUTES`).
ROUTES = {
    'log_softmax': log_softmax_use,
    'lse': sink_mass,
    'exp_sum': _exp_sum_use,
    'bias': _bias_use,
    'normaliser': normaliser_use,
    'term': term_use,
}


def dispatch(call: Call, state: State):
    """Apply the rule the registry declares for ``call`` (or the composite's override of the operation) and mark its
    outputs; refuse an operation the registry does not declare."""
    entry = call.entry
    if entry is None:
        state.refuse(call.name)
    override = state.overrides.get(call.name) if state.overrides else None
    if override is None:
        output = entry.handler(call, state)
    elif override.function is not None:
        output = override.function(call.func, call.args, call.kwargs)
        call.note = f'overridden: {override}'
    else:
        call.product_rule, call.activation_rule = override.product_rule, override.activation_rule
        output = entry.handler(call, state)
        call.note = f'overridden: {call.note}'
    if entry.marks is not None:
        entry.marks(call, output, state)
    return output


class Classifier(TorchFunctionMode):
    """The torch function mode of :py:class:`~zennit_attn.canonizers.operations.OperationCanonizer` (see the
    module's description); ``state`` holds the composite's rules and what the mode tracks across the operations of
    one forward, and refuses what has no rule."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state
        state.mode, state.dispatch = self, dispatch
        self._stances: list = []

    def __enter__(self):
        """Enter the mode; functions compiled by ``torch.compile`` that the forward calls run as their Python code
        meanwhile (:py:func:`eager_compiled`)."""
        self._stances.append(eager_compiled())
        try:
            return super().__enter__()
        except BaseException:
            _restore(self._stances.pop())
            raise

    def __exit__(self, exc_type, exc_value, traceback):
        try:
            return super().__exit__(exc_type, exc_value, traceback)
        finally:
            _restore(self._stances.pop())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            name, entry, changes, fast = _FUNCTIONS[func]
        except (KeyError, TypeError):  # TypeError: an unhashable callable
            name, entry, changes, fast = _function(func)
        state = self.state
        if fast is _METADATA:
            return self.metadata(name, func, args, kwargs)
        gradients = torch.is_grad_enabled()
        if gradients and state.opaque:
            return func(*args, **kwargs)
        tensors = tensors_of(args, tensors_of(list(kwargs.values()), []) if kwargs else [])
        if not gradients:
            return state.cut_off(entry, args, func(*args, **kwargs), tensors)
        carrying = [tensor for tensor in tensors if tensor.requires_grad]
        if state.cut and state.meets_cut(name, entry, args, kwargs, tensors, carrying):
            return state.cut_off(entry, args, func(*args, **kwargs), tensors)
        if state.runs:  # inside a sequence mixer: the constants of its recurrence
            args, kwargs, carrying = held_constant(state, args, kwargs, carrying)
        if not carrying:
            output = func(*args, **kwargs)
            if state.signs and name in CASTS and args and args[0] in state.signs:  # ``(x > 0).float()``: a sign
                state.signs[output] = state.signs[args[0]]
            return output
        changes = changes or bool(kwargs and in_place(func, kwargs))
        return self.classified(func, name, entry, args, kwargs, carrying, fast, changes, tensors)

    def metadata(self, name: str, func, args, kwargs):
        """Run an operation of the rule ``metadata``: unclassified, those the audit looks at audited
        (:py:meth:`~zennit_attn.core.audit.Audit.metadata`)."""
        audit = self.state.audit
        if audit.open and (name in AUDITED_METADATA or (name == 'get' and func in AUDITED_GETTERS)):
            return audit.metadata(self.state, name, func, args, kwargs)
        return func(*args, **kwargs)

    def classified(self, func, name: str, entry, args, kwargs, carrying: list, fast, changes: bool, tensors: list):
        """Audit the relevance-carrying operands (``carrying``) of an operation (their origins,
        :py:meth:`~zennit_attn.core.audit.Audit.refusal`; in a dry run a refusal is recorded), apply its rule (on its
        ``fast`` path where no operand is marked, :py:meth:`unmarked`; else bound once, routed by marks,
        :py:meth:`handle`, or dispatched) and record its outputs, and the ``tensors`` it ``changes`` in place, as
        produced by the engine."""
        state = self.state
        inline = None
        if fast == 'contraction' and (state.layers or state.inline):
            inline = state.recorded(layer_rule, state, name, tensors)
        marks = _operand_marks(state, carrying)
        refusal = state.audit.refusal(carrying)
        if refusal is not None:  # an operand the engine did not produce or sanction
            state.recorded(state.refuse, name, *refusal)
        if _fast(fast, name, marks, carrying, state):
            output = self.unmarked(func, name, args, kwargs, carrying, fast)
        else:
            call = Call(func, name, entry, args, kwargs, carrying, marks)
            routed = changes or state.marks.routed or state.table is not None
            output = self.handle(call) if routed else dispatch(call, state)
        if inline is not None and changes:
            state.recorded(state.refuse, name, 'a linear map with parameters of the model, computed in place')
        elif inline is not None:  # a linear map with the parameters of a module that is not a layer: the epsilon rule
            output = epsilon_gradient(output, inline.epsilon)
        state.audit.record(output)
        if changes:
            state.audit.record_changed(tensors)
        return output

    def unmarked(self, func, name: str, args, kwargs, carrying: list, fast: str):
        """Run an operation on its ``fast`` path (see :py:func:`_function`): linear (its plain gradient, Eq. 8 with
        epsilon -> 0), none of whose relevance-carrying operands (``carrying``) is marked, so that it marks nothing,
        without binding a :py:class:`~.calls.Call`. A shift or join notes the constants it adds
        (:py:meth:`~.tracking.State.note_constant`), and the output of a view what it is a view of, that of a shift
        what it shifts (:py:meth:`~zennit_attn.operations.marks.Marks.sources`), as their rule's handler and marks do
        (:py:func:`~.registry.passed`), and the output of a product with a number what it multiplies
        (:py:func:`~.products.note_scaling`)."""
        state = self.state
        if fast in ADDING:
            state.note_constant(fast, args, kwargs)
        output = func(*args, **kwargs)
        if fast == 'view' and isinstance(output, torch.Tensor) and output.requires_grad:
            first = carrying[0] if len(carrying) == 1 else args[0]  # ``x.type_as(y)``: the values of ``x``
            state.marks.viewed(output, first)
        elif fast == 'shift':
            state.marks.derive(produced_tensors(output), carrying)
            note_offset(func, args, kwargs, carrying, output, state)
        elif fast == 'product':
            note_scaling(func, args, kwargs, carrying[0], output, state)
        elif fast == 'selection' and len(carrying) == 1:
            state.marks.selected(output, carrying[0])
        elif fast == 'compare':
            note_sign(name, args, carrying[0], output, state)
        if state.signs and rectifies_by_sign(name, args, kwargs, carrying, state):
            state.marks.set(produced_tensors(output), ACTIVATED)  # ``where(x > 0, x, 0)``: a rectifier, a gate
        return output

    def handle(self, call: Call):
        """Route ``call`` to the handler of a mark of its operands (:py:data:`ROUTES`), else :py:func:`dispatch` it;
        an in-place change of a view gives the tensor it views the marks of both. In a dry run the call is recorded
        in the rule table, and a refusal is recorded and the operation passed with its plain gradient."""
        if self.state.table is None:
            return self.routed(call)
        try:
            return self.routed(call)
        except UnsupportedModelError as error:
            self.state.table.refuse(str(error))
            self.state.table.record(self.state.here(), call.name, 'refused', 'refused (see below)')
            return call.run()

    def routed(self, call: Call):
        """:py:meth:`handle` outside a dry run."""
        state = self.state
        base = _base(call) if call.name == 'setitem' or in_place(call.func, call.kwargs) else None
        before = (state.marks.of(base) if base.requires_grad else _CONSTANT) if base is not None else None
        route = None
        if state.marks.routed:
            routes = [mark.route for mark in call.marks if mark is not None and mark.route is not None]
            route = min(routes, key=_ORDER.index) if routes else None
        output = ROUTES[route](call, state) if route is not None else dispatch(call, state)
        if base is not None and base.requires_grad:
            changed = produced(call, output)
            after = state.marks.of(changed[0]) if changed else None
            marks = [after] if before is _CONSTANT else [before, after]
            state.marks.set([base], join_gates(marks) if all(marks) else None)
        if state.table is not None:
            self.record(call, route)
        return output

    def record(self, call: Call, route: str | None) -> None:
        """Record ``call`` in the rule table: its rule (or the mark that routed it, or the override), what was done."""
        state, entry = self.state, call.entry
        if route is not None:
            rule = f'{route} mark'
        elif state.overrides and call.name in state.overrides:
            rule = 'override'
        else:
            rule = entry.rule
        how = call.note or (RULE_TABLE[entry.rule].summary if entry is not None else '')
        if state.in_recurrence:
            how = f'inside the recurrence {state.runs[-1].current.name}, its constants held: {how}'
        state.table.record(state.here(), call.name, rule, how)


def eager_compiled():
    """Make functions compiled by ``torch.compile`` run as their Python code (``torch.compiler.set_stance
    ('force_eager')``) until :py:func:`_restore` of what it returns (None where nothing changed). The mode classifies
    their operations as those of any code; compiled, dynamo would trace the mode's own ``__torch_function__`` into its
    graph and run the graph's operations unclassified (the plain gradient in place of their rules, silently). The
    stance is torch's, for every thread; nothing changes where ``torch._dynamo`` is not loaded (nothing can be compiled
    then) or where torch has no stances (before 2.6)."""
    if 'torch._dynamo' not in sys.modules:
        return None
    set_stance = getattr(torch.compiler, 'set_stance', None)
    return set_stance('force_eager') if set_stance is not None else None


def _restore(stance) -> None:
    """Put back the compiler's stance that :py:func:`eager_compiled` changed."""
    if stance is not None:
        stance.__exit__(None, None, None)


_ORDER = list(ROUTES)
_MISSING = object()
#: ``(name, declaration, whether it changes its first argument, its fast path)`` of each function the mode has seen
#: (:py:func:`_function`).
_FUNCTIONS: dict = {}
#: The fast paths of products: linear where one factor carries relevance, their rule among several factors otherwise.
_PRODUCTS = ('product', 'contraction')
#: The fast path of metadata (not classified at all).
_METADATA = 'metadata'
#: The shapes of linear operations that note nothing and mark nothing where no operand is marked (not dropout, whose
#: handler refuses dropout that drops).
_QUIET = frozenset({'selection', 'mask', 'write', 'reduction', 'constant'})


def _function(func) -> tuple:
    """``(name, declaration, whether it changes its first argument in place, its fast path)`` of ``func``, kept in
    :py:data:`_FUNCTIONS`. The fast path of an operation where no operand is marked (:py:meth:`Classifier.unmarked`):
    ``'quiet'`` for a linear one that notes and marks nothing, ``'view'`` for a view or cast, which notes what it is a
    view of, ``'selection'`` for a selection, which notes a view of all of its input's elements as a copy
    (:py:meth:`~.marks.Marks.selected`), ``'shift'`` and ``'join'`` for one that may add constants (``x + c``,
    ``cat``), which it notes, ``'product'`` for an element-wise product and ``'contraction'`` for a matrix product
    or a layer (linear where one factor carries relevance; an element-wise product by a constant notes the multiple it
    makes), ``'compare'`` for a comparison (``x > 0`` notes the sign of ``x``, :py:func:`~.elementwise.note_sign`),
    None for none."""
    name = op_name(func)
    entry = OPERATIONS.get(name)
    changes = name == 'setitem' or in_place(func)
    fast = None
    if entry is not None and entry.rule == 'metadata':
        fast = _METADATA
    elif name in COMPARISONS and not changes:
        fast = 'compare'
    elif entry is not None and not changes and entry.rule == 'plain' and entry.shape == 'selection':
        fast = 'selection' if name not in EXTREMA else None
    elif entry is not None and not changes and entry.rule == 'plain' and entry.shape in _QUIET and name not in EXTREMA:
        fast = 'quiet'
    elif entry is not None and not changes and entry.rule == 'plain' and entry.shape in ('view', *ADDING):
        fast = entry.shape
    elif entry is not None and not changes and entry.rule == 'product':
        fast = 'product' if entry.elementwise_product else 'contraction'
    found = (name, entry, changes, fast)
    try:
        _FUNCTIONS[func] = found
    except TypeError:  # an unhashable callable
        pass
    return found


#: The mark of a tensor that carried no relevance before an in-place change of a view of it (its values constants).
_CONSTANT = Mark()


def _fast(fast: str | None, name: str, marks: list, carrying: list, state: State) -> bool:
    """Whether an operation ``name`` with the fast path ``fast`` (:py:func:`_function`) takes it: none of its operands
    is marked (``marks``), neither an override of the operation nor a dry run asks for its rule (the other operations
    of a composite with overrides keep their fast path), and a product has one relevance-carrying factor (its rule
    among several factors otherwise)."""
    return (
        fast is not None
        and not any(marks)
        and not (state.overrides and name in state.overrides)
        and state.table is None
        and (fast not in _PRODUCTS or len(carrying) == 1)
    )


def layer_rule(state: State, name: str, tensors: list[torch.Tensor]):
    """The rule of a matrix product, layer or convolution ``name`` on relevance-carrying tensors that computes with
    parameters of the model outside a layer's forward
    (:py:meth:`~zennit_attn.canonizers.OperationCanonizer.guard_layers`): None where it computes with none (or inside
    the forward of the layer that holds them, whose rule applies at its boundary), the composite's epsilon rule where
    it computes with the parameters of a module that is not a layer (fused experts' weights, a router's weight: a
    linear map the composite's rule of linear layers covers; applied to the output,
    :py:func:`~zennit_attn.rules.epsilon_gradient`). Refused: the parameters (a weight, bias, or a view of them) of a
    layer whose rule changes its gradient while that layer is not being run, whose rule would not apply here (the
    plain gradient in its place, silently another relevance: EVA-02's ``qkv`` with ``attention_in=Gamma(0.5)`` got the
    relevance of the default rule); another rule than an epsilon rule for a module that is not a layer."""
    for tensor in tensors:
        found = _parameter_entry(state.layers, tensor)
        if found is not None and not any(state.running.get(id(module)) for _, module, _ in found):
            path, module, rule = found[0]
            state.refuse(
                name,
                f'a product with the parameters of {path!r} ({type(module).__name__}) outside its forward (the model '
                f'uses them without calling the module), whose rule {rule} would not apply there',
                hint=f'Give {path!r} no rule, or an epsilon rule of at most {FUNCTIONAL_EPSILON:g} (the plain gradient '
                'stands in for it), or explain a model that calls the module.',
            )
        inline = _parameter_entry(state.inline, tensor)
        if inline is not None:
            path, module, rule, label = inline
            if not isinstance(rule, Epsilon):
                state.refuse(
                    name,
                    f'a linear map with the parameter {path!r} of {type(module).__name__}, not a layer module, whose '
                    f'rule as a linear layer, {label}, is a rule of modules that cannot apply to it',
                    hint='Use an epsilon rule for the linear layers there (the composite applies it to such maps), '
                    'or explain a model that computes the map with a torch.nn.Linear.',
                )
            return rule
    return None


def _parameter_entry(entries: dict, tensor: torch.Tensor):
    """The entry of ``entries`` (by ``id`` of a parameter) for ``tensor``: the parameter itself, or a view of it
    (``weight.T``, ``gate_up_proj[i]``); None for another tensor."""
    found = entries.get(id(tensor))
    if found is None and tensor._base is not None:
        found = entries.get(id(tensor._base))
    return found


def _operand_marks(state: State, carrying: list[torch.Tensor]) -> list:
    """The marks of the relevance-carrying operands ``carrying`` (their origin checked: no kernel's output)."""
    marks, trusted = state.marks, state.trusted
    found, known = [], marks.nodes
    for tensor in carrying:
        node = tensor.grad_fn
        kind = type(node)
        if kind not in trusted:
            state.check_origin(tensor)
        mark = known.get(node, _MISSING)
        found.append(mark if mark is not _MISSING else (marks.get(node) if kind in marks.rule_nodes else None))
    return found


def _base(call: Call) -> torch.Tensor | None:
    """The tensor that the first argument of an in-place operation views (its base), if it is a view."""
    first = call.args[0] if call.args else None
    return first._base if isinstance(first, torch.Tensor) else None
