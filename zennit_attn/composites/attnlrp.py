"""The AttnLRP composites for language models (epsilon rule on linear layers), and their base class.

A composite decides every rule: the zennit rules of modules (:py:meth:`AttnLRPComposite.mapping`: activations,
normalisations, linear layers) and the rules the engine applies at the operations a model performs
(:py:class:`~zennit_attn.canonizers.OperationCanonizer`): the product rule of every product
(:py:attr:`AttnLRPComposite.product_rule`) and the activation rule of element-wise functions computed inline
(:py:attr:`AttnLRPComposite.activation_rule`). A subclass, or a composite constructed with other rules, changes the
explanation of every model.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator, Mapping, Sequence

import torch
from zennit.core import Composite, CompositeContext, Hook

from ..canonizers import OperationCanonizer
from ..core.blocks import NoBlocksError, block_stacks
from ..core.errors import CompiledModelError, UnsupportedModelError
from ..core.kinds import CONVOLUTIONS, LINEARS, is_activation, norm_kind
from ..core.modules import Modules
from ..operations import RuleTable, check_overrides
from ..rules import (
    ConstantAttention,
    ConstantGates,
    Epsilon,
    HalfGates,
    Identity,
    NormIdentity,
    ProductRule,
    RelevanceBoundary,
    Uniform,
    plain_stands_for,
)
from ..rules.positions import PositionInputs

#: The layers whose rule of a composite applies where they are called (:py:meth:`AttnLRPComposite._apply`).
LAYERS = LINEARS + CONVOLUTIONS

#: Attribute that marks every module of a model while a zennit-attn composite is registered to it (a weak reference
#: to the composite); see :py:meth:`AttnLRPComposite.register`.
REGISTERED_ATTRIBUTE = '_zennit_attn_composite'


def _is_compile_wrapper(module: torch.nn.Module) -> bool:
    """Whether ``module`` is the wrapper ``torch.compile(module)`` returns (``torch._dynamo``'s
    ``OptimizedModule``), recognised by class name so that ``torch._dynamo`` need not be imported."""
    return '_orig_mod' in module._modules and any(cls.__name__ == 'OptimizedModule' for cls in type(module).__mro__)


#: what the hooks of each use of :py:func:`refuse_compiled` do, what compiling would do to them, the verb of the fix
COMPILED_USES = {
    'explain': ('the LRP rules', 'the relevance would be silently wrong', 'Explain', 'explain'),
    'steer': ('steering', 'steering would silently change nothing', 'Steer', 'steer'),
}


def refuse_compiled(model: torch.nn.Module, use: str = 'explain', modules: Modules | None = None) -> None:
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
    modules: list of (str, torch.nn.Module), optional
        ``list(model.named_modules())`` where the caller has walked the model already.

    Raises
    ------
    CompiledModelError
        If ``model`` or one of its submodules is compiled. The message names the model's
        class, the compiled submodule (if not the root) and what to explain instead.

    Examples
    --------
    >>> refuse_compiled(model)                  # returns None for an uncompiled model
    >>> refuse_compiled(torch.compile(model))   # raises CompiledModelError: pass compiled._orig_mod
    """
    hooks, effect, verb, lower = COMPILED_USES[use]
    for name, module in model.named_modules() if modules is None else modules:
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


def rule_hooks(model: torch.nn.Module, modules: Modules | None = None) -> list[tuple[str, Hook]]:
    """``(module name, hook)`` of every zennit rule (:py:class:`zennit.core.Hook`, e.g. ``Epsilon``, ``ZPlus`` or
    a zennit-attn rule) registered on ``model`` or its submodules (``modules``: ``list(model.named_modules())`` where
    the caller has it), as a composite's ``context`` or ``register`` leaves them; each hook once, in module order."""
    found, seen = [], set()
    for name, module in model.named_modules() if modules is None else modules:
        for function in [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]:
            hook = getattr(function, '__self__', None)
            if isinstance(hook, Hook) and id(hook) not in seen:
                seen.add(id(hook))
                found.append((name, hook))
    return found


