"""The AttnLRP composites for language models (epsilon rule on linear layers)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from zennit.core import Composite, Hook

from ..canonizers import GeneralCanonizer, canonizers_for
from ..kinds import LINEARS, is_activation, norm_kind
from ..modules import MatMul, Operand, Product
from ..rules import (
    BilinearEpsilon,
    ConstantFactors,
    ConstantOperand,
    Epsilon,
    Identity,
    NormIdentity,
    RelevanceBoundary,
    Softmax,
    UniformOperand,
    UniformProduct,
)

#: Attribute that marks every module of a model while a zennit-attn composite is registered to it (a weak reference
#: to the composite); see :py:meth:`AttnLRPComposite.register`.
REGISTERED_ATTRIBUTE = '_zennit_attn_composite'


class CompiledModelError(TypeError):
    """A model, or one of its submodules, is compiled with ``torch.compile``, which bypasses the hooks of the LRP
    rules; raised by :py:func:`refuse_compiled`."""


def _is_compile_wrapper(module: torch.nn.Module) -> bool:
    """Whether ``module`` is the wrapper ``torch.compile(module)`` returns (``torch._dynamo``'s
    ``OptimizedModule``), recognised by class name so that ``torch._dynamo`` need not be imported."""
    return '_orig_mod' in module._modules and any(cls.__name__ == 'OptimizedModule' for cls in type(module).__mro__)


#: what the hooks of each use of :py:func:`refuse_compiled` do, what compiling would do to them, the verb of the fix
COMPILED_USES = {
    'explain': ('the LRP rules', 'the relevance would be silently wrong', 'Explain', 'explain'),
    'steer': ('steering', 'steering would silently change nothing', 'Steer', 'steer'),
}


def refuse_compiled(model: torch.nn.Module, use: str = 'explain') -> None:
    """Raise if ``model`` or any of its submodules is compiled with ``torch.compile``.

    The LRP rules act through forward hooks and canonizers that change the model's modules. A compiled module
    runs code traced by TorchDynamo instead, which bypasses hooks registered afterwards: the relevance would be
    silently wrong (e.g. zero at every block in :py:func:`~zennit_attn.conservation`). Both ways of compiling are
    recognised, on the root and on every submodule:

    - ``compiled = torch.compile(model)`` returns a wrapper (``torch._dynamo.eval_frame.OptimizedModule``)
      that holds the uncompiled model as ``compiled._orig_mod``: explain that one instead;
    - ``model.compile()`` compiles in place (it sets ``module._compiled_call_impl``): explain a fresh,
      uncompiled instance (load the model again, or ``copy.deepcopy(model)``, which leaves the in-place
      compilation behind).

    The check only reads module attributes; it does not import ``torch._dynamo``.

    Parameters
    ----------
    model: torch.nn.Module
        The model to check, before registering hooks to it.
    use: str
        What the hooks are for, a key of :py:data:`COMPILED_USES` (``'explain'``, ``'steer'``): the message says so.

    Raises
    ------
    CompiledModelError
        A :py:class:`TypeError`, if ``model`` or one of its submodules is compiled. The message names the model's
        class, the compiled submodule (if not the root) and what to explain instead.

    Examples
    --------
    >>> refuse_compiled(model)                  # returns None for an uncompiled model
    >>> refuse_compiled(torch.compile(model))   # raises CompiledModelError: pass compiled._orig_mod
    """
    hooks, effect, verb, lower = COMPILED_USES[use]
    for name, module in model.named_modules():
        if _is_compile_wrapper(module):
            inner = type(module._orig_mod).__name__
            if name == '':
                raise CompiledModelError(
                    f'{inner} was compiled with torch.compile(model): the wrapper it returns '
                    f'({type(module).__name__}) runs code traced by TorchDynamo, which bypasses the forward hooks of '
                    f'{hooks}, so {effect}. {verb} the uncompiled model instead: pass compiled._orig_mod (the '
                    f'{inner} that torch.compile wrapped).'
                )
            raise CompiledModelError(
                f'{type(model).__name__} has a torch.compile wrapper ({type(module).__name__} of {inner}) as its '
                f"submodule '{name}': compiled code bypasses the forward hooks of {hooks}, so {effect}. Put back the "
                f'uncompiled module that the wrapper holds as _orig_mod, and {lower} the model again.'
            )
        if module.__dict__.get('_compiled_call_impl') is not None:
            subject = '' if name == '' else f"'s submodule '{name}' ({type(module).__name__})"
            raise CompiledModelError(
                f'{type(model).__name__}{subject} was compiled in place (.compile()): compiling bypasses the '
                f'forward hooks of {hooks}, so {effect}. {verb} a fresh, uncompiled instance of the model (load it '
                'again, or copy.deepcopy(model), which leaves the in-place compilation behind).'
            )


class AttnLRPComposite(Composite):
    """Base of the AttnLRP composites: maps module types to rules and picks canonizers for the model.

    The root module gets a :py:class:`~zennit_attn.engine.rules.RelevanceBoundary`, so that, as with any zennit
    composite, relevance given at the output (``grad_outputs``) comes out as relevance at the floating-point
    inputs. Use as ``with composite.context(model) as modified: ...``; everything is undone on exit, also when
    the block raises.

    A composite holds one model at a time, and a model takes one zennit-attn composite at a time:
    :py:meth:`register` refuses a second registration (``RuntimeError``) instead of silently moving the rules
    from the first model, or stacking two sets of rules on one model. It also refuses compiled models (see
    :py:func:`refuse_compiled`). While registered, :py:attr:`registered_module` is the model (None otherwise).

    Parameters
    ----------
    epsilon: float
        Stabiliser of the epsilon rule (Eq. 8) on linear layers and of the matmul rule (Prop. 3.3) on
        :py:class:`~zennit_attn.engine.modules.MatMul` modules. 0 (default) is the exact limit, which needs no
        stabiliser in the gradient formulation and registers nothing on linear layers.
    canonizers: sequence of zennit.canonizers.Canonizer, optional
        Canonizers to apply. By default :py:func:`~zennit_attn.engine.canonizers.canonizers_for` chooses them for the
        model at registration: the family table's where it covers the model, else the general mechanism
        (:py:class:`~zennit_attn.engine.canonizers.general.GeneralCanonizer`).
    general: bool, optional
        Passed to :py:func:`~zennit_attn.engine.canonizers.canonizers_for`: True forces the general mechanism, False the
        family table (refusing models it does not cover).
    """

    #: see the parameter ``general``
    general: bool | None = None
    #: rule for the operands of inline products
    operand_rule: type = UniformOperand
    #: the root module this composite is registered to; None while it is not registered
    registered_module: torch.nn.Module | None = None

    def __init__(self, epsilon: float = 0.0, canonizers: Sequence | None = None, general: bool | None = None):
        if epsilon < 0:
            raise ValueError(f'epsilon must be >= 0, got {epsilon}')
        self.epsilon = epsilon
        self.general = general
        self.fixed_canonizers = None if canonizers is None else list(canonizers)
        super().__init__(module_map=self.mapping, canonizers=self.fixed_canonizers)

    def register(self, module: torch.nn.Module) -> None:
        """Apply the canonizers and register the rules to ``module`` and its submodules.

        Raises :py:class:`CompiledModelError` (a ``TypeError``) for a compiled model, and ``RuntimeError`` while
        this composite is registered (to any model), or while another zennit-attn composite is registered to
        ``module``, one of its submodules or a module containing it; a refused registration changes nothing.
        """
        refuse_compiled(module)
        self.refuse_registered(module)
        self.remove()
        if self.fixed_canonizers is None:
            self.canonizers = canonizers_for(
                module, constant_gates=self.operand_rule.scales['gate'] == 0, general=self.general
            )
        else:
            self.canonizers = self.fixed_canonizers
        try:
            super().register(module)  # starts with self.remove(): mark afterwards
            self._mark(module)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Remove the hooks, revert the canonizers and the registration marks (a no-op while not registered)."""
        try:
            super().remove()
        finally:
            self._unmark()

    def refuse_registered(self, module: torch.nn.Module) -> None:
        """Raise ``RuntimeError`` if this composite is registered, or a zennit-attn composite is registered to
        ``module`` or to a module it shares a submodule with (checked by :py:meth:`register`)."""
        current = self.registered_module
        name = type(self).__name__
        if current is module:
            raise RuntimeError(
                f'{name} is already registered to {type(current).__name__} (this model): a composite holds one '
                'model at a time, and registering it again would remove the rules from the model when the inner '
                'context exits. Use the model inside the first context as it is, or leave that context first.'
            )
        if current is not None:
            raise RuntimeError(
                f'{name} is already registered to {type(current).__name__}: a composite holds one model at a time, '
                'and registering it again would silently remove the rules from the first one. Leave the first '
                f'context (or call remove()) first, or use a second instance, e.g. {name}().'
            )
        for path, child in module.named_modules():
            other = _registered_composite(child)
            if other is not None:
                where = '' if path == '' else f" at '{path}'"
                if other.registered_module is not child:
                    where += f' (as part of {type(other.registered_module).__name__})'
                raise RuntimeError(
                    f'{type(module).__name__} already has {type(other).__name__} registered{where}: '
                    'a model takes one zennit-attn composite at a time, and another zennit-attn composite would add '
                    'a second set of rules, which changes the relevance. Leave the context of that '
                    f'{type(other).__name__} (or call its remove()) first.'
                )

    def _mark(self, module: torch.nn.Module) -> None:
        """Record ``module`` as the registered root and mark it and its submodules with a weak reference to this
        composite (restored by :py:meth:`_unmark`)."""
        self.registered_module = module
        reference = weakref.ref(self)
        self._marked = {}
        for child in module.modules():
            self._marked[id(child)] = (child, child.__dict__.get(REGISTERED_ATTRIBUTE))
            child.__dict__[REGISTERED_ATTRIBUTE] = reference

    def _unmark(self) -> None:
        marked = self.__dict__.pop('_marked', {})
        self.__dict__.pop('registered_module', None)
        for child, previous in marked.values():
            reference = child.__dict__.get(REGISTERED_ATTRIBUTE)
            if reference is None or reference() is not self:
                continue
            if previous is None:
                del child.__dict__[REGISTERED_ATTRIBUTE]
            else:
                child.__dict__[REGISTERED_ATTRIBUTE] = previous

    def mapping(self, ctx: dict, name: str, module: torch.nn.Module) -> Hook | None:
        """Return the rule for ``module`` (``name`` is its path; '' is the root)."""
        if name == '':
            return RelevanceBoundary()
        if isinstance(module, Operand):
            return self.operand_rule()
        if isinstance(module, Product):
            return self.product_rule()
        if isinstance(module, MatMul):
            return self.matmul_rule()
        if is_activation(module):
            return Identity()
        kind = norm_kind(module)
        if kind is not None and not (kind == 'probe' and self.sees_inside()):
            return NormIdentity()
        if isinstance(module, torch.nn.Softmax):
            return Softmax()
        if isinstance(module, LINEARS) and self.epsilon:  # epsilon 0 is the plain gradient: nothing to register
            return Epsilon(self.epsilon)
        return None

    def sees_inside(self) -> bool:
        """Whether the general mechanism classifies the operations of the registered model: then a module that is
        only named like a normalisation (``norm_kind`` ``'probe'``: a channels-first LayerNorm, MobileBERT's
        element-wise affine ``NoNorm``) needs no rule of its own, the operations inside it get theirs (a normaliser
        ``g(x)`` is a constant, Prop. 3.4), whatever dimension it normalises."""
        return any(isinstance(canonizer, GeneralCanonizer) for canonizer in self.canonizers or ())

    def product_rule(self) -> Hook:
        return UniformProduct()

    def matmul_rule(self) -> Hook:
        return BilinearEpsilon(self.epsilon)


