"""The engine: AttnLRP on any model, applied at the operations the model performs, with the composite's rules.

Every model is explained by :py:class:`OperationCanonizer`, which the composites
(:py:mod:`zennit_attn.composites`) apply with their rules: while the model's forward runs (and autograd records
it), the classifying mode (:py:class:`~zennit_attn.operations.classifier.Classifier`) sees every torch function
called on a tensor that carries relevance and applies the rule the operation registry declares for it
(:py:mod:`~zennit_attn.operations.registry`):

- linear, structural and selection operations (add, cat, reshape, index, sum, linear layers on frozen weights, max,
  top-k, ...): the plain gradient (epsilon rule with epsilon -> 0, Eq. 8), nothing to change;
- products of several relevance-carrying tensors, of the elements of one or scattered into one, and the two products
  of ``scaled_dot_product_attention``: the composite's product rule (AttnLRP: the uniform rule, Prop. 3.2 and 3.3;
  CP-LRP: gates and softmax outputs constant; :py:mod:`~zennit_attn.operations.products`); linear attention is
  refused;
- softmaxes: their plain gradient, the softmax rule (Prop. 3.1), also where they are written as ``exp`` of a
  log-softmax or extended by an attention sink (:py:mod:`~zennit_attn.operations.softmax`);
- element-wise non-linearities: the composite's activation rule (the identity rule, Eq. 9); normalisers ``g(x)``
  constants where they normalise (Prop. 3.4), ``layer_norm``/``rms_norm``/``normalize`` the identity rule on
  ``x / g(x)`` (:py:mod:`~zennit_attn.operations.elementwise`);
- operations under ``torch.no_grad()`` inside the forward whose results meet relevance again, exponentials outside
  attention logits, custom autograd functions (kernels), and every operation the registry does not declare: refused,
  :py:class:`~zennit_attn.core.errors.UnsupportedModelError` naming the operation, the module and what to do;
- backward hooks of modules (also torch's global ones), which would run on the rules' modified gradient and may change
  it, and torch's global forward hooks, which run before the rules' hooks: refused at the registration and at every
  forward (:py:func:`refuse_foreign_hooks`).

Activation, LayerNorm and RMSNorm *modules* get their rules from the composite (the mode leaves their inside alone);
other modules named like a normalisation are classified inside like any code (a channels-first LayerNorm's variance
is a normaliser, MobileBERT's ``NoNorm`` is an element-wise affine map). Attention implementations that the mode
cannot see into (flash attention, flex attention, kernels) run as SDPA for the time of the context (as eager where a
model has no SDPA path), experts of mixtures of experts that run as kernels as their plain loop (transformers' grouped
and batched products stay: the mode sees them); the results agree to floating-point rounding. Everything is set on
the model instance and put back on :py:meth:`OperationCanonizer.remove`.
"""

from __future__ import annotations

import contextvars
import re
import sys
from collections.abc import Callable, Mapping, Sequence

import torch
from zennit.canonizers import Canonizer

from ..core.audit import Audit
from ..core.errors import UnsupportedModelError
from ..core.kinds import is_activation, model_configs, norm_kind
from ..core.modules import Modules
from ..core.quantization import four_bit_layers, quantization_of, unpack_for_gradients
from ..operations.calls import tensors_of
from ..operations.classifier import Classifier
from ..operations.marks import ACTIVATED, Mark, Marks
from ..operations.recurrences import GATES, RECURRENCES, MixerRun
from ..operations.registry import check_overrides
from ..operations.tracking import KERNEL_HINTS, RuleTable, State, TensorMarks, produced_tensors
from ..rules.base import module_inputs
from ..rules.products import ProductRule, Uniform

__all__ = [
    'OperationCanonizer',
    'VISIBLE_ATTENTION',
    'VISIBLE_EXPERTS',
    'kernel_attention',
    'INSTANCE_SETTINGS',
    'LINEAR_MIXERS',
    'RECURRENT',
    'UNDECLARED',
    'KERNEL_HINTS',
    'CACHE_ARGUMENTS',
    'active_classifier',
    'cached_tokens',
    'GLOBAL_HOOKS',
    'foreign_hooks',
    'refuse_foreign_hooks',
]

#: Attention implementations whose arithmetic the mode sees (the kernels among the others run as ``sdpa`` during the
#: context: :py:func:`kernel_attention`).
VISIBLE_ATTENTION = ('eager', 'sdpa')