class AttnLRPComposite(Composite):
    """Base of the AttnLRP composites: the rules of modules and of operations, applied to any model.

    The root module gets a :py:class:`~zennit_attn.rules.RelevanceBoundary`, so that, as with any zennit
    composite, relevance given at the output (``grad_outputs``) comes out as relevance at the floating-point
    inputs. Use as ``with composite.context(model) as modified: ...``; everything is undone on exit, also when
    the block raises.

    Registering applies the engine (:py:class:`~zennit_attn.canonizers.OperationCanonizer`) with the
    composite's :py:attr:`product_rule` and :py:attr:`activation_rule` (after the ``canonizers`` given), and maps the
    module rules (:py:meth:`mapping`).

    A composite holds one model at a time, and a model takes one zennit-attn composite at a time:
    :py:meth:`register` refuses a second registration (``RuntimeError``) instead of silently moving the rules
    from the first model, or stacking two sets of rules on one model. It also refuses compiled models (see
    :py:func:`refuse_compiled`). While registered, :py:attr:`registered_module` is the model (None otherwise).

    Parameters
    ----------
    epsilon: float
        Stabiliser of the epsilon rule (Eq. 8) on linear layers, and on the linear maps a model computes with the
        parameters of other modules (transformers' fused experts, routers with a weight of their own:
        :py:meth:`inline_rule`). 0 (default) is the exact limit, which needs no stabiliser in the gradient formulation
        and registers nothing on linear layers.
    canonizers: sequence of zennit.canonizers.Canonizer, optional
        Further canonizers, applied before the engine (e.g. zennit's own).
    product_rule: ProductRule, optional
        How products share their relevance (:py:mod:`zennit_attn.rules.products`); default the class's
        :py:attr:`product_rule`.
    overrides: mapping of str to rule, optional
        The rules of single operations instead of the engine's, by the operation's name in the registry (``'mul'``,
        ``'silu'``, ``'matmul'``, ...; the names of :py:meth:`rule_table`): a
        :py:class:`~zennit_attn.rules.products.ProductRule` for a product, an activation rule (such as
        :py:class:`~zennit_attn.rules.Identity`) for an element-wise function, or for any operation a function
        ``function(func, args, kwargs)`` that returns ``func(*args, **kwargs)`` computed with the gradient of its rule
        (:py:func:`~zennit_attn.operations.registry.check_overrides`; docs: Use a composite). Checked here:
        an unknown operation is refused with the known ones. The marks of the operation (what its output is, e.g. a
        gate) stay the registry's.
    positions: bool
        PA-LRP (Bakish et al. 2025, :py:mod:`zennit_attn.rules.positions`): the outputs of the model's position
        encodings (rotary, learned, sinusoidal) become inputs of the explanation, next to its own inputs, so that the
        relevance they absorb as constants is the positions' (:py:attr:`position_inputs` holds their leaves;
        :py:func:`zennit_attn.explain` returns it per position, ``Explanation.position_relevance``). A model without
        such an encoding is refused on registering (``ValueError``).

    Examples
    --------
    The half rule on every element-wise product, AttnLRP's rules elsewhere, and an operation's rule of one's own::

        def halves(func, args, kwargs):  # the uniform rule on a product of two relevance-carrying factors
            first, second = (scaled_gradient(tensor, 0.5) for tensor in args[:2])
            return func(first, second, *args[2:], **kwargs)

        composite = AttnLRPEpsilon(overrides={'mul': ConstantGates(), 'matmul': halves})
    """

    #: the product rule of the engine (:py:mod:`zennit_attn.rules.products`): AttnLRP's uniform rule
    product_rule: ProductRule = Uniform()
    #: the rule of activation modules, and of the element-wise functions a model computes inline (the engine calls its
    #: ``elementwise(input, output, gate)``); None: the plain gradient
    activation_rule: type | None = Identity
    #: the method of :py:func:`zennit_attn.explain` that names this composite's rules where their product rules alone
    #: do not (:py:func:`zennit_attn.methods.propagation.lrp_method`); None: named by its product rule
    method: str | None = None
    #: the root module this composite is registered to; None while it is not registered
    registered_module: torch.nn.Module | None = None
    #: the engine of the last registration (see :py:meth:`register`), None before the first
    operation_canonizer: OperationCanonizer | None = None

    def __init__(
        self,
        epsilon: float = 0.0,
        canonizers: Sequence | None = None,
        product_rule: ProductRule | None = None,
        overrides: Mapping | None = None,
        positions: bool = False,
    ):
        if epsilon < 0:
            raise ValueError(f'epsilon must be >= 0, got {epsilon}')
        if product_rule is not None and not isinstance(product_rule, ProductRule):
            raise TypeError(f'product_rule must be a ProductRule (Uniform(), ConstantGates()), got {product_rule!r}')
        self.epsilon = epsilon
        #: the rules of single operations instead of the engine's, by operation name (checked against the registry)
        self.overrides = check_overrides(overrides)
        if product_rule is not None:
            self.product_rule = product_rule
        self.extra_canonizers = [] if canonizers is None else list(canonizers)
        self.positions = bool(positions)
        #: the position encodings as explained inputs while registered with ``positions=True`` (PA-LRP), else None
        self.position_inputs: PositionInputs | None = None
        super().__init__(module_map=self.mapping, canonizers=self.extra_canonizers)

    def register(self, module: torch.nn.Module, modules: Modules | None = None) -> None:
        """Apply the canonizers and the engine and register the rules to ``module`` and its submodules, in one walk
        over the modules (``modules``: ``list(module.named_modules())`` where the caller has walked it already).

        Raises :py:class:`~zennit_attn.core.errors.CompiledModelError` for a compiled model, and ``RuntimeError``
        while this composite is registered (to any model), while another zennit-attn composite is registered to
        ``module``, one of its submodules or a module containing it, or while other zennit rules are registered to
        ``module`` or its submodules (:py:meth:`refuse_rules`); a refused registration changes nothing.
        """
        modules = list(module.named_modules()) if modules is None else modules
        refuse_compiled(module, modules=modules)
        self.refuse_registered(module, modules)
        self.refuse_rules(module, modules=modules)
        self.remove()
        #: the engine applied at the last registration (its ``constants``: the constants the model added to
        #: relevance, noted while it ran)
        self.operation_canonizer = self.engine(module)
        self.canonizers = [*self.extra_canonizers, self.operation_canonizer]
        try:
            self._apply(module, modules)
            self._mark(module, modules)
        except BaseException:
            self.remove()
            raise

    def context(self, module: torch.nn.Module, modules: Modules | None = None) -> CompositeContext:
        """zennit's context: registered to ``module`` on entering (on its walk ``modules`` where the caller has
        it: :py:meth:`register`), removed on exit, also when the block raises."""
        return CompositeContext(module, self) if modules is None else _WalkedContext(module, self, modules)

    def _apply(self, module: torch.nn.Module, modules: Modules) -> None:
        """zennit's ``Composite.register`` (after :py:meth:`remove`) on the walk ``modules``: the canonizers, then a
        copy of the rule :py:meth:`mapping` gives each module. Canonizers other than the engine may replace modules:
        the model is walked again after them."""
        for canonizer in self.extra_canonizers:
            self.handles += canonizer.apply(module)
        if self.extra_canonizers:
            modules = list(module.named_modules())
        engines = self.operation_canonizer.apply(module, modules)
        self.handles += engines
        if self.positions:
            self.position_inputs = PositionInputs()
            self.handles.append(self.position_inputs.register(module, modules))
        ctx, layers, inline = {}, {}, {}
        for name, child in modules:
            template = self.module_map(ctx, name, child)
            if template is not None:
                hook = template.copy()
                self.hook_refs.add(hook)
                self.handles.append(hook.register(child))
                if isinstance(child, LAYERS) and not plain_stands_for(template):
                    layers[name] = (child, rule_label(template))
            if child._parameters and not isinstance(child, LAYERS):
                rule = self.inline_rule(child)
                if not plain_stands_for(rule):
                    inline[name] = (child, rule, rule_label(rule))
        if layers or inline:  # the rules of linear maps computed without calling a layer (see guard_layers)
            engines[0].guard_layers(layers, _inline_parameters(inline, modules))

    def product_rules(self) -> tuple[ProductRule, ...]:
        """The product rules the engine applies with this composite (one, or one per scope of a subclass)."""
        return (self.product_rule,)

    def engine(self, module: torch.nn.Module) -> OperationCanonizer:
        """The engine with this composite's rules for ``module``: :py:attr:`product_rule`, and the product rules of
        :py:meth:`scopes` inside their modules."""
        activation = None if self.activation_rule is None else self.activation_rule()
        return OperationCanonizer(self.product_rule, activation, scopes=self.scopes(module), overrides=self.overrides)

    def scopes(self, module: torch.nn.Module) -> list[tuple[torch.nn.Module, ProductRule]]:
        """``(submodule, product rule)`` of the submodules of ``module`` in which another product rule applies (the
        innermost scope's, :py:class:`~zennit_attn.canonizers.OperationCanonizer`); none here, subclasses add them."""
        return []

    def rule_table(self, model: torch.nn.Module, *args, **kwargs) -> RuleTable:
        """Which rule each operation of ``model`` gets under this composite, and why: a dry run of one forward pass of
        the model on ``args`` and ``kwargs``, with no backward pass.

        The floating-point tensors among ``args`` and ``kwargs`` carry relevance (as zennit's attributors make the
        input require gradients); a language model's token ids (``input_ids``) are looked up in its input embeddings
        first (``inputs_embeds``), as :py:func:`zennit_attn.explain` does. Every operation on relevance-carrying
        tensors is recorded with the rule the registry declares for it (or the composite's override) and what the
        engine does there (a product's shares of its factors by their kinds, a normaliser held constant, ...), and
        every module rule of the composite; where the explanation would be refused, the refusal is recorded and the
        operation passed with its plain gradient, so that the table covers the whole model.

        Returns
        -------
        RuleTable
            Its rows (:py:class:`~zennit_attn.operations.tracking.RuleRow`: module, operation, rule, what the
            engine does, count; the layers of a stack merged), its refusals; ``str()`` prints it as a table.

        Raises
        ------
        ValueError
            If no input carries relevance (no floating-point tensor, no token ids of a model with input embeddings).
        """
        args, kwargs = _carrying(model, args, kwargs)
        table = RuleTable(type(model).__name__, self.describe())
        with self.context(model) as modified:
            for name, module in self._walked:
                rule = self.mapping({}, name, module)
                if rule is not None:
                    table.record(name, f'{type(module).__name__} (module)', 'module rule', rule_label(rule))
            engines = [handle for handle in self.handles if isinstance(handle, OperationCanonizer)]
            for engine in engines:
                engine.table = table
            try:
                with torch.enable_grad():
                    modified(*args, **kwargs)
            finally:
                for engine in engines:
                    engine.table = None
        return table

    def describe(self) -> str:
        """The composite in words: its class, product rule and overrides."""
        overrides = ', '.join(f'{name}: {override}' for name, override in self.overrides.items())
        return (
            f'{type(self).__name__} (products: {self.product_rule!r}'
            + (f'; overrides: {overrides}' if overrides else '')
            + ('; positions: PA-LRP' if self.positions else '')
            + ')'
        )

    @contextlib.contextmanager
    def inactive(self) -> Iterator[AttnLRPComposite]:
        """zennit's context that switches the gradient modification off (to differentiate the modified gradient),
        here also the engine: inside it the registered model computes its plain gradient."""
        engines = [handle for handle in self.handles if isinstance(handle, OperationCanonizer)]
        with super().inactive():
            for engine in engines:
                engine.active = False
            try:
                yield self
            finally:
                for engine in engines:
                    engine.active = True

    def remove(self) -> None:
        """Remove the hooks, revert the canonizers and the registration marks (a no-op while not registered)."""
        try:
            super().remove()
        finally:
            self._unmark()

    def refuse_registered(self, module: torch.nn.Module, modules: Modules | None = None) -> None:
        """Raise ``RuntimeError`` if this composite is registered, or a zennit-attn composite is registered to
        ``module`` or to a module it shares a submodule with (checked by :py:meth:`register`; ``modules``:
        ``list(module.named_modules())`` where the caller has it)."""
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
        for path, child in module.named_modules() if modules is None else modules:
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

    @staticmethod
    def refuse_rules(
        module: torch.nn.Module,
        hint: str = "Leave that context (or call that composite's remove()) first, or map the rules you need in this "
        'composite (docs: Use a composite).',
        modules: Modules | None = None,
    ) -> None:
        """Raise ``RuntimeError`` if zennit rules are registered on ``module`` or its submodules (another zennit
        composite's context: its hooks would change the gradient the rules of this composite pass; checked by
        :py:meth:`register`), with ``hint``: what to do. Rules registered afterwards, inside this composite's context,
        are refused when the model runs (:py:mod:`zennit_attn.core.audit`); ``modules``:
        ``list(module.named_modules())`` where the caller has it."""
        hooks = rule_hooks(module, modules)
        if hooks:
            where = ', '.join(f'{type(hook).__name__} at {name or "the root"!r}' for name, hook in hooks[:3])
            more = f' and {len(hooks) - 3} more' if len(hooks) > 3 else ''
            raise RuntimeError(
                f'{type(module).__name__} already has zennit rules registered ({where}{more}), e.g. inside the '
                'context of a zennit composite: they would change the gradient that the rules of this composite '
                f'pass, and the relevance with it. {hint}'
            )

    def _mark(self, module: torch.nn.Module, modules: Modules) -> None:
        """Record ``module`` as the registered root (and its walk ``modules``) and mark it and its submodules with a
        weak reference to this composite (restored by :py:meth:`_unmark`)."""
        self.registered_module = module
        self._walked = modules
        reference = weakref.ref(self)
        self._marked = {}
        for _, child in modules:
            self._marked[id(child)] = (child, child.__dict__.get(REGISTERED_ATTRIBUTE))
            child.__dict__[REGISTERED_ATTRIBUTE] = reference

    def _unmark(self) -> None:
        marked = self.__dict__.pop('_marked', {})
        self.__dict__.pop('registered_module', None)
        self.__dict__.pop('_walked', None)
        for child, previous in marked.values():
            reference = child.__dict__.get(REGISTERED_ATTRIBUTE)
            if reference is None or reference() is not self:
                continue
            if previous is None:
                del child.__dict__[REGISTERED_ATTRIBUTE]
            else:
                child.__dict__[REGISTERED_ATTRIBUTE] = previous

    def mapping(self, ctx: dict, name: str, module: torch.nn.Module) -> Hook | None:
        """Return the rule for ``module`` (``name`` is its path; '' is the root): the relevance boundary at the root,
        the activation rule on activations, :py:class:`~zennit_attn.rules.NormIdentity` on LayerNorm and
        RMSNorm modules (Prop. 3.4), :py:class:`~zennit_attn.rules.Epsilon` on linear layers for an epsilon
        above 0. Modules only named like a normalisation (a channels-first LayerNorm, MobileBERT's element-wise
        ``NoNorm``) get no rule of their own: the engine classifies the operations inside them, whatever dimension
        they normalise (a normaliser ``g(x)`` is a constant, Prop. 3.4)."""
        if name == '':
            return RelevanceBoundary()
        if is_activation(module):
            return None if self.activation_rule is None else self.activation_rule()
        if norm_kind(module) in ('layer', 'rms'):
            return NormIdentity()
        if isinstance(module, LINEARS) and self.epsilon:  # epsilon 0 is the plain gradient: nothing to register
            return Epsilon(self.epsilon)
        return None

    def inline_rule(self, module: torch.nn.Module) -> Hook | None:
        """The rule of a linear map that ``module``, which is not a layer (:py:data:`LAYERS`), computes with its own
        parameters: the fused weights of transformers' experts (``F.linear(x, self.gate_up_proj[i])``,
        ``torch._grouped_mm``), a router's or a projector's weight held as a parameter, a language model's logits from
        its embedding table (``h @ embed.weight.T``). A rule of a linear layer there: here the epsilon rule of the
        linear layers (None for epsilon 0, the plain gradient); the engine applies an epsilon rule to such a map and
        refuses any other rule (:py:meth:`~zennit_attn.canonizers.OperationCanonizer.guard_layers`)."""
        return Epsilon(self.epsilon) if self.epsilon else None