def _registered_composite(module: torch.nn.Module) -> AttnLRPComposite | None:
    """The zennit-attn composite registered to ``module`` (as the root or a submodule of the root), or None. A
    mark that a copy of the module carries over (``copy.deepcopy`` inside a context) does not count."""
    reference = module.__dict__.get(REGISTERED_ATTRIBUTE)
    composite = reference() if reference is not None else None
    if composite is None:
        return None
    entry = composite.__dict__.get('_marked', {}).get(id(module))
    return composite if entry is not None and entry[0] is module else None


class AttnLRPEpsilon(AttnLRPComposite):
    """AttnLRP for language models (Sec. 3): epsilon rule on linear layers, identity rule on activations and
    normalisations, softmax rule (Prop. 3.1) and uniform/bilinear rules (Props. 3.2, 3.3) in attention and
    gated MLPs."""


class CPLRPEpsilon(AttnLRPComposite):
    """CP-LRP baseline (Ali et al. 2022), as in the paper's comparisons: the attention probabilities and the
    non-linear gate of gated MLPs are constants (no relevance through the softmax or the gate); everything
    else as in :py:class:`AttnLRPEpsilon`. For :py:class:`~zennit_attn.engine.modules.Product` and
    :py:class:`~zennit_attn.engine.modules.MatMul` modules the first factor is the constant one (gate, attention
    matrix)."""

    operand_rule = ConstantOperand

    def product_rule(self) -> Hook:
        return ConstantFactors((0,))

    def matmul_rule(self) -> Hook:
        return ConstantFactors((0,))
