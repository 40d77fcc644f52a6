"""The AttnLRP rules in the gradient convention (see :py:mod:`zennit_attn.engine.rules`): epsilon (Eq. 8), identity
(Eq. 9), normalisation (Prop. 3.4), softmax (Prop. 3.1), uniform (Prop. 3.2) and bilinear (Prop. 3.3) rules, and
the CP-LRP baseline's constant factors."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from zennit.core import RemovableHandle, RemovableHandleList

from ..kinds import UnsupportedModelError, is_listed_activation, norm_kind
from ..modules import Operand, forward_parameters
from .base import (
    GradientRule,
    compute_dtype,
    elementwise_identity,
    gradient_map,
    layer_norm_identity,
    scaled_gradient,
    tensor_output,
)


def _stabilize(tensor: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``tensor + epsilon * sign(tensor)`` with sign(0) = 1 (the stabiliser of Eq. 5 and Eq. 8)."""
    return tensor + epsilon * torch.where(tensor >= 0, 1.0, -1.0).to(tensor.dtype)


class _SoftmaxTaylor(torch.autograd.Function):
    """Backward of Prop. 3.1: ``R_in = x (R - s sum(R))`` with ``R = s g``, written as ``g_in = R_in / x``."""

    @staticmethod
    def forward(ctx, input, output, dim):
        ctx.save_for_backward(output.detach())
        ctx.dim = dim
        return output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        (output,) = ctx.saved_tensors
        dtype = compute_dtype(output, grad_output)
        output, grad = output.to(dtype), grad_output.to(dtype)
        relevance = output * grad
        grad_input = relevance - output * relevance.sum(ctx.dim, keepdim=True)
        return grad_input.to(grad_output.dtype), None, None


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
        dtype = compute_dtype(output)
        value = output.detach().to(dtype)
        factor = value / _stabilize(value, self.epsilon)
        return gradient_map(output, lambda grad: (grad.to(dtype) * factor).to(grad.dtype))


class Identity(GradientRule):
    """Identity rule (Eq. 9) for element-wise non-linearities (GELU, SiLU, tanh, ...): ``R_in = R_out``.

    Modules recognised by their class name only (not in :py:data:`~zennit_attn.engine.kinds.ACTIVATIONS`) are
    confirmed element-wise at their first call: reordering the features of the input reorders the output.

    The rule needs the module's input after the forward: a module that overwrites it (``torch.nn.SiLU(inplace=True)``)
    runs out of place while the rule is registered (its ``inplace`` flag is set to False and put back by
    :py:meth:`remove`); a module that changes its input in place otherwise is refused
    (:py:class:`~zennit_attn.engine.kinds.UnsupportedModelError`), never explained from the overwritten values.
    """

    confirmed = False
    #: ``(module, whether it held its own ``inplace`` attribute)`` while its flag is switched off
    switched: tuple[torch.nn.Module, bool] | None = None
    #: the version counter of the module's input when its forward began
    version: int | None = None

    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        handles = super().register(module)
        handles.append(module.register_forward_pre_hook(self._pre_forward))
        if getattr(module, 'inplace', None) is True:
            self.switched = (module, 'inplace' in module.__dict__)
            module.inplace = False
        return handles

    def _pre_forward(self, module, input):
        first = input[0] if input else None
        self.version = first._version if isinstance(first, torch.Tensor) else None

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
            raise ValueError(
                f'The identity rule needs an element-wise module, but {type(module).__name__} maps '
                f'{tuple(input[0].shape)} to {tuple(output.shape)}'
            )
        if not self.confirmed and not is_listed_activation(module):
            with torch.no_grad():
                flipped = module.forward(input[0].detach().flip(-1))
            if not torch.allclose(flipped, output.detach().flip(-1), equal_nan=True):
                raise UnsupportedModelError(
                    f'{type(module).__name__} is named like an activation but is not element-wise (its output '
                    'changes when the features are reordered), so the identity rule (Eq. 9) does not apply to it; '
                    'add a rule for it or report the model.'
                )
        self.confirmed = True
        return elementwise_identity(input[0], output, gate=True)

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
        duplicate.confirmed, duplicate.switched, duplicate.version = False, None, None
        return duplicate


