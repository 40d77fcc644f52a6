"""One call of a torch function as the classifying mode sees it: the function, its arguments bound once by name, the
tensors among them that carry relevance and the engine's marks on those.

:py:class:`Call` is what every handler of the operation registry (:py:mod:`~zennit_attn.operations.registry`)
receives, with the engine's state of the forward (:py:class:`~zennit_attn.operations.tracking.State`). A
handler reads an argument by its name (:py:meth:`Call.argument`: ``scaled_dot_product_attention``'s ``attn_mask``,
``div``'s ``other``), given positionally or by keyword, reflected (``c - x`` is ``x.__rsub__(c)``) or not, and runs the
function with some of them replaced (:py:meth:`Call.run`): the names come from the function's signature
(:py:func:`inspect.signature`), else from the operation's declaration in the registry (its ``params``), found once per
function (:py:func:`signature`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    'Call',
    'Signature',
    'signature',
    'in_place',
    'out_of_place',
    'is_number',
    'replaced',
    'tensors_of',
    'tensor_position',
    'SWAPPABLE',
]

#: Operators whose reflected (``__rmul__``) and in-place (``__imul__``) forms compute the same as the plain one.
SWAPPABLE = frozenset('add sub mul matmul truediv floordiv pow mod and or xor'.split())


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


def replaced(value, tensors: dict[int, torch.Tensor]):
    """``value`` (a tensor, or lists and tuples of them) with the tensors whose ids are keys of ``tensors`` replaced."""
    if isinstance(value, torch.Tensor):
        return tensors.get(id(value), value)
    if isinstance(value, (list, tuple)):
        return type(value)(replaced(item, tensors) for item in value)
    return value


def is_number(value) -> bool:
    """Whether ``value`` is a Python number (an int or a float, not a boolean): a constant of the model's code."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def tensor_position(tensor: torch.Tensor) -> tuple:
    """Where ``tensor`` sits in the autograd graph: ``(its node, which output of the node it is)``. Outputs of one
    operation (``x.chunk(2)``, ``x.unbind()``) share the node; the position tells them apart."""
    return tensor.grad_fn, tensor.output_nr


def in_place(func: Callable, kwargs: dict | None = None) -> bool:
    """Whether ``func`` changes its first argument in place: by its name (``mul_``, ``__imul__``, not ``__mul__``) or
    by its argument ``inplace=True`` (``F.silu(x, inplace=True)``)."""
    name = getattr(func, '__name__', '') or ''
    if name.startswith('__i') and name.endswith('__') and name[3:-2] in SWAPPABLE:
        return True
    return (name.endswith('_') and not name.startswith('__')) or bool(kwargs and kwargs.get('inplace') is True)


