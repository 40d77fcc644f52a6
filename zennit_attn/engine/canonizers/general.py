"""The general mechanism: AttnLRP on any transformer, applied at the operations the model performs.

A model that the family table (:py:mod:`~zennit_attn.engine.canonizers.families`) does not list is explained by
:py:class:`GeneralCanonizer`: while the model's forward runs (and autograd records it), a
:py:class:`torch.overrides.TorchFunctionMode` sees every torch function called on a tensor that carries relevance
(one that requires a gradient: the model's parameters are frozen for the time of the context, so these are exactly
the tensors computed from the explained inputs) and classifies it:

- linear, structural and selection operations (add, cat, reshape, index, sum, linear layers on frozen weights,
  max, top-k, ...): the plain gradient (epsilon rule with epsilon -> 0, Eq. 8), nothing to change;
- products of several relevance-carrying tensors (``a * b``, ``q @ k^T``, einsum), of the elements of one (``prod``)
  or scattered into one (``scatter_reduce(..., 'prod')``): the uniform rule (Prop. 3.2; Prop. 3.3 for matrix
  products), each of the N factors gets 1/N; CP-LRP: factors that are gates, the outputs of a non-linearity or a
  softmax (also selected, rescaled, summed, padded, concatenated or scattered: routing weights, mixtures of attention
  weights), are constants where a factor is not a gate; among gates alone, softmax outputs are the constants and
  activation outputs the values (``softmax(q k^T) @ silu(v)``); gates of one kind alone share uniformly
  (:py:meth:`~zennit_attn.engine.canonizers.classifier.Classifier.constant_factors`); products inside sequence mixers that
  are not softmax attention, and products with a softmax-free contraction ``q (k^T v)`` (linear attention), are
  refused;
- softmax: the plain gradient, which is the softmax rule (Prop. 3.1); rows whose logits are all ``-inf`` (a NaN
  output that the model replaces by a constant) pass nothing;
- an attention sink written as ``(softmax(z) @ V) * sigmoid(logsumexp(z) - s)``: the softmax of ``[z, s]`` (Prop. 3.1
  on the extended softmax, Prop. 3.3 for its product with ``[V; 0]``);
- a log-softmax ``z - logsumexp(z)`` or ``log_softmax(z)``, cast, viewed or selected (top-k, gather), then ``exp``:
  ``softmax(z)`` (routing weights computed in log space), its plain gradient (Prop. 3.1), a softmax output where it
  enters a product; any other use of a log-softmax or a ``logsumexp`` is refused;
- ``scaled_dot_product_attention``: query and key 1/4, value 1/2 (Props. 3.1, 3.3), a relevance-carrying float mask
  (an additive term of the logits) 1/2; CP-LRP: query, key and mask constant;
- element-wise non-linearities (tanh, SiLU, GELU, sigmoid, clamp, ``x ** 2``, sign, roundings, remainders, ...): the
  identity rule (Eq. 9; not their zero or unit gradient), from the first input of a chain of them (``sigmoid(relu(x))``
  keeps ``sigmoid(0)``), also where the model computes them in place (``x.tanh_()``, ``F.silu(x, inplace=True)``);
  ``exp`` only where its output enters attention logits additively (a logit bias such as Doge's dynamic mask), else
  refused;
- operations under ``torch.no_grad()`` inside the forward: tensors they compute from relevance-carrying ones must not
  meet relevance again (truncated backpropagation would lose relevance silently): refused
  (:py:mod:`~zennit_attn.engine.canonizers.tracking`, which also records the constants a model adds);
- a division ``a / b`` by a relevance-carrying ``b``: ``b`` is a constant (the normaliser ``g(x)`` of Prop. 3.4);
  a renormalised softmax (top-k routing weights) keeps its plain gradient: it is the softmax of the selected logits;
- ``rsqrt``, ``sqrt``, ``1 / x``, powers below 1, variances and norms: normalisers ``g(x)`` (Prop. 3.4), constants where
  they multiply the tensor they are computed from (``x * rsqrt(mean(x^2))``); anywhere else values, with the
  identity rule (element-wise) or the rules of their decomposition (variances, norms);
- ``layer_norm``, ``rms_norm``, ``normalize``: the identity rule on ``x / g(x)`` (Prop. 3.4);
- anything else: refused, :py:class:`UnsupportedModelError` naming the operation, the module path and what to do.

Activation, LayerNorm and RMSNorm *modules* get their rules from the composite as before (the mode leaves their
inside alone); other modules named like a normalisation are classified inside like any code (a channels-first
LayerNorm's variance is a normaliser, MobileBERT's ``NoNorm`` is an element-wise affine map); outputs of autograd
functions defined outside torch, zennit and zennit-attn (custom kernels) are refused where they are used. Attention
implementations that the mode cannot see into (flash attention, flex attention, kernels) run as SDPA for the time
of the context (as eager where a model has no SDPA path), experts of mixtures of experts that run as kernels as
their plain loop (transformers' grouped and batched products stay: the mode sees them); the results agree to
floating-point rounding. Everything is set on the model instance and put back on :py:meth:`remove`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping

import torch
from zennit.canonizers import Canonizer

from ..kinds import UnsupportedModelError, is_activation, model_configs, norm_kind
from ..rules import elementwise_identity
from .classifier import RECURRENT, Classifier
from .tracking import Tracking, tensors_of

#: Attention implementations whose arithmetic the mode sees (the others run as ``sdpa`` during the context).
VISIBLE_ATTENTION = ('eager', 'sdpa')
#: Experts implementations of mixtures of experts whose arithmetic the mode sees: the plain loop, and transformers'
#: batched and grouped matrix products (``bmm``, ``torch._grouped_mm`` or transformers' ``grouped_mm_fallback``: per
#: expert, a product of the tokens with the frozen expert weights); the others (kernels) run as the loop.
VISIBLE_EXPERTS = ('eager', 'batched_mm', 'grouped_mm')

#: The general mechanism's exceptions: per model class, an attribute of its instances set for the context, from a
#: function of the instance. HRM-Text runs all but the last ``L_bp_cycles`` of its inner cycles under ``no_grad``
#: (to save training memory), which would cut relevance off: every cycle is computed with gradients instead.
INSTANCE_SETTINGS: dict[str, tuple[str, Callable]] = {
    'transformers.models.hrm_text.modeling_hrm_text.HrmTextModel': (
        'L_bp_cycles_padded',
        lambda module: [module.config.L_cycles] * module.config.H_cycles,
    ),
}

#: Packages whose autograd functions are trusted (their outputs are the ones the rules produce or plain torch).
_TRUSTED_FUNCTIONS = ('torch.', 'zennit.', 'zennit_attn.', 'bitsandbytes.')

#: torch modules that compute a linear map of what carries relevance (a selection for ``Embedding``): the mode
#: classifies their operations like any other, and called on their own their plain gradient is their rule.
_LINEAR_LEAVES = (
    torch.nn.Linear,
    torch.nn.Embedding,
    torch.nn.Dropout,
    torch.nn.Identity,
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
)


def _plain_torch_leaf(module: torch.nn.Module) -> bool:
    """Whether ``module`` is exactly one of :py:data:`_LINEAR_LEAVES`: :py:class:`GeneralCanonizer` gives it no hooks
    (a refusal of what enters it names the module that calls it)."""
    return type(module) in _LINEAR_LEAVES


class GeneralCanonizer(Tracking, Canonizer):
    """Explain any transformer at the operations it performs (see the module's table).

    Applying it to a model (the composites do, for a model the family table does not list) freezes the model's
    parameters, sets attention implementations the mode cannot see into to SDPA (eager without SDPA), experts
    implementations it cannot see into (:py:data:`VISIBLE_EXPERTS`) to their plain loop, the attributes of
    :py:data:`INSTANCE_SETTINGS`, and enters the classifying mode for the time of each forward of the model;
    :py:meth:`remove` puts everything back.

    Parameters
    ----------
    constant_gates: bool
        CP-LRP (Ali et al. 2022): the outputs of non-linearities and softmaxes are constants where they enter a
        product, and query and key receive nothing in SDPA. False (AttnLRP): the uniform rule.
    """

    def __init__(self, constant_gates: bool = False, constants: list | None = None):
        super().__init__()
        self.constant_gates = constant_gates
        #: ``(module path, value)`` of every non-zero number the model adds to relevance (a bias written into its
        #: code: it absorbs relevance); shared with the copies :py:meth:`apply` registers
        self.constants = [] if constants is None else constants
        self.attention_scales = (
            {'query': 0.0, 'key': 0.0, 'value': 1.0} if constant_gates else {'query': 0.25, 'key': 0.25, 'value': 0.5}
        )
        self.opaque = 0
        # whether the forward computed a ``logsumexp`` or ``log_softmax`` (:py:meth:`~zennit_attn.engine.canonizers.classifier.Classifier.sink_mass`, ...)
        self.lse = False
        self.start_tracking()
        self.path: list[tuple[str, torch.nn.Module]] = []
        self.handles: list = []
        self.frozen: list[torch.nn.Parameter] = []
        self.settings: list[tuple[object, str, object]] = []
        self.modes: list[Classifier] = []
        self.forwards: list[tuple[torch.nn.Module, object]] = []
        self.refusal: UnsupportedModelError | None = None
        #: autograd node classes whose outputs :py:meth:`check_origin` accepted (it runs for every operand)
        self.trusted_nodes: set[type] = set()
        #: ``(module class, pattern)`` by whether the class is named like a sequence mixer (:py:meth:`mixer`)
        self.mixers: dict[tuple, bool] = {}

    def copy(self) -> GeneralCanonizer:
        return type(self)(self.constant_gates, self.constants)

    def apply(self, root_module: torch.nn.Module) -> list[Canonizer]:
        instance = self.copy()
        try:
            instance.register(root_module)
        except BaseException:
            instance.remove()
            raise
        return [instance]

    def register(self, model: torch.nn.Module) -> None:
        for config in model_configs(model):
            implementation = getattr(config, '_attn_implementation_internal', None)
            if implementation is not None and implementation not in VISIBLE_ATTENTION:
                sdpa = getattr(model, '_supports_sdpa', True) is not False
                self._set(config, '_attn_implementation_internal', 'sdpa' if sdpa else 'eager')
            if getattr(config, '_experts_implementation_internal', None) not in (None, *VISIBLE_EXPERTS):
                self._set(config, '_experts_implementation_internal', 'eager')
        self.guard(model)
        for name, module in model.named_modules():
            for parameter in module._parameters.values():
                if parameter is not None and parameter.requires_grad:  # once: a shared one is frozen then
                    parameter.requires_grad_(False)
                    self.frozen.append(parameter)
            setting = INSTANCE_SETTINGS.get(f'{type(module).__module__}.{type(module).__qualname__}')
            if setting is not None:
                self._set(module, setting[0], setting[1](module))
            if name and _plain_torch_leaf(module):
                continue
            opaque = name != '' and self.is_opaque(module)
            self.handles.append(module.register_forward_pre_hook(self._enter(name, module, opaque)))
            self.handles.append(module.register_forward_hook(self._leave(opaque), always_call=True))

    def guard(self, model: torch.nn.Module) -> None:
        """Wrap the forward of the model instance so that a refusal raised inside an operator reaches the caller as
        the :py:class:`UnsupportedModelError` it is (put back by :py:meth:`remove`)."""
        forward, previous = model.forward, model.__dict__.get('forward')

        @functools.wraps(forward)  # keeps the signature, which transformers' generate inspects
        def guarded(*args, **kwargs):
            self.refusal = None
            try:
                return forward(*args, **kwargs)
            except TypeError as error:
                if self.refusal is None or isinstance(error, UnsupportedModelError):
                    raise
                raise self.refusal from error

        model.forward = guarded
        self.forwards.append((model, previous))

    @staticmethod
    def is_opaque(module: torch.nn.Module) -> bool:
        """Modules whose output the composite's rule replaces as a whole (activations, LayerNorm and RMSNorm,
        softmax): the operations inside them are not classified. Other modules named like a normalisation
        (``norm_kind`` ``'probe'``) are classified inside: the composites give them no rule of their own here."""
        return is_activation(module) or norm_kind(module) in ('layer', 'rms') or isinstance(module, torch.nn.Softmax)

    def _set(self, target, attribute: str, value) -> None:
        self.settings.append((target, attribute, getattr(target, attribute)))
        setattr(target, attribute, value)

    def _enter(self, name: str, module: torch.nn.Module, opaque: bool):
        def hook(module, args):
            if not self.path:
                self.lse = False
                self.start_tracking()
                mode = Classifier(self)
                mode.__enter__()
                self.modes.append(mode)
            self.path.append((name, module))
            self.opaque += opaque

        return hook

    def _leave(self, opaque: bool):
        def hook(module, args, output):
            if self.path:
                self.path.pop()
                self.opaque -= opaque
            if not self.path:
                while self.modes:
                    self.modes.pop().__exit__(None, None, None)
                values = list(output.values()) if isinstance(output, Mapping) else output
                outputs = [tensor for tensor in tensors_of(values, []) if tensor.requires_grad]
                for tensor in outputs:
                    self.check_origin(tensor)
                self.check_biases(outputs)

        return hook

    def check_origin(self, tensor: torch.Tensor) -> None:
        """Refuse a tensor computed by an autograd function of another package (a custom kernel)."""
        node = type(tensor.grad_fn)
        if node in self.trusted_nodes:
            return
        forward = getattr(node, '_forward_cls', None)  # a class attribute of the nodes of Python autograd functions
        if forward is not None and not forward.__module__.startswith(_TRUSTED_FUNCTIONS):
            self.refuse(f'{forward.__module__}.{forward.__qualname__}', 'a custom autograd function (kernel)')
        self.trusted_nodes.add(node)

    def activation(self, input: torch.Tensor, output: torch.Tensor, gate: bool = True) -> torch.Tensor:
        return elementwise_identity(input, output, gate=gate)

    def mixer(self, path: list | None = None, pattern: re.Pattern = RECURRENT) -> str | None:
        """The class name of the innermost module on the module ``path`` (default: the one being run) that is named
        like a sequence mixer that is not softmax attention (``pattern``: by default
        :py:data:`~zennit_attn.engine.canonizers.classifier.RECURRENT`), else None."""
        for _, module in reversed(self.path if path is None else path):
            key = (type(module), pattern)
            if key not in self.mixers:
                self.mixers[key] = pattern.search(type(module).__name__) is not None
            if self.mixers[key]:
                return type(module).__name__
        return None

    def refuse(self, op: str, what: str | None = None, hint: str | None = None, path: list | None = None):
        path = self.path if path is None else path
        name, module = path[-1] if path else ('', None)
        cls = type(module).__name__ if module is not None else '?'
        where = f"'{name}' ({cls})" if name else f'the model ({cls})'
        outer = self.mixer(path)
        description = what or 'an operation without an AttnLRP rule'
        if hint is None and outer is not None:
            hint = (
                f'{outer} is not softmax attention: AttnLRP (Achtibat et al. 2024) defines rules for softmax '
                'attention, linear layers, element-wise non-linearities, products and normalisations; the '
                'recurrences of state-space, linear-attention and convolutional sequence mixers are outside '
                'them, so zennit-attn does not explain this model.'
            )
        elif hint is None:
            hint = (
                'Route it through a module that the composite has a rule for, add a Family entry '
                '(zennit_attn.engine.canonizers.families), or report the model.'
            )
        # kept for the guard of :py:meth:`register`: raised inside an operator (``a + b``), torch turns the error (a
        # TypeError) into NotImplemented and Python raises a TypeError without it
        self.refusal = UnsupportedModelError(
            f'zennit-attn cannot explain {op} in {where}: {description}, computed on '
            f'tensors that carry relevance. {hint}'
        )
        raise self.refusal

    def remove(self) -> None:
        while self.modes:
            self.modes.pop().__exit__(None, None, None)
        for handle in self.handles:
            handle.remove()
        for parameter in self.frozen:
            parameter.requires_grad_(True)
        for target, attribute, value in reversed(self.settings):
            setattr(target, attribute, value)
        for model, previous in reversed(self.forwards):
            if previous is None:
                model.__dict__.pop('forward', None)
            else:
                model.forward = previous
        self.forwards = []
        self.handles, self.frozen, self.settings, self.path, self.opaque = [], [], [], [], 0