def _inline_parameters(inline: Mapping[str, tuple], modules: Modules) -> dict[str, tuple]:
    """``parameter path -> (parameter, module, rule, rule in words)`` of the parameters of the modules of ``inline``
    (``module path -> (module, rule, rule in words)``) that no layer holds too (a language model's embedding table
    tied to its head: the head's rule applies where the head is called)."""
    held = {
        id(parameter)
        for _, module in modules
        if isinstance(module, LAYERS)
        for parameter in module._parameters.values()
        if parameter is not None
    }
    return {
        f'{path}.{name}' if path else name: (parameter, module, rule, label)
        for path, (module, rule, label) in inline.items()
        for name, parameter in module._parameters.items()
        if parameter is not None and id(parameter) not in held
    }


class _WalkedContext(CompositeContext):
    """zennit's context of a composite that registers on a walk of the module the caller has
    (:py:meth:`AttnLRPComposite.context`)."""

    def __init__(self, module: torch.nn.Module, composite: AttnLRPComposite, modules: Modules):
        super().__init__(module, composite)
        self.modules = modules

    def __enter__(self) -> torch.nn.Module:
        self.composite.register(self.module, self.modules)
        return self.module


def rule_label(rule) -> str:
    """A module rule in words (its class, and epsilon or gamma where it has one)."""
    inner = getattr(rule, 'rule', None)  # a zennit rule converted at the module's boundary
    name = type(rule).__name__ if inner is None else f'{type(rule).__name__}({type(inner).__name__})'
    for field in ('epsilon', 'gamma'):
        value = getattr(rule if inner is None else inner, field, None)
        if isinstance(value, (int, float)):
            return f'{name}({field}={value:g})'
    return name