def kernel_attention(implementation: str) -> bool:
    """Whether a model's attention implementation (``config._attn_implementation``) is a kernel the mode cannot see
    into, which the explanation runs as SDPA or eager attention: not one of :py:data:`VISIBLE_ATTENTION`, and one of
    transformers' own (flash attention, flex attention, paged attention: functions of transformers that compute
    softmax attention) or a kernel of the kernels hub (``'org/name'``). An attention function registered by the user
    (``transformers.AttentionInterface.register('mine', function)``) is none: replaced by SDPA, the model would be
    explained as another function than the one it computes (a sigmoid attention of one's own got SDPA's logit, 0.166
    where the model gave 0.201); the mode sees its operations and explains or refuses them."""
    if implementation in VISIBLE_ATTENTION:
        return False
    if '/' in implementation:
        return True
    utils = sys.modules.get('transformers.modeling_utils')  # loaded wherever a model has an attention implementation
    functions = getattr(utils, 'ALL_ATTENTION_FUNCTIONS', None)
    function = functions.get(implementation.removeprefix('paged|')) if functions is not None else None
    if function is None and functions is not None:
        function = functions.get(implementation)
    return function is None or getattr(function, '__module__', '').startswith('transformers.')


#: Experts implementations of mixtures of experts whose arithmetic the mode sees: the plain loop, and transformers'
#: batched and grouped matrix products (``bmm``, ``torch._grouped_mm`` or transformers' ``grouped_mm_fallback``: per
#: expert, a product of the tokens with the frozen expert weights); the others (kernels) run as the loop.
VISIBLE_EXPERTS = ('eager', 'batched_mm', 'grouped_mm')

#: The keyword arguments through which a model's forward takes what it computed for earlier tokens (keys and values,
#: recurrent states, Transformer-XL's memories): given, and not empty, they are constants of the explanation, which
#: would absorb the relevance of those tokens (:py:func:`cached_tokens`).
CACHE_ARGUMENTS = ('past_key_values', 'past_key_value', 'cache', 'cache_params', 'layer_past', 'mems')

#: The engine's exceptions: per model class, an attribute of its instances set for the context, from a function of the
#: instance. HRM-Text runs all but the last ``L_bp_cycles`` of its inner cycles under ``no_grad`` (to save training
#: memory), which would cut relevance off: every cycle is computed with gradients instead.
INSTANCE_SETTINGS: dict[str, tuple[str, Callable]] = {
    'transformers.models.hrm_text.modeling_hrm_text.HrmTextModel': (
        'L_bp_cycles_padded',
        lambda module: [module.config.L_cycles] * module.config.H_cycles,
    ),
}

#: Class names of sequence mixers whose products of relevance-carrying tensors are not softmax attention: state-space
#: models, linear attention, recurrences (their products are refused until their rules are defined); not timm's
#: ``MlpMixer``, the MLP-Mixer, ResMLP and gMLP models, whose token mixing is a linear map (gMLP's spatial gating is a
#: product of values: the product rule).
LINEAR_MIXERS = re.compile(
    r'Mamba|SSM|Ssm|Delta|ForgetGate|LinearAttention|Linear_?Attn|Rwkv|RWKV|Retention|Hyena|'
    r'Xlstm|xLSTM|LSTM|GRU|Lightning|Recurrent|(?<!Mlp)Mixer'
)
#: Class names of sequence mixers that are not softmax attention (named in refusals): also gated short convolutions
#: (LFM's, whose products of projections are explained by the uniform rule, Prop. 3.2).
RECURRENT = re.compile(LINEAR_MIXERS.pattern + r'|ShortConv|Lfm2Short')

#: What a refusal says of an operation that the registry does not declare (neither with a rule nor refused with a
#: reason of its own): the zoo walk checks that no architecture meets one (tests/test_zoo.py).
UNDECLARED = 'an operation without an AttnLRP rule'

#: The classifying mode of the forward being run (in this thread and task), for the recomputation of checkpointed
#: blocks in the backward pass (:py:mod:`zennit_attn.canonizers.checkpointing`), which must be classified as the
#: forward.
_ACTIVE: contextvars.ContextVar[Classifier | None] = contextvars.ContextVar('zennit_attn_classifier', default=None)


def active_classifier() -> Classifier | None:
    """The classifying mode of the forward pass being run, or None outside one."""
    return _ACTIVE.get()


