"""The general mechanism: canonizers that give the inline operations of a model a module to hook.

All canonizers here change model *instances* only (child modules added, hooks registered, a configuration
value set) and put back exactly what was there on :py:meth:`remove`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from zennit.canonizers import Canonizer

from ..modules import Operand


@dataclass(frozen=True)
class Tap:
    """Where an operand comes from and what it is.

    Parameters
    ----------
    roles: str or tuple of str
        Role of the operand (see :py:data:`zennit_attn.engine.modules.ROLES`), or one role per section of the last
        dimension of a fused projection; stored as a tuple.
    sections: tuple of int, optional
        Section sizes (default: equal sections).
    index: int, optional
        For producers returning a tuple: the element that is the operand.
    """

    roles: tuple[str, ...]
    sections: tuple[int, ...] | None = None
    index: int | None = None

    def __post_init__(self):
        object.__setattr__(self, 'roles', (self.roles,) if isinstance(self.roles, str) else tuple(self.roles))
        if self.sections is not None:
            object.__setattr__(self, 'sections', tuple(int(size) for size in self.sections))
        self.operand()  # validates the roles and sections

    @classmethod
    def ensure(cls, spec) -> Tap:
        """``spec`` itself if it is a Tap, else ``Tap(spec)`` (a role or a tuple of roles)."""
        return spec if isinstance(spec, cls) else cls(spec)

    def operand(self) -> Operand:
        """A new :py:class:`~zennit_attn.engine.modules.Operand` module for this tap."""
        return Operand(self.roles, self.sections)

    def mask(self, role: str, size: int) -> torch.Tensor:
        """``[size]`` boolean mask of the entries of a last dimension of ``size`` that belong to ``role``."""
        parts = [
            torch.full((length,), name == role) for name, length in zip(self.roles, self.operand().section_sizes(size))
        ]
        return torch.cat(parts)


#: ``module -> {child attribute: role, roles or Tap}``: where the operands of a module's products come from.
OperandSpec = Callable[[torch.nn.Module], Mapping[str, object]]


def parse_taps(spec: OperandSpec | Mapping[str, object], module: torch.nn.Module) -> dict[str, Tap]:
    """The taps of ``module``: ``{child attribute or parameter name: Tap}`` from an operand specification, which
    is a mapping or a function of the module returning one, with a role, a tuple of roles or a :py:class:`Tap` per
    name. The one reader of the family table's operand entries (canonizers, composites and methods use it)."""
    items = spec(module) if callable(spec) else spec
    return {name: Tap.ensure(tap) for name, tap in items.items()}


#: Inline functions (by name) that :py:class:`InlineActivationCanonizer` can route through a module.
INLINE_FUNCTIONS: dict[str, tuple[tuple[Callable, ...], Callable[[], torch.nn.Module]]] = {
    'tanh': ((torch.tanh, torch.Tensor.tanh, torch.nn.functional.tanh), torch.nn.Tanh),
    'gelu': ((torch.nn.functional.gelu,), torch.nn.GELU),
    'sigmoid': ((torch.sigmoid, torch.Tensor.sigmoid, torch.nn.functional.sigmoid), torch.nn.Sigmoid),
}

_PREFIX = 'attnlrp_'


def _add_child(parent: torch.nn.Module, name: str, child: torch.nn.Module) -> str:
    attribute = _PREFIX + name
    if attribute in parent._modules or hasattr(parent, attribute):
        raise RuntimeError(
            f'{type(parent).__name__} already has an attribute {attribute!r}: is another zennit-attn composite '
            'registered to this model? Leave its context first.'
        )
    parent.add_module(attribute, child.train(parent.training))
    return attribute


