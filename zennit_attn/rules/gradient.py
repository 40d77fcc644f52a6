"""The AttnLRP rules of modules in the gradient convention (see :py:mod:`zennit_attn.rules`): epsilon (Eq. 8)
for linear layers, identity (Eq. 9) for activations, identity on ``x / g(x)`` for normalisations (Prop. 3.4). The
rules of the operations inside models (products, softmaxes) are applied by the engine
(:py:mod:`zennit_attn.operations`) with the composite's product rule
(:py:mod:`~zennit_attn.rules.products`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from zennit.core import RemovableHandle, RemovableHandleList

from ..core.errors import UnsupportedModelError
from ..core.kinds import is_listed_activation, norm_kind
from .base import (
    GradientRule,
    called_on_input_alone,
    compute_dtype,
    elementwise_identity,
    gradient_map,
    layer_norm_identity,
    module_inputs,
    module_output,
    stabilize,
    tensor_output,
)

#: The largest stabiliser of an :py:class:`Epsilon` rule for which the plain gradient stands in (the composites' default
#: on attention projections, 1e-6): where a layer's rule cannot apply (a model that computes with the layer's
#: parameters without calling it: :py:class:`torch.nn.MultiheadAttention`, EVA's ``F.linear(x, qkv.weight)``), the
#: plain gradient differs from such a rule's result by the stabiliser's effect only (measured 2.4e-6 of a relevance sum
#: of 0.048 on a tiny ViT in float64).
FUNCTIONAL_EPSILON = 1e-6


def plain_stands_for(rule) -> bool:
    """Whether the plain gradient stands in for the module rule ``rule``: None, or an :py:class:`Epsilon` with a
    stabiliser of at most :py:data:`FUNCTIONAL_EPSILON`."""
    return rule is None or (isinstance(rule, Epsilon) and rule.epsilon <= FUNCTIONAL_EPSILON)


class Epsilon(GradientRule):
    """Epsilon rule (Eq. 8) for linear layers: ``R_i = sum_j W_ji x_i R_j / (z_j + eps sign(z_j))``.

    In the gradient convention this multiplies the output gradient by ``z / (z + eps sign(z))``; the bias
    and epsilon absorb their share of the relevance. With ``epsilon = 0`` (the default of the LLM composites)
    the rule is the plain gradient: no division happens in this formulation, so no stabiliser is needed, and
    nothing is registered. The factor is computed in the forward pass (one tensor of the output's shape, float32 for
    a half-precision output, kept for the backward pass), so that a model that changes the layer's output in place
    (Falcon adds the attention output to the MLP's, LED and RoCBert their embeddings) keeps the rule.

    Parameters
    ----------
    epsilon: float
        The stabiliser; 0 gives the exact Eq. 8 limit.
    """

    def __init__(self, epsilon: float = 1e-6):
        super().__init__()
        if epsilon < 0:
            raise ValueError(f'epsilon must be >= 0, got {epsilon}')
        self.epsilon = epsilon

    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        if self.epsilon == 0:
            return RemovableHandleList([RemovableHandle(self)])
        return super().register(module)

    def forward(self, module, input, output):
        output = tensor_output(module, output)
        if not output.requires_grad:
            return None
        return epsilon_gradient(output, self.epsilon)


def epsilon_gradient(output: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``output`` of a linear map ``z = W x + b`` with the epsilon rule (Eq. 8) on its way back: its gradient times
    ``z / (z + eps sign(z))``, the factor computed now (float32 for a half-precision output) and kept for the backward
    pass. The rule of :py:class:`Epsilon`, and of a linear map a model computes inline with its parameters
    (:py:meth:`~zennit_attn.composites.AttnLRPComposite.inline_rule`)."""
    dtype = compute_dtype(output)
    value = output.detach().to(dtype)
    factor = value / stabilize(value, epsilon)
    return gradient_map(output, lambda grad: (grad.to(dtype) * factor).to(grad.dtype))


def _confirm_elementwise(module: torch.nn.Module, input: torch.Tensor, output: torch.Tensor) -> str:
    """``'elementwise'`` for a module (which computed ``output`` from ``input``) that computes each output element from
    the input element at its place alone: run again with half of the input's elements (a fixed random half) changed,
    its output at the others is unchanged; refused otherwise."""
    input = input.detach()
    kept = (torch.rand(input.shape, generator=torch.Generator().manual_seed(0)) < 0.5).to(input.device)
    with torch.no_grad():
        probed = module.forward(torch.where(kept, input, input * 1.5 + 0.25))
    if not torch.allclose(probed[kept], output.detach()[kept], equal_nan=True):
        raise UnsupportedModelError(
            f'{type(module).__name__} is named like an activation but is not element-wise (its output at an element '
            'changes when other elements of its input change), so the identity rule (Eq. 9) does not apply to it; '
            'name the module otherwise (not like an activation) so that its operations get their rules, or report '
            'the model.'
        )
    return 'elementwise'


class Identity(GradientRule):
    """Identity rule (Eq. 9) for element-wise non-linearities (GELU, SiLU, tanh, ...): ``R_in = R_out``.

    Modules recognised by their class name only (not in :py:data:`~zennit_attn.core.kinds.ACTIVATIONS`, or a subclass
    of one with a forward of its own) are confirmed element-wise at the first call of their class and settings in a
    process (:py:func:`_confirmed`): with half of the input's elements changed, the output at the others stays as it
    was (a function per element, which may differ between elements: a weight per feature).

    The rule needs the module's input after the forward: a module that overwrites it (``torch.nn.SiLU(inplace=True)``)
    runs out of place while the rule is registered (its ``inplace`` flag is set to False and put back by
    :py:meth:`remove`); a module that changes its input in place otherwise is refused
    (:py:class:`~zennit_attn.core.errors.UnsupportedModelError`), never explained from the overwritten values.
    """

    #: ``(module, whether it held its own ``inplace`` attribute)`` while its flag is switched off
    switched: tuple[torch.nn.Module, bool] | None = None
    #: the version counter of the module's input when its forward began
    version: int | None = None
    #: whether the module was called with its input alone, so that ``module.forward(input)`` computes its output again
    #: in the backward pass (:py:func:`~zennit_attn.rules.base.elementwise_identity`)
    recomputable: bool = False

    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        handles = super().register(module)
        handles.append(module.register_forward_pre_hook(self._pre_forward, with_kwargs=True))
        if getattr(module, 'inplace', None) is True:
            self.switched = (module, 'inplace' in module.__dict__)
            module.inplace = False
        return handles

    def _pre_forward(self, module, args, kwargs):
        input = module_inputs(module, args, kwargs)
        first = input[0] if input else None
        with torch._C.DisableTorchFunction():  # the rule's read, not the model's: the classifying mode need not see it
            self.version = first._version if isinstance(first, torch.Tensor) else None
        self.recomputable = called_on_input_alone(args, kwargs)

    def forward(self, module, input, output):
        output = tensor_output(module, output)
        if not output.requires_grad or not input or not isinstance(input[0], torch.Tensor):
            return None
        if self.version is not None and input[0]._version != self.version:
            raise UnsupportedModelError(
                f'{type(module).__name__} changes its input in place, so the identity rule (Eq. 9) cannot read the '
                'input it computed its output from; make it compute out of place (e.g. inplace=False) or report the '
                'model.'
            )
        if input[0].shape != output.shape:
            raise UnsupportedModelError(
                f'The identity rule (Eq. 9) needs an element-wise module, but {type(module).__name__} maps '
                f'{tuple(input[0].shape)} to {tuple(output.shape)}; name the module otherwise (not like an '
                'activation) so that its operations get their rules, or report the model.'
            )
        if not is_listed_activation(module):
            _confirmed(module, 'activation', lambda: _confirm_elementwise(module, input[0], output))
        return self.elementwise(input[0], output, compute=module_output(module) if self.recomputable else None)

    @staticmethod
    def elementwise(
        input: torch.Tensor,
        output: torch.Tensor,
        gate: bool = True,
        compute: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``output``, an element-wise function of ``input``, with the identity rule's gradient (Eq. 9): for the
        activation modules and, as the composite's activation rule, for the element-wise functions the engine sees
        (``gate``: the output of a non-linearity, a gate of CP-LRP, not a bound or rounding). ``compute``: the
        function again (``input -> output``), run in the backward pass instead of keeping ``output``
        (:py:func:`~zennit_attn.rules.base.elementwise_identity`)."""
        return elementwise_identity(input, output, gate=gate, compute=compute)

    def remove(self) -> None:
        """Put back a module's ``inplace`` flag (see the class description), then remove the hooks."""
        if self.switched is not None:
            module, own = self.switched
            if own:
                module.inplace = True
            else:
                del module.inplace
            self.switched = None
        super().remove()

    def copy(self):
        duplicate = super().copy()
        duplicate.switched, duplicate.version, duplicate.recomputable = None, None, False
        return duplicate


class NormIdentity(GradientRule):
    """Identity rule on the normalisation ``x / g(x)`` of LayerNorm and RMSNorm (Prop. 3.4).

    ``g(x)`` is treated as a constant; the affine parts (mean subtraction, weight, bias) are linear and keep
    their epsilon-rule gradient. For RMSNorm the output is ``x_i c w_i`` with a per-row constant ``c``, so the
    rule is the element-wise ratio ``g_in = g_out y / x``, valid for every RMSNorm variant (Gemma's
    ``1 + w``, float32 up-casting, ...); an RMSNorm with a bias (``y = x c w + b``: xLSTM's ``use_bias``) gets
    ``g_in = g_out (y - b) / x``, its bias absorbing its share. For LayerNorm the output is recomputed with the standard
    deviation detached.

    A module named like an RMSNorm that returns the normaliser itself instead of the normalised input (HY-V4's
    ``UnweightedRMSNorm``: ``rsqrt(mean(x^2) + eps)``, one value per row, the product left to its caller) is the
    constant ``g(x)`` of Prop. 3.4: its output is returned detached, so that the product it scales passes relevance by
    the other factor alone, as ``linear(x / g(x))`` does; confirmed on probes (one value per row, divided by ``k``
    where the row is multiplied by ``k``), refused otherwise.

    Other modules named like a normalisation (``norm_kind`` ``'probe'``), and those named like an RMSNorm other than
    :py:class:`torch.nn.RMSNorm` itself (a name says nothing of what a forward computes: a centring "RMSNorm" is a
    LayerNorm), are confirmed at their first call, on probes of the input's shape: the output must not change when
    the input is scaled (a normalisation); if it does not change when a constant is added either, the module
    subtracts the mean (LayerNorm-like: ``y = (x - mean) c w + b``, with ``b`` the output for a zero input), otherwise
    it must be RMSNorm-like (``y - b`` over ``x`` the same profile in every row, ``b`` its bias or 0). A module that
    fails is refused (:py:class:`~zennit_attn.core.errors.UnsupportedModelError`). What a forward is found to be is
    kept per class and settings of the instance (:py:func:`_confirmed`): confirmed once per process, not at every
    explanation.

    The RMSNorm-like output is not saved for the backward pass: called as ``module(x)`` (one input, no keyword
    arguments), the module computes it again there from ``x``, which a plain pass saves as well, so that the rule
    holds no more activations than the plain gradient (one tensor per normalisation less than saving the output).
    """

    def __init__(self):
        super().__init__()
        #: whether the module's current call is ``module(x)``, which its backward can run again
        self.recomputable = False

    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        handles = super().register(module)
        handles.append(module.register_forward_pre_hook(self._pre_forward, with_kwargs=True))
        return handles

    def _pre_forward(self, module, args, kwargs):
        self.recomputable = called_on_input_alone(args, kwargs)

    def forward(self, module, input, output):
        output = tensor_output(module, output)
        if not output.requires_grad or not input[0].requires_grad:
            return None
        kind = norm_kind(module)
        if kind == 'probe' or (kind == 'rms' and output.shape == input[0].shape and not _native_rms(module)):
            x, y, profile = input[0].detach(), output.detach(), kind == 'probe'
            kind = _confirmed(module, f'normalisation {kind}', lambda: _confirm_norm(module, x, y, profile))
            if kind == 'centered':
                with torch.no_grad():
                    bias = module.forward(torch.zeros_like(input[0][..., :1, :] if input[0].dim() > 1 else input[0]))
                return _AffineRatio.apply(input[0], output.detach(), bias.detach(), True)
        if kind == 'rms' and output.shape != input[0].shape:
            x, y = input[0].detach(), output.detach()
            _confirmed(module, 'normaliser', lambda: _confirm_normaliser(module, x, y))
            return output.detach()
        bias = getattr(module, 'bias', None)
        if kind == 'rms' and isinstance(bias, torch.Tensor) and bias.shape == output.shape[-1:]:
            return _AffineRatio.apply(input[0], output, bias.detach(), False)
        if kind == 'rms':
            return elementwise_identity(input[0], output, compute=module_output(module) if self.recomputable else None)
        if kind == 'layer':
            dims = len(module.normalized_shape)
            return layer_norm_identity(input[0], dims, module.weight, module.bias, module.eps).to(output.dtype)
        raise TypeError(
            f'NormIdentity does not know how {type(module).__name__} normalises; supported are torch.nn.LayerNorm, '
            'torch.nn.RMSNorm and Hugging Face *RMSNorm modules'
        )

    def copy(self):
        duplicate = super().copy()
        duplicate.recomputable = False
        return duplicate


def _confirm_normaliser(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> str:
    """``'normaliser'`` for a module that returns the normaliser ``g(x)`` of the last dimension of ``x``: one
    positive value per row, divided by ``k`` where the row is multiplied by ``k``;
    :py:class:`~zennit_attn.core.errors.UnsupportedModelError` otherwise."""
    name = type(module).__name__

    def refuse(reason):
        raise UnsupportedModelError(
            f'{name} is named like a normalisation but {reason}, so neither the normalisation rule (Prop. 3.4) nor '
            'the rule of its normaliser applies to it; map it to a rule of the composite (docs: Use a composite) or '
            'report the model.'
        )

    if y.shape != x.shape[:-1] + (1,):
        refuse(f'maps {tuple(x.shape)} to {tuple(y.shape)}')
    with torch.no_grad():
        generator = torch.Generator(device=x.device).manual_seed(0)
        probe = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        # rows of an RMS of 10: far above any epsilon (1e-5), and their squares within float16's range
        probe = probe / probe.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30) * 10
        factor = torch.rand(x.shape[:-1] + (1,), generator=generator, dtype=x.dtype, device=x.device).add(0.5) * 2
        reference, scaled = module.forward(probe), module.forward(probe * factor)
        tolerance = 5e-2 if torch.finfo(y.dtype).bits < 32 else 1e-3
        if not bool((reference > 0).all()) or not bool(
            ((scaled * factor - reference).abs() <= tolerance * reference).all()
        ):
            refuse(
                f'returns one value per row ({tuple(y.shape)}) that is not a normaliser (divided by k where the row is '
                'multiplied by k)'
            )
    return 'normaliser'


#: What the forward of a module named like an activation or a normalisation was found to compute (``'elementwise'``,
#: ``'rms'``, ``'centered'`` or ``'normaliser'``), by :py:func:`_forward_key` and what it was confirmed as
#: (:py:func:`_confirmed`).
_VERDICTS: dict = {}

#: The attributes every module has (``training``, its hooks' flags): not settings of what it computes.
_MODULE_ATTRIBUTES = frozenset(vars(torch.nn.Module()))


def _native_rms(module: torch.nn.Module) -> bool:
    """Whether ``module`` runs :py:class:`torch.nn.RMSNorm`'s own forward (an RMSNorm, without confirmation)."""
    return type(module).forward is torch.nn.RMSNorm.forward


def _forward_key(module: torch.nn.Module) -> tuple:
    """What determines the function a module computes: its class, its forward (also one set on the instance) and the
    settings of the instance (its attributes that are numbers, flags or strings: Gemma 3n's ``with_scale``), not its
    weights."""
    settings = tuple(
        sorted(
            (name, value)
            for name, value in vars(module).items()
            if isinstance(value, (bool, int, float, str, type(None))) and name not in _MODULE_ATTRIBUTES
        )
    )
    return type(module), type(module).forward, vars(module).get('forward'), settings


def _confirmed(module: torch.nn.Module, what: str, confirm) -> str:
    """What ``module``'s forward computes as ``what`` (``'activation'``, ``'normalisation ...'``): ``confirm()`` (on
    probes; it refuses what fails) at the first call of its class with these settings in a process, kept after."""
    key = (*_forward_key(module), what)
    verdict = _VERDICTS.get(key)
    if verdict is None:
        verdict = _VERDICTS[key] = confirm()
    return verdict


def _confirm_norm(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, profile: bool = True) -> str:
    """``'rms'`` or ``'centered'`` for a module that normalises the last dimension of ``x``: its output unchanged
    where a row of the input is scaled; ``'centered'`` where it is unchanged when a number is added to a row too;
    else ``'rms'`` where its output for a zero input is its bias (or 0) and, with ``profile``, every feature of a row
    is scaled by one factor (a module named like an RMSNorm may scale groups of features by factors of their own:
    Qwen4-Exp's ``group_size``; its element-wise ratio ``y / x`` is the rule either way)."""
    norm = _NormProbe(module, x, y)
    with torch.no_grad():
        if y.shape != x.shape:
            norm.refuse(f'maps {tuple(x.shape)} to {tuple(y.shape)}')
        if not norm.close(norm.run(norm.probe * norm.row_factors()), norm.reference):
            norm.refuse('its output changes when a row of its input (along the last dimension) is scaled')
        if norm.close(norm.run(norm.probe + norm.probe.abs().amax(-1, keepdim=True)), norm.reference):
            return 'centered'
        offset = norm.offset()
        if profile and not norm.one_factor_per_row(offset):
            norm.refuse('it neither subtracts the mean nor scales every feature of a row by one factor')
    return 'rms'


class _NormProbe:
    """What :py:func:`_confirm_norm` runs a module named like a normalisation on: random probes of the input's shape
    (the input received can be degenerate: equal rows), far above any epsilon of the normalisation (rows scaled to an
    RMS of 1e3 each: a normalisation over another dimension is not invariant to that), compared within a tolerance of
    the output's precision."""

    def __init__(self, module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
        self.module, self.x = module, x
        self.tolerance = 5e-2 if torch.finfo(y.dtype).bits < 32 else 1e-3
        self.generator = torch.Generator(device=x.device).manual_seed(0)
        probe = torch.randn(x.shape, generator=self.generator, dtype=x.dtype, device=x.device)
        self.probe = probe / probe.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30) * 1e3
        self.row = x[..., :1, :] if x.dim() > 1 else x
        with torch.no_grad():
            self.reference = self.run(self.probe)

    def refuse(self, reason: str):
        raise UnsupportedModelError(
            f'{type(self.module).__name__} is named like a normalisation but {reason}, so the normalisation rule '
            '(Prop. 3.4) does not apply to it; map it to a rule of the composite (docs: Use a composite) or report '
            'the model.'
        )

    def run(self, probe: torch.Tensor) -> torch.Tensor:
        try:
            return self.module.forward(probe)
        except Exception as error:  # e.g. a channels-first layout that a one-row probe does not have
            self.refuse(f'it does not run on a probe of shape {tuple(probe.shape)} ({type(error).__name__}: {error})')

    def close(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        return bool(((a - b).abs().max() <= self.tolerance * b.abs().max().clamp_min(1e-12)).item())

    def row_factors(self) -> torch.Tensor:
        """A random factor in [1, 3) per row."""
        shape = self.probe.shape[:-1] + (1,)
        return 2 * torch.rand(shape, generator=self.generator, dtype=self.x.dtype, device=self.x.device).add(0.5)

    def offset(self) -> torch.Tensor:
        """The output for a zero input: ``b`` of ``y = x c w + b``, which must be the module's bias (xLSTM's
        ``use_bias``), or 0 without one."""
        offset = self.run(torch.zeros_like(self.row))
        bias = getattr(self.module, 'bias', None)
        expected = (
            bias.expand_as(offset).to(offset.dtype) if isinstance(bias, torch.Tensor) else torch.zeros_like(offset)
        )
        if not bool((offset == expected).all()) and not self.close(offset, expected):
            self.refuse('it adds a constant to its output that is not its bias')
        return offset

    def one_factor_per_row(self, offset: torch.Tensor) -> bool:
        """Whether ``y - b`` over ``x`` is the same profile over the features in every row (``x c w``)."""
        features = (self.run(torch.full_like(self.row, 1e3)) - offset) / 1e3
        scale = self.probe * features
        ratio = (self.reference - offset) / scale
        valid = scale.abs() > 1e-6 * scale.abs().amax()
        low = torch.where(valid, ratio, float('inf')).amin(-1)
        high = torch.where(valid, ratio, float('-inf')).amax(-1)
        return bool((high - low <= self.tolerance * high.abs().clamp_min(1e-12)).all())


class _AffineRatio(torch.autograd.Function):
    """Backward of a normalisation with a bias, ``y = x' c w + b`` with ``c`` constant (Prop. 3.4), where ``x'`` is
    ``x - mean(x)`` (``centered``: LayerNorm-like) or ``x`` (an RMSNorm with a bias: xLSTM's ``use_bias``):
    ``g_in = h - mean(h)`` with ``h = g_out (y - b) / x'`` (centred), else ``g_in = g_out (y - b) / x``, so that
    ``sum x g_in = sum (y - b) g_out``: the bias absorbs its share (the epsilon rule on the affine part)."""

    @staticmethod
    def forward(ctx, input, output, bias, centered):
        ctx.save_for_backward(input.detach(), output.detach(), bias)
        ctx.centered = centered
        return output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        input, output, bias = ctx.saved_tensors
        dtype = compute_dtype(input, output, grad_output)
        x = input.to(dtype)
        if ctx.centered:
            x = x - x.mean(-1, keepdim=True)
        ratio = ((output.to(dtype) - bias.to(dtype)) / x).nan_to_num_(0.0, 0.0, 0.0)
        scaled = ratio * grad_output.to(dtype)
        if ctx.centered:
            scaled = scaled - scaled.mean(-1, keepdim=True)
        return scaled.to(input.dtype), None, None, None