def cached_tokens(kwargs: Mapping) -> tuple[str, str] | None:
    """``(argument, what it holds)`` of the first argument of :py:data:`CACHE_ARGUMENTS` in a forward's ``kwargs``
    that holds something (a transformers ``Cache`` with earlier tokens, or tensors: a legacy tuple cache, memories),
    None where none does (an empty cache that the forward fills is no constant)."""
    for name in CACHE_ARGUMENTS:
        cache = kwargs.get(name)
        if cache is None:
            continue
        length = getattr(cache, 'get_seq_length', None)
        if callable(length):
            tokens = int(length())
            if tokens:
                return name, f'{tokens} earlier tokens'
        elif any(tensor.numel() for tensor in tensors_of([cache], [])):
            return name, 'tensors computed before'
    return None


class OperationCanonizer(Canonizer):
    """Explain a model at the operations it performs, with a composite's rules (see the module's description).

    Applying it to a model (the composites do) freezes the model's parameters, sets attention implementations the mode
    cannot see into to SDPA (eager without SDPA), experts implementations it cannot see into
    (:py:data:`VISIBLE_EXPERTS`) to their plain loop, the attributes of :py:data:`INSTANCE_SETTINGS`, registers forward
    hooks on the model (to enter the classifying mode for the time of its forward), on its activation and
    normalisation modules (whose inside is left to their module rules), on modules named like sequence mixers and on
    the roots of ``scopes``; :py:meth:`remove` puts everything back.

    Parameters
    ----------
    product_rule: ProductRule
        How products share their relevance (:py:mod:`zennit_attn.rules.products`): ``Uniform()`` for AttnLRP,
        ``ConstantGates()`` for CP-LRP.
    activation_rule: optional
        The rule of element-wise non-linearities computed as functions: an object with a method
        ``elementwise(input, output, gate)`` returning ``output`` with the rule's gradient (the composite's rule of
        activation modules, :py:class:`~zennit_attn.rules.Identity`: the identity rule, Eq. 9); None: their
        plain gradient.
    scopes: sequence of (torch.nn.Module, ProductRule), optional
        Other product rules inside some modules (a vision tower): the rule of the innermost scope applies.
    constants: list, optional
        Where to collect the constants the model adds to relevance (shared with the copies :py:meth:`apply`
        registers).
    overrides: mapping of str to rule, optional
        The rules of single operations instead of the engine's, by operation name
        (:py:func:`~zennit_attn.operations.registry.check_overrides`).
    """

    def __init__(
        self,
        product_rule: ProductRule | None = None,
        activation_rule=None,
        scopes: Sequence[tuple[torch.nn.Module, ProductRule]] = (),
        constants: list | None = None,
        overrides: Mapping | None = None,
    ):
        super().__init__()
        self.rules = [Uniform() if product_rule is None else product_rule]
        self.activation_rule = activation_rule
        self.scopes = list(scopes)
        self.overrides = check_overrides(overrides)
        #: ``(module path, value)`` of every non-zero number the model adds to relevance (a bias written into its
        #: code: it absorbs relevance)
        self.constants = [] if constants is None else constants
        #: where a dry run records the rule of each operation (:py:class:`~.tracking.RuleTable`), None otherwise
        self.table: RuleTable | None = None
        #: the parameters of the layers whose rule changes their gradient, and how many calls of each layer are being
        #: run (:py:meth:`guard_layers`)
        self.layers: dict[int, list[tuple[str, torch.nn.Module, str]]] = {}
        self.running: dict[int, int] = {}
        #: the parameters of the modules that are not layers, for the linear maps computed with them
        self.inline: dict[int, tuple[str, torch.nn.Module, object, str]] = {}
        self.state = self.start()
        self.root: torch.nn.Module | None = None
        #: the root's modules, walked at :py:meth:`register` (their backward hooks are checked at every forward)
        self.modules: Modules = []
        #: the names of the root's modules by id, found at the first :py:meth:`module_path`
        self.names: dict[int, str] | None = None
        self.depth = 0
        self.handles: list = []
        #: ``(module, name, parameter)`` of each place of a parameter frozen for the context
        self.frozen: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
        self.settings: list[tuple[object, str, object]] = []
        self.modes: list[tuple[Classifier, contextvars.Token]] = []
        #: whether a forward of the model enters the classifying mode (False inside zennit's ``Composite.inactive()``,
        #: :py:meth:`~zennit_attn.composites.AttnLRPComposite.inactive`: the plain gradient)
        self.active = True

    @property
    def product_rule(self) -> ProductRule:
        """The product rule of the innermost scope being run (the canonizer's own outside every scope)."""
        return self.rules[-1]

    def start(self, audit: Audit | None = None) -> State:
        """The state of a new forward (:py:class:`~zennit_attn.operations.tracking.State`): the rules, nothing
        marked or tracked yet, its ``audit`` (none outside a forward)."""
        return State(
            rules=self.rules,
            activation_rule=self.activation_rule,
            overrides=self.overrides,
            constants=self.constants,
            refuse=self.refuse,
            module_path=self.module_path,
            gradients=torch.is_grad_enabled(),
            table=self.table,
            audit=Audit(open=False) if audit is None else audit,
            layers=self.layers,
            running=self.running,
            inline=self.inline,
        )

    def copy(self) -> OperationCanonizer:
        return type(self)(self.rules[0], self.activation_rule, self.scopes, self.constants, self.overrides)

    def apply(self, root_module: torch.nn.Module, modules: Modules | None = None) -> list[Canonizer]:
        """Register a copy of this canonizer to ``root_module`` (``modules``: its walk, where the caller has it)."""
        instance = self.copy()
        try:
            instance.register(root_module, modules)
        except BaseException:
            instance.remove()
            raise
        return [instance]

    def register(self, model: torch.nn.Module, modules: Modules | None = None) -> None:
        """Apply the canonizer to ``model`` (see the class's description) in one walk over its modules (``modules``:
        ``list(model.named_modules())`` where the caller has walked them)."""
        self.root = model
        modules = list(model.named_modules()) if modules is None else modules
        self.modules = modules
        refuse_foreign_hooks(model, modules)
        self._configure(model, modules)
        # first (after the relevance boundary, which the composites register later, also first): the pre-hooks that
        # change the model's inputs run in the mode
        self.handles.append(model.register_forward_pre_hook(self._enter, with_kwargs=True, prepend=True))
        self.handles.append(model.register_forward_hook(self._leave, always_call=True))
        frozen = set()
        for _, module in modules:  # each parameter frozen once; every place of it kept (a shared one has several)
            for key, parameter in module._parameters.items():
                if parameter is not None and (parameter.requires_grad or id(parameter) in frozen):
                    parameter.requires_grad_(False)
                    frozen.add(id(parameter))
                    self.frozen.append((module, key, parameter))
        self._hook_modules(model, modules)
        for module, rule in self.scopes:
            self._scope(module, rule)

    def _configure(self, model: torch.nn.Module, modules: Modules) -> None:
        """Attention and experts implementations the mode cannot see into run as ones it sees: the kernels of
        transformers and of the kernels hub as SDPA (or eager) attention (:py:func:`kernel_attention`); an attention
        function of one's own stays what the model runs."""
        for config in model_configs(model, [module for _, module in modules]):
            implementation = getattr(config, '_attn_implementation_internal', None)
            if implementation is not None and kernel_attention(implementation):
                sdpa = getattr(model, '_supports_sdpa', True) is not False
                self._set(config, '_attn_implementation_internal', 'sdpa' if sdpa else 'eager')
            if getattr(config, '_experts_implementation_internal', None) not in (None, *VISIBLE_EXPERTS):
                self._set(config, '_experts_implementation_internal', 'eager')

    def _hook_modules(self, model: torch.nn.Module, modules: Modules) -> None:
        """The instance settings, and the hooks of the opaque modules and of the modules named like sequence mixers
        (each class looked at once). bitsandbytes' 4-bit layers are unpacked where bitsandbytes packed them for its CPU
        inference kernel, which passes no gradient, and the packing is held off for the context."""
        layers = four_bit_layers(module for _, module in modules)
        unpack_for_gradients(layers)
        for layer in layers:
            self._set(layer, 'support_avx512bf16_for_cpu', False)
        classes: dict[type, tuple[bool, bool, tuple | None, bool]] = {}
        for _, module in modules:
            cls = type(module)
            if cls not in classes:
                setting = INSTANCE_SETTINGS.get(f'{cls.__module__}.{cls.__qualname__}')
                mixer = LINEAR_MIXERS.search(cls.__name__) is not None
                classes[cls] = (is_opaque(module), mixer, setting, cls.__name__ in GATES)
            opaque, mixer, setting, gate = classes[cls]
            if setting is not None:
                self._set(module, setting[0], setting[1](module))
            opaque = opaque and module is not model  # the model's own rule is the relevance boundary
            if opaque or mixer or gate:
                self._hook(module, opaque or gate, mixer, gate)

    def guard_layers(
        self,
        layers: Mapping[str, tuple[torch.nn.Module, str]],
        inline: Mapping[str, tuple[torch.nn.Parameter, torch.nn.Module, object, str]] | None = None,
    ) -> None:
        """The rules of linear maps that a model computes without calling a layer module
        (:py:func:`~zennit_attn.operations.classifier.layer_rule`).

        ``layers``: ``module path -> (module, its rule in words)``, the layers whose rule of the composite changes their
        gradient. A rule of a module applies where the module is called; a model that computes with the layer's
        parameters otherwise (EVA's ``qkv = F.linear(x, self.qkv.weight, qkv_bias)``, logits as ``h @
        self.lm_head.weight.T``) would leave it unapplied, the plain gradient in its place: the classifying mode
        refuses such an operation. Hooks count the calls of each layer being run.

        ``inline``: ``parameter path -> (parameter, module, rule, rule in words)``, parameters of modules that are not
        layers (fused experts, a router's weight): a linear map the model computes with one gets ``rule`` (the
        composite's :py:meth:`~zennit_attn.composites.AttnLRPComposite.inline_rule`): an epsilon rule is applied to
        that map's output, any other rule refused. The map is found by its operand, the parameter or a view of it
        (``gate_up_proj[i]``), so transformers' batched experts, which gather copies of their weights, run as their
        loop for the time of the context."""
        for path, (parameter, module, rule, label) in (inline or {}).items():
            self.inline[id(parameter)] = (path, module, rule, label)
        if inline:  # transformers' batched experts gather copies of their weights: the loop computes with views
            for config in model_configs(self.root):
                if getattr(config, '_experts_implementation_internal', None) == 'batched_mm':
                    self._set(config, '_experts_implementation_internal', 'eager')
        running = self.running

        def enter(module, args):
            running[id(module)] = running.get(id(module), 0) + 1

        def leave(module, args, output):
            running[id(module)] -= 1

        for path, (module, rule) in layers.items():
            for parameter in module._parameters.values():
                if parameter is not None:  # a parameter shared by layers (tied weights): one list of its layers
                    self.layers.setdefault(id(parameter), []).append((path, module, rule))
            self.handles.append(module.register_forward_pre_hook(enter))
            self.handles.append(module.register_forward_hook(leave, always_call=True))

    def _scope(self, module: torch.nn.Module, rule: ProductRule) -> None:
        """Hooks that make ``rule`` the product rule while ``module`` runs."""

        def enter(module, args):
            self.rules.append(rule)

        def leave(module, args, output):
            if len(self.rules) > 1:
                self.rules.pop()

        self.handles.append(module.register_forward_pre_hook(enter))
        self.handles.append(module.register_forward_hook(leave, always_call=True))

    def _hook(self, module: torch.nn.Module, opaque: bool, mixer: bool, gate: bool = False) -> None:
        """Hooks that count the opaque modules being run, name the sequence mixers being run and mark the outputs of
        the gate modules of recurrences (:py:data:`~zennit_attn.operations.recurrences.GATES`).

        The output of an opaque module is audited as one operation (:py:meth:`_audit_module`): its hook runs after the
        module's rule (the composites register their rules of modules first) and before any other forward hook, whose
        change of the output the mode then sees (a user's hook on a norm: a change the rule does not recompute away)."""
        name = type(module).__name__
        activation = opaque and is_activation(module)

        def enter(module, args):
            state = self.state
            state.opaque += opaque
            if mixer:
                state.runs.append(MixerRun(name))

        def leave(module, args, kwargs, output):
            args = module_inputs(module, args, kwargs)
            state = self.state
            state.opaque -= opaque
            with torch._C.DisableTorchFunction():  # a hook, inside the mode: its reads of tensors are not the model's
                # the outermost opaque module, with gradients, whose forward returned
                if opaque and not state.opaque and self.modes and output is not None and torch.is_grad_enabled():
                    self._audit_module(name, args, output)
                if gate:
                    state.mark_term(output, (self.module_path(), 'forward', f'the output of {name}'))
                elif opaque:
                    self._mark_opaque(activation, args, output)
            if mixer and state.runs:
                run = state.runs.pop()
                if state.runs:  # a mixer inside a mixer (a gated norm in a Mamba-2 mixer): the outer one answers for it
                    state.runs[-1].absorb(run)
                else:
                    self.state.recorded(self._check_run, run, output)

        self.handles.append(module.register_forward_pre_hook(enter))
        self.handles.append(module.register_forward_hook(leave, always_call=True, prepend=opaque, with_kwargs=True))

    def _audit_module(self, name: str, args, output) -> None:
        """Audit the call of an opaque module (whose inside its rule replaces, unclassified) as one operation: refuse
        an input the engine did not produce or sanction (changed by a forward pre-hook registered after the
        composite, which runs in the module), record the output (the rule's) as produced."""
        self.state.recorded(self._check_audit, name, produced_tensors(args), 'an input')
        self.state.audit.record(output)

    def _mark_opaque(self, activation: bool, args, output) -> None:
        """Mark the output of a module whose inside the mode leaves to the module's rule (an ``activation``, or a
        normalisation), as it would mark the operations inside: an activation's output is a gate, a normalisation's (a
        rescaling of its input by a constant of the relevance pass, Prop. 3.4) the gate its input is. The output of a
        rule that replaces it is read through instead (:py:mod:`~zennit_attn.operations.marks`): an activation
        with the composite's activation rule needs nothing here."""
        if activation:
            if self.activation_rule is None:
                self.state.marks.set(produced_tensors(output), ACTIVATED)
            return
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        mark = self.state.marks.nodes.get(first.grad_fn) if first is not None else None
        if mark is not None and mark.gate is not None:
            self.state.marks.set(produced_tensors(output), Mark(gate=mark.gate, scores=mark.scores))

    def _check_run(self, run: MixerRun, output) -> None:
        """Refuse a sequence mixer that multiplied relevance-carrying tensors in its own code but ran none of the
        declared recurrences (:py:mod:`~zennit_attn.operations.recurrences`): its products are not gates of a
        recurrence with a rule (not checked when its forward failed). A module named like a mixer whose products
        take a softmax output (``softmax(q k^T) @ v``) computes softmax attention: its products have AttnLRP's rules
        (Props. 3.2, 3.3), as under any other name."""
        if run.product is None or run.recurrences or run.softmax or output is None:
            return
        operation, path = run.product
        self.refuse(
            operation,
            f'a product of relevance-carrying tensors inside {run.name}, a sequence mixer that is not softmax '
            f'attention and ran none of the recurrences zennit-attn has rules for ({", ".join(sorted(RECURRENCES))})',
            path=path,
        )

    def _set(self, target, attribute: str, value) -> None:
        self.settings.append((target, attribute, getattr(target, attribute)))
        setattr(target, attribute, value)

    def _enter(self, module, args, kwargs) -> None:
        """Enter the classifying mode at the start of the model's forward (not again in a nested call of it); the
        tensors it is called with are the explained inputs of its audit."""
        self.depth += 1
        if self.depth > 1 or not self.active:
            return
        refuse_foreign_hooks(module, self.modules)  # registered inside the context
        cached = cached_tokens(kwargs)
        if cached is not None:
            name, held = cached
            raise UnsupportedModelError(
                f'zennit-attn cannot explain {type(module).__name__} called with {name} holding {held}: what it '
                'holds was computed outside the explanation, so the relevance of the earlier tokens would stay in it '
                '(constants), and the input relevance would not add up to the explained value. Explain the whole '
                'sequence in one forward pass, without a cache (use_cache=False or no past key values)'
            )
        self.state = self.start(Audit(self.root))
        self.state.audit.enter((args, kwargs))
        mode = Classifier(self.state)
        mode.__enter__()
        self.modes.append((mode, _ACTIVE.set(mode)))

    def _leave(self, module, args, output) -> None:
        """Leave the mode at the end of the model's forward; refuse an output computed by a kernel or outside the
        engine (its audit), a term of a recurrence, or an exponential that never reached a softmax."""
        self.depth = max(self.depth - 1, 0)
        if self.depth or not self.modes:  # a nested call, or a forward that ran inactive
            return
        values = list(output.values()) if isinstance(output, Mapping) else output
        outputs = [tensor for tensor in tensors_of(values, []) if tensor.requires_grad]
        state = self.state
        recomputed = bool(state.audit.checkpoints)  # blocks that the engine classifies again in the backward pass
        try:
            with torch._C.DisableTorchFunction():  # a hook, inside the mode: its reads of tensors are not the model's
                state.recorded(self._check_audit, 'forward', outputs, 'an output', [])
        finally:
            self._exit_modes()
        state.recorded(self._check_outputs, outputs)
        if not recomputed:
            # the marks hold the autograd nodes they were set on: let go of them (and of what those nodes saved, on
            # the branches the rules cut off, e.g. CP-LRP's constant gates) before the backward pass; the signs too
            state.marks, state.signs = Marks(), TensorMarks()

    def _check_audit(self, op: str, tensors: list[torch.Tensor], role: str, path: list | None = None) -> None:
        """Refuse ``op`` where one of the relevance-carrying ``tensors`` (its ``role``: an input of an opaque module, an
        output of the model) was computed by a kernel or by operations the engine did not see (its audit)."""
        state = self.state
        for tensor in tensors:
            state.check_origin(tensor)
        refusal = state.audit.refusal(tensors, role)
        if refusal is not None:
            self.refuse(op, *refusal, path=path)

    def _check_outputs(self, outputs: list[torch.Tensor]) -> None:
        """Refuse an output of the model that is a term of a recurrence or an exponential that never reached a
        softmax."""
        state = self.state
        for tensor in outputs:
            mark = state.marks.of(tensor)
            if mark is not None and mark.term is not None:
                path, operation, what = mark.term
                self.refuse(
                    operation,
                    f'{what}, a term of a recurrence (a decay or gate), among the outputs of the model',
                    path=path,
                )
        state.check_biases(outputs)

    def _exit_modes(self) -> None:
        while self.modes:
            mode, token = self.modes.pop()
            mode.__exit__(None, None, None)
            mode.state.audit.close()
            _ACTIVE.reset(token)

    def mixer(self, path: list | None = None) -> str | None:
        """The class name of the innermost sequence mixer that is not softmax attention: being run (named like one of
        :py:data:`LINEAR_MIXERS`), or on the module ``path`` (named like one of :py:data:`RECURRENT`), else None."""
        if path is None:
            return self.state.runs[-1].name if self.state.runs else None
        return next(
            (type(module).__name__ for _, module in reversed(path) if RECURRENT.search(type(module).__name__)), None
        )

    def module_path(self) -> list[tuple[str, torch.nn.Module]]:
        """The modules of the model whose forward is being run, outermost first, with their names: read from the
        Python stack (the methods' ``self``), for the messages of refusals and the places of constants."""
        if self.root is None:
            return []
        if self.names is None:
            self.names = {id(module): name for name, module in self.root.named_modules()}
        names, path, frame = self.names, [], sys._getframe(1)
        while frame is not None:
            module = frame.f_locals.get('self')
            if isinstance(module, torch.nn.Module) and id(module) in names and (not path or path[-1][1] is not module):
                path.append((names[id(module)], module))
            frame = frame.f_back
        return path[::-1]

    def refuse(self, op: str, what: str | None = None, hint: str | None = None, path: list | None = None):
        """Raise :py:class:`~zennit_attn.core.errors.UnsupportedModelError` for the operation ``op``: ``what`` it is,
        where (the module ``path``, default the one being run) and what to do (``hint``)."""
        path = self.module_path() if path is None else path
        name, module = path[-1] if path else ('', self.root)
        cls = type(module).__name__ if module is not None else '?'
        where = f"'{name}' ({cls})" if name else f'the model ({cls})'
        outer = self.mixer(path)
        description = what or UNDECLARED
        if hint is None and outer is not None:
            hint = (
                f'{outer} is not softmax attention: zennit-attn explains softmax attention (AttnLRP, Achtibat et al. '
                '2024) and the recurrences declared in zennit_attn.operations.recurrences (Mamba, Mamba-2, '
                'gated delta rules: their discretisation, decay and selection terms held constant, as MambaLRP '
                'does); this sequence mixer computes its recurrence otherwise, so zennit-attn does not explain this '
                'model (docs: Rules, Recurrences).'
            )
        elif hint is None:
            hint = (
                'Route it through a module that the composite has a rule for, declare the operation in the registry '
                '(zennit_attn.operations.registry; docs: Add an operation), or report the model.'
            )
        raise UnsupportedModelError(
            f'zennit-attn cannot explain {op} in {where}: {description}, computed on tensors that carry relevance. '
            f'{hint}'
        )

    def remove(self) -> None:
        self._exit_modes()
        for handle in self.handles:
            handle.remove()
        self.layers.clear()
        self.running.clear()
        self.inline.clear()
        for module, key, parameter in self.frozen:
            parameter.requires_grad_(True)
            current = module._parameters[key] if key in module._parameters else None  # TorchScript's has no get()
            if current is not None and current is not parameter and not current.requires_grad and current.is_leaf:
                # replaced during the context by a copy that took the frozen flag (accelerate's offloading hooks
                # load each weight as a new parameter for the forward and put a new meta parameter back after it)
                current.requires_grad_(True)
        for target, attribute, value in reversed(self.settings):
            setattr(target, attribute, value)
        self.handles, self.frozen, self.settings = [], [], []
        self.depth, self.root, self.names, self.modules = 0, None, None, []
        self.state = self.start()
        del self.rules[1:]