def _carrying(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` with their floating-point tensors made leaves that carry relevance, and a language
    model's ``input_ids`` looked up in its input embeddings (``inputs_embeds``)."""
    kwargs = dict(kwargs)
    ids = kwargs.get('input_ids')
    if ids is None and args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
        ids, args = args[0], args[1:]
        kwargs['input_ids'] = ids
    embeddings = getattr(model, 'get_input_embeddings', lambda: None)() if ids is not None else None
    if embeddings is not None:
        kwargs['inputs_embeds'] = embeddings(kwargs.pop('input_ids'))

    def leaf(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.detach().clone().requires_grad_(True)
        return value

    args, kwargs = tuple(leaf(value) for value in args), {key: leaf(value) for key, value in kwargs.items()}
    if not any(isinstance(value, torch.Tensor) and value.requires_grad for value in (*args, *kwargs.values())):
        raise ValueError(
            f'rule_table: no input of {type(model).__name__} carries relevance; pass the floating-point input (e.g. '
            'inputs_embeds or pixel_values) or the token ids of a model with input embeddings'
        )
    return args, kwargs


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
    normalisations, softmax rule (Prop. 3.1) and the uniform rule (Props. 3.2, 3.3) on every product, in attention,
    gated MLPs and mixtures of experts alike."""


class CPLRPEpsilon(AttnLRPComposite):
    """CP-LRP baseline (Ali et al. 2022), as in the paper's comparisons: the attention probabilities and the
    non-linear gates of gated MLPs (also routing weights) are constants where they enter a product
    (:py:class:`~zennit_attn.rules.ConstantGates`); everything else as in :py:class:`AttnLRPEpsilon`."""

    product_rule = ConstantGates()


class RelPEpsilon(AttnLRPComposite):
    """The rules of relevance patching (RelP, Rezaei Jafari, Eberle, Khakzar, Nanda 2025): the attention probabilities
    are constants where they enter a product (CP-LRP's attention), the gates of gated MLPs share the half rule
    (:py:class:`~zennit_attn.rules.ConstantAttention`); identity rules on activations and normalisations, as in
    :py:class:`AttnLRPEpsilon`."""

    product_rule = ConstantAttention()


class AttnLRPLateEpsilon(AttnLRPComposite):
    """AttnLRP with the attention probabilities constant in the later blocks: relevance reaches the queries and keys
    of the earlier blocks only, and flows through the values alone in the later ones.

    You, Zeng, Tsai, Yamada and Zhao (BlackboxNLP 2025, arXiv 2510.18810) find that passing relevance through the
    values only (no relevance through the softmax, CP-LRP's attention) tracks leave-one-out better than AttnLRP,
    above all in the middle-to-late layers. Here the blocks of each stack from the relative depth ``start`` on take
    :py:class:`~zennit_attn.rules.ConstantAttention` (the attention probabilities constant where they enter a
    product; gated MLPs keep the uniform rule, Prop. 3.2), the blocks before them and everything outside the blocks
    AttnLRP's rules (:py:class:`AttnLRPEpsilon`): the softmax rule (Prop. 3.1) and the uniform rule (Props. 3.2,
    3.3). Block ``i`` of a stack of ``n`` is a later block where ``i >= ceil(start * n)``; every stack (an encoder's
    and a decoder's, a vision tower's) is split by its own depth.

    Measured against AttnLRP and CP-LRP on SmolLM2-135M-Instruct and all-MiniLM-L6-v2 (docs: Results, choosing the
    LRP variant): it agrees with leave-one-out at least as well as CP-LRP on the decoder and keeps AttnLRP's
    perturbation faithfulness there. The method ``'attnlrp_late'`` of :py:func:`zennit_attn.explain`.

    Parameters
    ----------
    start: float
        The relative depth, in ``[0, 1]``, from which on the attention probabilities are constants: 0.5 (default)
        the later half of every stack; 0 every block (:py:class:`RelPEpsilon`'s rules), 1 none
        (:py:class:`AttnLRPEpsilon`'s).
    epsilon, canonizers, overrides, positions:
        As :py:class:`AttnLRPComposite`.

    Raises
    ------
    ValueError
        For ``start`` outside ``[0, 1]``.
    UnsupportedModelError
        On registering to a model without transformer blocks (:py:func:`~zennit_attn.core.blocks.block_stacks`):
        which blocks are the later ones is not defined there.
    """

    #: the method of :py:func:`zennit_attn.explain` whose relevance this composite gives (its label)
    method = 'attnlrp_late'
    #: the product rule of the later blocks
    late_rule: ProductRule = ConstantAttention()

    def __init__(
        self,
        start: float = 0.5,
        epsilon: float = 0.0,
        canonizers: Sequence | None = None,
        overrides: Mapping | None = None,
        positions: bool = False,
    ):
        if isinstance(start, bool) or not isinstance(start, (int, float)) or not 0.0 <= start <= 1.0:
            raise ValueError(f'start must be a number in [0, 1] (a relative depth), got {start!r}')
        self.start = float(start)
        super().__init__(epsilon=epsilon, canonizers=canonizers, overrides=overrides, positions=positions)

    def product_rules(self) -> tuple[ProductRule, ...]:
        """AttnLRP's uniform rule before ``start``, :py:attr:`late_rule` from it on."""
        return (self.product_rule, self.late_rule)

    def late_blocks(self, module: torch.nn.Module) -> list[torch.nn.Module]:
        """The blocks of ``module`` whose attention probabilities are constants: those of each stack from
        ``ceil(start * n)`` on.

        Raises
        ------
        UnsupportedModelError
            If ``module`` has no transformer blocks.
        """
        try:
            stacks = block_stacks(module)
        except NoBlocksError as error:
            raise UnsupportedModelError(
                f'{type(self).__name__} makes the attention probabilities constant from a depth of the model on, but '
                f'{error}; explain it with AttnLRPEpsilon() or CPLRPEpsilon() (the same rule in every layer)'
            ) from error
        return [block for _, blocks in stacks for block in blocks[math.ceil(self.start * len(blocks)) :]]

    def scopes(self, module: torch.nn.Module) -> list[tuple[torch.nn.Module, ProductRule]]:
        """:py:attr:`late_rule` inside the later blocks (AttnLRP's product rule elsewhere)."""
        return [(block, self.late_rule) for block in self.late_blocks(module)]

    def describe(self) -> str:
        return super().describe()[:-1] + f'; from depth {self.start:g}: {self.late_rule!r})'


class MLPRules(AttnLRPComposite):
    """The LRP rules of the gated MLP only, the plain gradient elsewhere: the identity rule on activations (Eq. 9)
    and the half rule on ``act(gate) * up`` (Prop. 3.2, :py:class:`~zennit_attn.rules.HalfGates`); attention
    products, softmax and normalisations pass their plain gradient (no
    :py:class:`~zennit_attn.rules.NormIdentity`).

    A method of relevance patching (:py:func:`zennit_attn.workflows.patching.relevance_patching`, ``'mlp_rules'``):
    of the rule choices measured against activation patching on SmolLM2-135M it has the highest Pearson correlation
    where the corrupted prompt differs in one token (IOI with the subject's second mention replaced, subject-verb
    agreement), and fails like the plain gradient on residual streams and MLP outputs where it differs in three (IOI's
    ABC corruption), where the rules on attention and normalisation are needed. Not conservative: not an explanation
    method.
    """

    product_rule = HalfGates()

    def mapping(self, ctx: dict, name: str, module: torch.nn.Module) -> Hook | None:
        """:py:meth:`AttnLRPComposite.mapping` without a rule on normalisation modules (their plain gradient)."""
        if name and norm_kind(module) in ('layer', 'rms'):
            return None
        return super().mapping(ctx, name, module)