class _InstanceCanonizer(Canonizer):
    """A canonizer applied to every module whose class name is a key of ``specs``; one instance per module.

    Subclasses implement :py:meth:`register` (using :py:meth:`_add` and :py:attr:`handles`); removal deletes
    the added children and hooks. Applying is all or nothing.
    """

    def __init__(self, specs: Mapping[str, object]):
        super().__init__()
        self.specs = dict(specs)
        self.parent = None
        self.attributes: list[str] = []
        self.handles: list = []

    def apply(self, root_module: torch.nn.Module) -> list[Canonizer]:
        targets = [module for module in root_module.modules() if type(module).__name__ in self.specs]
        instances = []
        try:
            for module in targets:
                instance = self.copy()
                instances.append(instance)
                instance.register(module, self.specs[type(module).__name__])
        except BaseException:
            for instance in instances:
                instance.remove()
            raise
        return instances

    def _add(self, parent: torch.nn.Module, name: str, child: torch.nn.Module) -> torch.nn.Module:
        self.parent = parent
        self.attributes.append(_add_child(parent, name, child))
        return child

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for attribute in self.attributes:
            del self.parent._modules[attribute]
        self.parent, self.attributes, self.handles = None, [], []

    def copy(self):
        return type(self)(self.specs)


class OperandCanonizer(_InstanceCanonizer):
    """Attach :py:class:`~zennit_attn.engine.modules.Operand` modules to the outputs of the child modules that produce
    the operands of inline products (``Q K^T``, ``A V`` in attention, ``act(gate) * up`` in gated MLPs,
    routing weight times expert output in mixtures of experts).

    The Operand is added as a child ``attnlrp_<child>`` of the module and called on the child's output by a
    forward hook, so a composite can register a rule to it.

    Parameters
    ----------
    specs: mapping of str to callable
        Class name -> ``module -> {child attribute: role, roles or Tap}``.
    """

    def register(self, parent: torch.nn.Module, spec: OperandSpec) -> None:
        for child_name, tap in parse_taps(spec, parent).items():
            operand = self._add(parent, child_name, tap.operand())
            self.handles.append(getattr(parent, child_name).register_forward_hook(self._hook(operand, tap.index)))

    @staticmethod
    def _hook(operand: Operand, index: int | None):
        def hook(module, input, output):
            if index is None:
                return operand(output)
            output = list(output)
            output[index] = operand(output[index])
            return tuple(output)

        return hook


class _RouteFunctions(TorchFunctionMode):
    """While a module's forward runs, hand calls of some torch functions to ``handler``.

    ``handler(func, args, kwargs)`` returns the result, or :py:data:`NotImplemented` to run ``func`` as is.
    """

    def __init__(self, handler):
        super().__init__()
        self.handler = handler

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = self.handler(func, args, kwargs)
        return func(*args, **kwargs) if result is NotImplemented else result


class _FunctionRoutingCanonizer(_InstanceCanonizer):
    """Base of the canonizers that route torch function calls inside a module's forward.

    The routing is a :py:class:`torch.overrides.TorchFunctionMode` entered by a forward pre-hook of the module
    (or, with ``after``, by a forward hook of one of its children, so that only what follows that child is
    routed) and left by a forward hook of the module that runs also when the forward raises: nothing outside
    that forward is affected.
    """

    def _route(self, parent: torch.nn.Module, handler, after: str | None = None, check=None) -> None:
        """Route ``handler`` during ``parent``'s forward; ``check()`` runs after a forward that returned."""
        modes = []

        def enter(*args):
            mode = _RouteFunctions(handler)
            mode.__enter__()
            modes.append(mode)

        def leave(module, args, output):
            while modes:
                modes.pop().__exit__(None, None, None)
            if check is not None and output is not None:
                check()

        if after is None:
            self.handles.append(parent.register_forward_pre_hook(enter))
        else:
            self.handles.append(getattr(parent, after).register_forward_hook(enter))
        self.handles.append(parent.register_forward_hook(leave, always_call=True))