#: torch's global module hooks (attributes of ``torch.nn.modules.module``) that the engine refuses, with the function
#: that registers each: backward hooks (they run on the rules' modified gradient) and forward hooks and pre-hooks (they
#: run before every module's own hooks: before the rules' hooks, and on the model before the mode is entered).
GLOBAL_HOOKS = {
    '_global_backward_hooks': ('backward hook', 'register_module_full_backward_hook or register_module_backward_hook'),
    '_global_backward_pre_hooks': ('backward pre-hook', 'register_module_full_backward_pre_hook'),
    '_global_forward_hooks': ('forward hook', 'register_module_forward_hook'),
    '_global_forward_pre_hooks': ('forward pre-hook', 'register_module_forward_pre_hook'),
}


def foreign_hooks(modules: Modules) -> list[tuple[str, str, str]]:
    """``(module path, kind, how it was registered)`` of the hooks the engine refuses on ``modules``
    (``list(model.named_modules())``): backward hooks (``register_backward_hook``, ``register_full_backward_hook``)
    and backward pre-hooks (``register_full_backward_pre_hook``) of modules, and torch's global module hooks
    (:py:data:`GLOBAL_HOOKS`, path ``'*'``)."""
    found = [
        (name, kind, how)
        for name, module in modules
        for kind, how, hooks in (
            ('backward hook', 'register_full_backward_hook or register_backward_hook', module._backward_hooks),
            ('backward pre-hook', 'register_full_backward_pre_hook', module._backward_pre_hooks),
        )
        if hooks
    ]
    module_globals = torch.nn.modules.module
    for attribute, (kind, how) in GLOBAL_HOOKS.items():
        if getattr(module_globals, attribute, None):
            found.append(('*', kind, how))
    return found