class NormIdentity(GradientRule):
    """Identity rule on the normalisation ``x / g(x)`` of LayerNorm and RMSNorm (Prop. 3.4).

    ``g(x)`` is treated as a constant; the affine parts (mean subtraction, weight, bias) are linear and keep
    their epsilon-rule gradient. For RMSNorm the output is ``x_i c w_i`` with a per-row constant ``c``, so the
    rule is the element-wise ratio ``g_in = g_out y / x``, valid for every RMSNorm variant (Gemma's
    ``1 + w``, float32 up-casting, ...). For LayerNorm the output is recomputed with the standard deviation
    detached.

    Other modules named like a normalisation (``norm_kind`` ``'probe'``) are confirmed at their first call, on
    the input they receive: the output must not change when the input is scaled (a normalisation); if it does not
    change when a constant is added either, the module subtracts the mean (LayerNorm-like: ``y = (x - mean) c w +
    b``, with ``b`` the output for a zero input), otherwise it must be RMSNorm-like (``y / x`` the same profile in
    every row). A module that fails is refused (:py:class:`~zennit_attn.engine.kinds.UnsupportedModelError`).
    """

    def __init__(self):
        super().__init__()
        self.confirmed = None

    def forward(self, module, input, output):
        output = tensor_output(module, output)
        if not output.requires_grad or not input[0].requires_grad:
            return None
        kind = norm_kind(module)
        if kind == 'probe':
            if self.confirmed is None:
                self.confirmed = _confirm_norm(module, input[0].detach(), output.detach())
            kind, bias = self.confirmed
            if kind == 'centered':
                return _CenteredRatio.apply(input[0], output.detach(), bias)
        if kind == 'rms':
            return elementwise_identity(input[0], output)
        if kind == 'layer':
            dims = len(module.normalized_shape)
            return layer_norm_identity(input[0], dims, module.weight, module.bias, module.eps).to(output.dtype)
        raise TypeError(
            f'NormIdentity does not know how {type(module).__name__} normalises; supported are torch.nn.LayerNorm, '
            'torch.nn.RMSNorm and Hugging Face *RMSNorm modules'
        )

    def copy(self):
        duplicate = super().copy()
        duplicate.confirmed = None
        return duplicate


def _confirm_norm(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    """``('rms', None)`` or ``('centered', bias)`` for a module that normalises the last dimension of ``x``."""
    name = type(module).__name__
    tolerance = 5e-2 if torch.finfo(y.dtype).bits < 32 else 1e-3

    def close(a, b):
        return bool(((a - b).abs().max() <= tolerance * b.abs().max().clamp_min(1e-12)).item())

    def refuse(reason):
        raise UnsupportedModelError(
            f'{name} is named like a normalisation but {reason}, so the normalisation rule (Prop. 3.4) does not '
            'apply to it; add a rule for it (a Family entry or a composite rule) or report the model.'
        )

    def run(probe):
        try:
            return module.forward(probe)
        except Exception as error:  # e.g. a channels-first layout that a one-row probe does not have
            refuse(f'it does not run on a probe of shape {tuple(probe.shape)} ({type(error).__name__}: {error})')

    with torch.no_grad():
        if y.shape != x.shape:
            refuse(f'maps {tuple(x.shape)} to {tuple(y.shape)}')
        # random probes (the input received can be degenerate: equal rows), far above any epsilon of the
        # normalisation: rows scaled to an RMS of 1e3 each (a normalisation over another dimension is not invariant)
        generator = torch.Generator(device=x.device).manual_seed(0)
        probe = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        probe = probe / probe.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30) * 1e3
        reference = run(probe)
        if not close(
            run(
                2
                * probe
                * torch.rand(probe.shape[:-1] + (1,), generator=generator, dtype=x.dtype, device=x.device).add(0.5)
            ),
            reference,
        ):
            refuse('its output changes when a row of its input (along the last dimension) is scaled')
        if close(run(probe + probe.abs().amax(-1, keepdim=True)), reference):
            return 'centered', run(torch.zeros_like(x[..., :1, :] if x.dim() > 1 else x))
        profile = run(torch.full_like(x[..., :1, :] if x.dim() > 1 else x, 1e3)) / 1e3
        scale = probe * profile
        ratio = reference / scale
        valid = scale.abs() > 1e-6 * scale.abs().amax()
        low = torch.where(valid, ratio, float('inf')).amin(-1)
        high = torch.where(valid, ratio, float('-inf')).amax(-1)
        if not bool((high - low <= tolerance * high.abs().clamp_min(1e-12)).all()):
            refuse('it neither subtracts the mean nor scales every feature of a row by one factor')
    return 'rms', None


