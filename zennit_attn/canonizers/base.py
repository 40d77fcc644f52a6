"""The general mechanism: canonizers that give the inline operations of a model a module to hook.

Both canonizers change model *instances* only (child modules added, hooks registered) and put back exactly
what was there on :py:meth:`remove`.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch.overrides import TorchFunctionMode
from zennit.canonizers import Canonizer

from ..layers import Operand

#: ``module -> {child attribute: role or (roles, sections)}``: where the operands of a module's products come from.
OperandSpec = Callable[[torch.nn.Module], Mapping[str, object]]

#: Inline functions (by name) that :py:class:`InlineActivationCanonizer` can route through a module.
INLINE_FUNCTIONS: dict[str, tuple[tuple[Callable, ...], Callable[[], torch.nn.Module]]] = {
    'tanh': ((torch.tanh, torch.Tensor.tanh, torch.nn.functional.tanh), torch.nn.Tanh),
    'gelu': ((torch.nn.functional.gelu,), torch.nn.GELU),
}

_PREFIX = 'attnlrp_'


def _add_child(parent: torch.nn.Module, name: str, child: torch.nn.Module) -> str:
    attribute = _PREFIX + name
    if attribute in parent._modules or hasattr(parent, attribute):
        raise RuntimeError(
            f'{type(parent).__name__} already has an attribute {attribute!r}: is another zennit-attn composite '
            'registered to this model? Leave its context first.'
        )
    parent.add_module(attribute, child)
    return attribute


def _apply_all(canonizer: Canonizer, root_module: torch.nn.Module, targets) -> list[Canonizer]:
    """Register a copy of ``canonizer`` for each ``(module, *args)`` in ``targets``; all or nothing."""
    instances = []
    try:
        for target in targets:
            instance = canonizer.copy()
            instance.register(*target)
            instances.append(instance)
    except BaseException:
        for instance in instances:
            instance.remove()
        raise
    return instances


class OperandCanonizer(Canonizer):
    """Attach :py:class:`~zennit_attn.layers.Operand` modules to the outputs of the projections that produce
    the operands of inline products (``Q K^T``, ``A V`` in attention, ``act(gate) * up`` in gated MLPs).

    For each module whose class name is a key of ``specs``, the spec names the child modules whose outputs are
    operands and their roles. The Operand is added as a child ``attnlrp_<child>`` of the module and called on
    the child's output by a forward hook, so a composite can register a rule to it.

    Parameters
    ----------
    specs: mapping of str to callable
        Class name -> ``module -> {child attribute: role}``, where a role is a string, a tuple of roles for a
        fused projection (equal sections of the last dimension), or ``(roles, sections)``.
    """
    def __init__(self, specs: Mapping[str, OperandSpec]):
        super().__init__()
        self.specs = dict(specs)
        self.parent = None
        self.attribute = None
        self.handle = None

    def apply(self, root_module: torch.nn.Module) -> list[Canonizer]:
        targets = []
        for module in root_module.modules():
            spec = self.specs.get(type(module).__name__)
            if spec is not None:
                targets.extend((module, child, role) for child, role in spec(module).items())
        return _apply_all(self, root_module, targets)

    def register(self, parent: torch.nn.Module, child_name: str, role) -> None:
        child = getattr(parent, child_name)
        if isinstance(role, tuple) and len(role) == 2 and isinstance(role[0], tuple):
            operand = Operand(*role)
        else:
            operand = Operand(role)
        self.attribute = _add_child(parent, child_name, operand)
        self.parent = parent
        self.handle = child.register_forward_hook(lambda module, input, output: operand(output))

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            del self.parent._modules[self.attribute]
        self.parent = self.attribute = self.handle = None

    def copy(self) -> 'OperandCanonizer':
        return type(self)(self.specs)


class _RouteFunctions(TorchFunctionMode):
    """Route calls of element-wise torch functions through modules, while a module's forward runs."""
    def __init__(self, routes: Mapping[Callable, torch.nn.Module]):
        super().__init__()
        self.routes = routes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        module = self.routes.get(func)
        if module is None:
            return func(*args, **kwargs)
        if len(args) != 1 or any(value != 'none' for key, value in kwargs.items() if key == 'approximate') or (
                set(kwargs) - {'approximate'}):
            raise NotImplementedError(
                f'zennit-attn routes {getattr(func, "__name__", func)} through {type(module).__name__} only for a '
                f'single tensor with default options; got args={len(args)}, kwargs={kwargs}'
            )
        return module(args[0])


class InlineActivationCanonizer(Canonizer):
    """Route element-wise non-linearities that a module calls as functions (``torch.tanh(x)``) through
    activation modules added as its children, so the identity rule (Eq. 9) can attach to them.

    The routing is a :py:class:`torch.overrides.TorchFunctionMode` entered by a forward pre-hook of that module
    and left by a forward hook that also runs when the forward raises: nothing outside that module's forward
    is affected.

    Parameters
    ----------
    specs: mapping of str to tuple of str
        Class name -> names of the inline functions it calls (keys of :py:data:`INLINE_FUNCTIONS`).
    """
    def __init__(self, specs: Mapping[str, tuple[str, ...]]):
        super().__init__()
        self.specs = dict(specs)
        self.parent = None
        self.attributes = []
        self.handles = []

    def apply(self, root_module: torch.nn.Module) -> list[Canonizer]:
        targets = [
            (module, self.specs[type(module).__name__]) for module in root_module.modules()
            if type(module).__name__ in self.specs
        ]
        return _apply_all(self, root_module, targets)

    def register(self, parent: torch.nn.Module, names: tuple[str, ...]) -> None:
        self.parent = parent
        routes = {}
        for name in names:
            functions, factory = INLINE_FUNCTIONS[name]
            module = factory()
            self.attributes.append(_add_child(parent, name, module))
            routes.update({function: module for function in functions})
        modes = []

        def enter(module, args):
            mode = _RouteFunctions(routes)
            mode.__enter__()
            modes.append(mode)

        def leave(module, args, output):
            if modes:
                modes.pop().__exit__(None, None, None)

        self.handles = [
            parent.register_forward_pre_hook(enter),
            parent.register_forward_hook(leave, always_call=True),
        ]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for attribute in self.attributes:
            del self.parent._modules[attribute]
        self.parent, self.attributes, self.handles = None, [], []

    def copy(self) -> 'InlineActivationCanonizer':
        return type(self)(self.specs)