def refuse_foreign_hooks(model: torch.nn.Module, modules: Modules) -> None:
    """Raise :py:class:`~zennit_attn.core.errors.UnsupportedModelError` for the hooks of :py:func:`foreign_hooks`.

    Backward hooks run in the relevance pass on the rules' modified gradient and may change it (a hook of
    ``register_backward_hook`` that returns a new gradient changes the relevance without a trace in the forward:
    CP-LRP's relevance of a tiny transformer summed to 2.0, 1.056 or 0.992 of the logit with one that doubles the
    gradient at a block, an MLP or an attention module). torch's global forward hooks run before each module's own
    hooks, so before the rules of normalisations and activations, which then replace or miss their change (a global
    hook that scaled the outputs of the LayerNorms of a tiny GPT-2 by 1.5 got CP-LRP's relevance of a logit 0.17 off
    the model's; of the RMSNorms of a tiny Llama, relevance that summed to 0.67 of the logit), and global forward
    pre-hooks run on the model before the mode is entered; a module's own forward hooks and pre-hooks are ordered
    after the rules and seen by the mode."""
    hooks = foreign_hooks(modules)
    if not hooks:
        return
    where = ', '.join(
        f'a global {kind} on every module (torch.nn.modules.module.{how})'
        if name == '*'
        else f'a {kind} on {name or "the model"!r} ({type(model.get_submodule(name)).__name__}, {how})'
        for name, kind, how in hooks[:3]
    )
    more = f' and {len(hooks) - 3} more' if len(hooks) > 3 else ''
    raise UnsupportedModelError(
        f'zennit-attn cannot explain {type(model).__name__} with {where}{more}: backward hooks run in the relevance '
        "pass on the rules' modified gradient (not the model's gradient), and one that returns a gradient changes "
        "the relevance; torch's global forward hooks run before the rules' hooks of every module, whose rules then "
        'miss or undo their change. Remove them for the explanation (the handle of each: handle.remove()); register '
        'a forward hook on the module itself (module.register_forward_hook), which the engine sees; a hook that '
        'records gradients reads relevance (Explanation.latent, zennit_attn.latent) instead.'
    )


#: Kinds of explained quantized layers (:py:func:`~.quantization.quantization_of`) that compute their linear map in
#: autograd functions of their own: the mode leaves their inside alone (the linear map of the dequantized weights,
#: whose backward is its gradient: the plain gradient, Eq. 8 with epsilon -> 0).
OPAQUE_QUANTIZED = frozenset({'bitsandbytes 8-bit', 'bitsandbytes 4-bit'})


def is_opaque(module: torch.nn.Module) -> bool:
    """Modules whose output the composite's rule replaces as a whole (activations, LayerNorm and RMSNorm), and the
    quantized layers of :py:data:`OPAQUE_QUANTIZED`: the operations inside them are not classified, the module is
    audited as one operation. Other modules named like a normalisation (``norm_kind`` ``'probe'``) are classified
    inside: the composites give them no rule of their own here."""
    return is_activation(module) or norm_kind(module) in ('layer', 'rms') or quantization_of(module) in OPAQUE_QUANTIZED