class _CenteredRatio(torch.autograd.Function):
    """Backward of a mean-subtracting normalisation ``y = (x - mean) c w + b`` with ``c`` constant (Prop. 3.4):
    ``g_in = h - mean(h)`` with ``h = g_out (y - b) / (x - mean)``, so that ``sum x g_in = sum (y - b) g_out``."""

    @staticmethod
    def forward(ctx, input, output, bias):
        ctx.save_for_backward(input.detach(), output.detach(), bias)
        return output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        input, output, bias = ctx.saved_tensors
        dtype = compute_dtype(input, output, grad_output)
        x = input.to(dtype)
        centered = x - x.mean(-1, keepdim=True)
        ratio = ((output.to(dtype) - bias.to(dtype)) / centered).nan_to_num_(0.0, 0.0, 0.0)
        scaled = ratio * grad_output.to(dtype)
        return (scaled - scaled.mean(-1, keepdim=True)).to(input.dtype), None, None


class Softmax(GradientRule):
    """Softmax rule (Prop. 3.1): Taylor decomposition at ``x`` with bias, ``R_in = x (R - s sum_j R_j)``.

    For a :py:class:`torch.nn.Softmax` module. The hidden bias absorbs part of the relevance. Inside
    attention no module exists for the softmax; there the plain softmax gradient between the operand rules
    is exactly this rule (see :py:class:`UniformOperand`).
    """

    def forward(self, module, input, output):
        output = tensor_output(module, output)
        if not output.requires_grad:
            return None
        dim = getattr(module, 'dim', None)
        if dim is None:
            raise ValueError(f'{type(module).__name__} has no softmax dimension (attribute "dim")')
        return _SoftmaxTaylor.apply(input[0], output.detach(), dim)


class OperandRule(GradientRule):
    """Scale the gradient of an :py:class:`~zennit_attn.engine.modules.Operand` by a factor per role.

    A factor of 0 detaches the operand (it is treated as a constant). Subclasses set :py:attr:`scales`.
    """

    scales: dict[str, float] = {}

    def forward(self, module, input, output):
        if not isinstance(module, Operand):
            raise TypeError(
                f'{type(self).__name__} applies to zennit_attn.engine.modules.Operand, not {type(module).__name__}'
            )
        if not output.requires_grad:
            return None
        factors = [self.scales[role] for role in module.roles]
        if len(factors) == 1:
            (factor,) = factors
            if factor == 0:
                return output.detach()
            if factor == 1:
                return None
            scale = factor
        else:
            sizes = module.section_sizes(output.shape[-1])
            scale = torch.cat(
                [
                    torch.full((size,), factor, dtype=output.dtype, device=output.device)
                    for size, factor in zip(sizes, factors)
                ]
            )
        return scaled_gradient(output, scale)


class UniformOperand(OperandRule):
    """AttnLRP at the operands of inline products (Prop. 3.2 and 3.3 with epsilon -> 0).

    - ``value``: enters ``A V``; the uniform rule gives each factor half, so the gradient is halved.
    - ``query``/``key``: enter ``Q K^T`` (half each) whose softmax (Prop. 3.1, the plain gradient) is the
      factor ``A`` of ``A V`` (half again): the gradient is multiplied by 1/4.
    - ``gate``/``up``: the two factors of ``act(gate) * up``: halved. Scaling the gate projection's output
      equals scaling the activation's output, because the identity rule is linear in the gradient.
    - ``routed``/``routing``: the output ``sum_k w_k E_k(x)`` of a mixture of experts is halved, which halves
      the gradient of both factors of every product ``w_k E_k``; the routing weights ``w`` themselves (a
      softmax over the top-k router logits, Prop. 3.1) keep their gradient.
    """

    scales = {'query': 0.25, 'key': 0.25, 'value': 0.5, 'gate': 0.5, 'up': 0.5, 'routing': 1.0, 'routed': 0.5}