class InlineActivationCanonizer(_FunctionRoutingCanonizer):
    """Route element-wise non-linearities that a module calls as functions (``torch.tanh(x)``) through
    activation modules added as its children, so the identity rule (Eq. 9) can attach to them.

    Parameters
    ----------
    specs: mapping of str to tuple
        Class name -> names of the inline functions it calls (keys of :py:data:`INLINE_FUNCTIONS`), optionally
        followed by ``after=<child>`` as a pair ``(names, child)`` to route only after that child's forward
        (e.g. the final logit soft-capping after ``lm_head``).
    """

    def register(self, parent: torch.nn.Module, spec) -> None:
        names, after = spec if len(spec) == 2 and isinstance(spec[0], tuple) else (spec, None)
        routes = {}
        for name in names:
            functions, factory = INLINE_FUNCTIONS[name]
            module = self._add(parent, name, factory())
            routes.update({function: module for function in functions})

        def handler(func, args, kwargs):
            module = routes.get(func)
            if module is None:
                return NotImplemented
            if len(args) != 1 or set(kwargs) - {'approximate'} or kwargs.get('approximate', 'none') != 'none':
                raise NotImplementedError(
                    f'zennit-attn routes {getattr(func, "__name__", func)} through {type(module).__name__} only for '
                    f'a single tensor with default options; got {len(args)} arguments and {kwargs}'
                )
            return module(args[0])

        self._route(parent, handler, after)


class InlineOperandCanonizer(_FunctionRoutingCanonizer):
    """Tap the outputs of ``torch.nn.functional.linear`` calls whose weight is (a slice of) a parameter of the
    module, e.g. the fused gate/up projection of the experts of a mixture of experts, stored as 3-D tensors.

    Parameters
    ----------
    specs: mapping of str to mapping
        Class name -> ``{parameter name: role, roles or Tap}``.
    """

    def register(self, parent: torch.nn.Module, spec: Mapping[str, object]) -> None:
        taps = {}
        for name, tap in parse_taps(spec, parent).items():
            taps[name] = self._add(parent, name, tap.operand())
        tapped = []

        def handler(func, args, kwargs):
            if func is not torch.nn.functional.linear:
                return NotImplemented
            weight = args[1] if len(args) > 1 else kwargs.get('weight')
            for name in taps:
                # looked up at each call: accelerate's offloading puts a new parameter object in place per forward
                parameter = getattr(parent, name)
                if weight is parameter or getattr(weight, '_base', None) is parameter:
                    tapped.append(name)
                    return taps[name](func(*args, **kwargs))
            return NotImplemented

        def check():
            missing = set(taps) - set(tapped)
            tapped.clear()
            if missing:
                raise RuntimeError(
                    f'{type(parent).__name__} computed {sorted(missing)} without torch.nn.functional.linear, so its '
                    'products could not be attributed: run it with config._experts_implementation = "eager" (the '
                    'composites set this on the model they are registered to)'
                )

        self._route(parent, handler, check=check)


class SettingCanonizer(Canonizer):
    """Set attributes of the model's configuration for the time of the context (e.g. the experts
    implementation of mixtures of experts to the plain loop that the other canonizers understand).

    The values are set on every configuration object held by the module or its submodules that has these
    attributes, so that registering on a block (whose experts hold the model's configuration) works too.

    Parameters
    ----------
    settings: mapping of str to object
        Attribute name -> value.
    """

    def __init__(self, settings: Mapping[str, object]):
        super().__init__()
        self.settings = dict(settings)
        self.config = None
        self.previous = {}

    def apply(self, root_module: torch.nn.Module) -> list[Canonizer]:
        configs = {}
        for module in root_module.modules():
            config = getattr(module, 'config', None)
            if config is not None and all(hasattr(config, key) for key in self.settings):
                configs.setdefault(id(config), config)
        instances = []
        try:
            for config in configs.values():
                instance = self.copy()
                instances.append(instance)  # before register: a value that fails puts back those set before it
                instance.register(config)
        except BaseException:
            for instance in instances:
                instance.remove()
            raise
        return instances

    def register(self, config) -> None:
        self.config = config
        for key, value in self.settings.items():
            previous = getattr(config, key)
            setattr(config, key, value)
            self.previous[key] = previous  # only values that were set are put back

    def remove(self) -> None:
        for key, value in reversed(self.previous.items()):
            setattr(self.config, key, value)
        self.config, self.previous = None, {}

    def copy(self) -> SettingCanonizer:
        return type(self)(self.settings)