class Signature:
    """The names of a torch function's positional parameters, in their order as the function is called (a reflected
    operator ``x.__rsub__(c)`` computes ``c - x``: its first argument is the declared second)."""

    __slots__ = ('names', 'positions')

    def __init__(self, names: Sequence[str], reflected: bool = False):
        names = list(names)
        if reflected and len(names) > 1:
            names[0], names[1] = names[1], names[0]
        self.names = tuple(names)
        self.positions = {name: index for index, name in enumerate(self.names)}

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The arguments by name (positional ones beyond the known names are left out)."""
        bound = dict(zip(self.names, args))
        bound.update(kwargs)
        return bound


#: The signature of each function the mode has bound arguments of (binding is asked for per call).
_SIGNATURES: dict = {}


def signature(func: Callable, declared: Sequence[str] = ()) -> Signature:
    """The :py:class:`Signature` of ``func``: the names of :py:func:`inspect.signature` (functions written in Python:
    ``torch.nn.functional``), else (builtins: ``torch.mul``, tensor methods) the ``declared`` names of the operation
    (the registry's ``params``, in the order of ``torch.<name>``'s parameters; a tensor method's ``self`` is its
    first), else none (only keyword arguments bind). Found once per function."""
    try:
        return _SIGNATURES[func]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable
        return _signature(func, declared)
    found = _SIGNATURES[func] = _signature(func, declared)
    return found


def _signature(func: Callable, declared: Sequence[str]) -> Signature:
    name = getattr(func, '__name__', '') or ''
    reflected = name.startswith('__r') and name.endswith('__') and name[3:-2] in SWAPPABLE
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the names declared
        return Signature(declared, reflected)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return Signature([parameter.name for parameter in parameters if parameter.kind in positional], reflected)


class Call:
    """One call of a torch function on relevance-carrying tensors (see the module's description).

    Attributes
    ----------
    func: callable
        The torch function.
    name: str
        Its name in the registry (:py:func:`~zennit_attn.operations.registry.op_name`).
    entry: Operation or None
        Its declaration (:py:class:`~zennit_attn.operations.registry.Operation`), None where there is none.
    args, kwargs:
        Its arguments, as the model passed them (with the constants the engine holds replaced by detached copies).
    carrying: list of torch.Tensor
        The tensors among the arguments that carry relevance.
    positions: tuple
        Where the tensors of ``carrying`` sat in the autograd graph when the call was bound, before it ran (``(node,
        output number)``: :py:func:`tensor_position`; an in-place operation changes the
        node of the tensor it changes).
    marks: list of Mark or None
        The engine's mark on each tensor of ``carrying``
        (:py:class:`~zennit_attn.operations.marks.Mark`).
    held: bool
        Whether the engine holds some relevance-carrying factors of the operation constant (terms of a recurrence), so
        that the output is not a gate whatever the other factors are.
    product_rule: ProductRule or None
        The composite's override of the product rule of the operation
        (:py:attr:`~zennit_attn.operations.tracking.State.overrides`), set by the mode before the handler runs;
        None: the composite's rule (:py:meth:`~zennit_attn.operations.tracking.State.product_rule_of`).
    activation_rule: object or None
        The same for the activation rule; None: the composite's.
    note: str or None
        What the handler decided, in words, for the dry run of the rules
        (:py:class:`~zennit_attn.operations.tracking.RuleTable`).
    """

    __slots__ = (
        'func',
        'name',
        'entry',
        'args',
        'kwargs',
        'carrying',
        'positions',
        'marks',
        'held',
        'product_rule',
        'activation_rule',
        'note',
        '_arguments',
    )

    def __init__(self, func, name: str, entry, args: tuple, kwargs: dict, carrying: list, marks: list):
        self.func, self.name, self.entry, self.args, self.kwargs, self.carrying, self.marks = (
            func,
            name,
            entry,
            args,
            kwargs,
            carrying,
            marks,
        )
        self.positions = tuple(tensor_position(tensor) for tensor in carrying)
        self.held = False
        self.product_rule = self.activation_rule = self.note = self._arguments = None

    @property
    def arguments(self) -> dict[str, Any]:
        """The arguments by name (bound once; see :py:func:`signature`)."""
        if self._arguments is None:
            declared = self.entry.params if self.entry is not None else ()
            self._arguments = signature(self.func, declared).bind(self.args, self.kwargs)
        return self._arguments

    def argument(self, name: str, default=None):
        """The argument ``name`` (positional or keyword), else ``default``."""
        if self._arguments is not None:
            return self._arguments.get(name, default)
        index = signature(self.func, self.entry.params if self.entry is not None else ()).positions.get(name)
        if index is not None and index < len(self.args):
            return self.args[index]
        return self.kwargs.get(name, default)

    def given(self, name: str) -> bool:
        """Whether the argument ``name`` was given (positionally or by keyword)."""
        return name in self.arguments

    def run(self, **values):
        """Run the function, with the arguments named in ``values`` replaced (where they were given positionally, in
        their position, else as keyword arguments)."""
        if not values:
            return self.func(*self.args, **self.kwargs)
        args, kwargs = self.with_values(values)
        return self.func(*args, **kwargs)

    def again(self, input: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """``x -> the function run again with x in place of input`` where ``input`` is its first argument, or another
        positional one (an activation written out as ``sigmoid(x).mul(x)``) (the identity rule computes an
        activation's output again in the backward pass instead of keeping it, so that the model may change it in
        place: :py:func:`~zennit_attn.rules.elementwise_identity`), None where it is none."""
        if self.args and self.args[0] is input:
            return functools.partial(_first_replaced, self.func, self.args[1:], self.kwargs)
        if not any(arg is input for arg in self.args):
            return None
        return functools.partial(_replaced_call, self.func, self.args, self.kwargs, input)

    def with_values(self, values: dict[str, Any]) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with the arguments named in ``values`` replaced."""
        positions = signature(self.func, self.entry.params if self.entry is not None else ()).positions
        args, kwargs = list(self.args), dict(self.kwargs)
        for name, value in values.items():
            index = positions.get(name)
            if index is not None and index < len(args):
                args[index] = value
            else:
                kwargs[name] = value
        return tuple(args), kwargs

    def without(self, constants: dict[int, torch.Tensor], held: bool = False) -> Call:
        """This call with the tensors whose ids are keys of ``constants`` replaced by their values (detached copies:
        constants of the relevance pass) in its arguments and left out of ``carrying``; ``held``: they are
        relevance-carrying factors that the engine holds constant (see :py:attr:`held`)."""
        args = replaced(self.args, constants)
        kwargs = {key: replaced(value, constants) for key, value in self.kwargs.items()}
        kept = [index for index, tensor in enumerate(self.carrying) if id(tensor) not in constants]
        call = Call(
            self.func,
            self.name,
            self.entry,
            args,
            kwargs,
            [self.carrying[index] for index in kept],
            [self.marks[index] for index in kept],
        )
        call.held = self.held or held
        return call


def _first_replaced(func: Callable, rest: tuple, kwargs: dict, input: torch.Tensor):
    """``func(input, *rest, **kwargs)``: a call run again on another first argument (:py:meth:`Call.again`)."""
    return func(input, *rest, **kwargs)


def _replaced_call(func: Callable, args: tuple, kwargs: dict, input: torch.Tensor, value: torch.Tensor):
    """``func(*args, **kwargs)`` with the positional arguments that are ``input`` replaced by ``value``: a call run
    again on another tensor (:py:meth:`Call.again`)."""
    return func(*(value if arg is input else arg for arg in args), **kwargs)


def out_of_place(call: Call, state, handler: Callable) -> torch.Tensor:
    """An in-place operation on relevance-carrying tensors whose rule needs their values (a product: ``a.mul_(b)``,
    ``a *= b``, ``c.addcmul_(a, b)``, ``x.scatter_reduce_(..., 'prod')``; a decomposed function: ``a.lerp_(b, w)``,
    ``a.hypot_(b)``) as what it computes, ``a.copy_(a.clone() * b)``: the out-of-place operation on a copy of the
    changed tensor (which keeps its marks and stands for it: ``a.mul_(a)`` is a square, ``a.mul_(sigmoid(a))`` SiLU)
    under ``handler``, its rule (Prop. 3.2 for a product; ``state``: the engine's
    :py:class:`~.tracking.State`), written into the tensor, which then stands for the result and holds its marks.
    ``call`` becomes the out-of-place call (the marks its declaration gives, such as a product's, are then those of
    the operation on the copy, set on the changed tensor). Before, an in-place product was refused where its
    out-of-place spelling was explained."""
    target = call.args[0]
    copy = target.clone()
    state.audit.record(copy)  # made by the engine: the operations of a decomposition audit their operands
    state.marks.set([copy], state.marks.of(target))
    state.marks.viewed(copy, target)
    copies = {id(target): copy}
    name = call.func.__name__
    twin = '__' + name[3:] if name.startswith('__i') else name[:-1]
    call.func, call.args = getattr(torch.Tensor, twin), replaced(call.args, copies)
    call.kwargs = {key: replaced(value, copies) for key, value in call.kwargs.items()}
    call.carrying = [copies.get(id(tensor), tensor) for tensor in call.carrying]
    call.positions, call._arguments = tuple(tensor_position(tensor) for tensor in call.carrying), None
    output = handler(call, state)
    target.copy_(output)
    state.marks.set([target], state.marks.of(output))
    state.marks.viewed(target, output)
    return target