class ConstantOperand(OperandRule):
    """CP-LRP (Ali et al. 2022) at the operands of inline products.

    The softmax output, the non-linear gate and the routing weights are constants: query, key, gate and
    routing receive no relevance, and the products become linear in value, up and the experts' outputs,
    which receive all of it.
    """

    scales = {'query': 0.0, 'key': 0.0, 'value': 1.0, 'gate': 0.0, 'up': 1.0, 'routing': 0.0, 'routed': 1.0}


class UniformProduct(GradientRule):
    """Uniform rule (Prop. 3.2) for :py:class:`~zennit_attn.engine.modules.Product`: each of N factors gets ``R / N``.

    Each factor's share of ``R = f(x) g`` is ``x_i * (g prod_{k != i} x_k) / N``: the plain gradient over N, which is
    the plain gradient of the output gradient ``g / N`` (the rule scales the gradient at the output). N counts every
    factor, also one that does not require a gradient (a constant, or a tensor not explained): its share ``R / N``
    stays there, and each factor that requires a gradient gets ``R / N`` whatever the others require, so the relevance
    of a factor does not depend on which inputs are explained.
    """

    def forward(self, module, input, output):
        output = tensor_output(module, output)
        if not output.requires_grad:
            return None
        return scaled_gradient(output, 1 / len(input))


class BilinearEpsilon(GradientRule):
    """Epsilon + uniform rule for :py:class:`~zennit_attn.engine.modules.MatMul` ``O = A B`` (Prop. 3.3).

    ``R_A[j, i] = sum_p A_ji B_ip R_jp / (2 O_jp + eps)``, and ``R_B`` by summing over ``j``. In the gradient
    convention ``g_A = (R / (2 O + eps)) B^T`` and ``g_B = A^T (R / (2 O + eps))`` with ``R = O g``: the plain gradient
    of the output gradient ``O g / (2 O + eps)`` (``g / 2`` for ``eps = 0``), which the rule puts at the output. Each
    operand that requires a gradient gets its share, also where the other is a constant (its share stays there). The
    factor ``O / (2 O + eps)`` is computed in the forward pass (one tensor of the output's shape, float32 for a
    half-precision output).

    Parameters
    ----------
    epsilon: float
        Stabiliser of the division by ``2 O``; with 0 the rule halves the gradient.
    """

    def __init__(self, epsilon: float = 1e-6):
        super().__init__()
        self.epsilon = epsilon

    def forward(self, module, input, output):
        output = tensor_output(module, output)
        if not output.requires_grad:
            return None
        if self.epsilon == 0:
            return scaled_gradient(output, 0.5)
        dtype = compute_dtype(output)
        value = output.detach().to(dtype)
        factor = value / _stabilize(2 * value, self.epsilon)
        return gradient_map(output, lambda grad: (grad.to(dtype) * factor).to(grad.dtype))


class ConstantFactors(GradientRule):
    """CP-LRP for :py:class:`~zennit_attn.engine.modules.Product` and :py:class:`~zennit_attn.engine.modules.MatMul`.

    The factors at ``indices`` are constants and receive nothing; the operation is then linear in the others,
    which keep their plain gradient (epsilon rule with epsilon -> 0). The constant factors are detached before the
    module's forward (positional arguments by index, keyword arguments by the name of the forward's parameter at that
    index).

    Parameters
    ----------
    indices: iterable of int
        Positions of the constant inputs (e.g. ``(0,)`` for the attention matrix of ``A @ V``).
    """

    def __init__(self, indices: Iterable[int] = (0,)):
        super().__init__()
        self.indices = tuple(indices)

    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        return RemovableHandleList(
            [
                RemovableHandle(self),
                module.register_forward_pre_hook(self._detach_constants, with_kwargs=True),
            ]
        )

    def _detach_constants(self, module, args, kwargs):
        if not self.active:
            return None
        parameters = forward_parameters(module)
        names = {parameters[index] for index in self.indices if 0 <= index < len(parameters)}
        args = tuple(_detached(arg) if index in self.indices else arg for index, arg in enumerate(args))
        kwargs = {key: _detached(value) if key in names else value for key, value in kwargs.items()}
        return args, kwargs


def _detached(value):
    """``value.detach()`` for a tensor, ``value`` otherwise."""
    return value.detach() if isinstance(value, torch.Tensor) else value
