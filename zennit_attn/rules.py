"""The AttnLRP rules (Achtibat et al., ICML 2024) as zennit hooks.

Convention
----------
zennit's own rules pass *relevance* backward through every hooked module, which forces every operation
between two hooked modules (residual additions, rotary embeddings, scalings) to be a module too. The rules
here follow the gradient-times-input formulation of the paper (Sec. 3.1, "this formula can be efficiently
implemented in automatic differentiation libraries"): what flows backward is a *modified gradient* ``g``, and
the relevance of any tensor ``x`` is ``R = x * g``. Linear operations without bias, residual additions,
reshapes and rotary embeddings then need no rule at all (the epsilon rule, Eq. 8, with epsilon -> 0 is the
plain gradient times input), and only the non-linear operations change their backward pass:

=============================  =====================================  ==============================
operation                      rule                                   class
=============================  =====================================  ==============================
linear layer                   epsilon rule, Eq. 8                    :py:class:`Epsilon`
element-wise non-linearity     identity rule, Eq. 9                   :py:class:`Identity`
LayerNorm / RMSNorm            identity rule on ``x / g(x)``, Prop. 3.4  :py:class:`NormIdentity`
softmax                        Taylor decomposition with bias, Prop. 3.1  :py:class:`Softmax`
product of N factors           uniform rule, Prop. 3.2                :py:class:`UniformProduct`
matrix multiplication          epsilon + uniform rule, Prop. 3.3      :py:class:`BilinearEpsilon`
operands of inline products    Prop. 3.2 / 3.3 at the operand         :py:class:`UniformOperand`
CP-LRP (Ali et al. 2022)       softmax output and gate constant       :py:class:`ConstantOperand`,
                                                                      :py:class:`ConstantFactors`
linear / convolution in ViTs   gamma, z+, alpha-beta (app. A.2.3)     :py:class:`Gamma`, :py:class:`ZPlus`,
                                                                      :py:class:`AlphaBeta`
any zennit relevance rule      converted at the module boundary       :py:class:`RelevanceRule`
=============================  =====================================  ==============================

:py:class:`RelevanceBoundary`, registered on the root module by the composites, converts at the model's
boundary so that the outward contract stays zennit's: relevance goes in at the output (``grad_outputs``
of :py:class:`zennit.attribution.Gradient`) and relevance comes out at the floating-point inputs.
"""
from __future__ import annotations

import copy
import functools
from typing import Iterable

import torch
from zennit.core import Hook, RemovableHandle, RemovableHandleList

from .layers import Operand
from .types import norm_kind


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """Float32 for half-precision tensors, the tensors' own dtype otherwise."""
    dtype = functools.reduce(torch.promote_types, (tensor.dtype for tensor in tensors))
    return torch.float32 if torch.finfo(dtype).bits < 32 else dtype


def _safe_divide(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator``, and 0 where the denominator is exactly 0."""
    return torch.where(denominator == 0, torch.zeros_like(numerator), numerator / denominator)


def _stabilize(tensor: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``tensor + epsilon * sign(tensor)`` with sign(0) = 1 (the stabiliser of Eq. 5 and Eq. 8)."""
    return tensor + epsilon * torch.where(tensor >= 0, 1.0, -1.0).to(tensor.dtype)


class _ElementwiseIdentity(torch.autograd.Function):
    """Forward: return the precomputed ``output = f(input)``. Backward: ``g_in = g_out * f(x) / x``.

    This is the identity rule ``R_in = R_out`` (Eq. 9) written for the modified gradient: with
    ``R_out = f(x) g_out`` and ``R_in = x g_in``. Where ``x == 0`` the gradient is 0 (``f(0) = 0`` for all
    activations this is registered to, so no relevance is lost there; a non-finite ratio ``f(x) / x`` is set to
    0 as well).
    """
    @staticmethod
    def forward(ctx, input, output):
        ctx.save_for_backward(input.detach(), output.detach())
        return output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        input, output = ctx.saved_tensors
        dtype = _compute_dtype(input, output, grad_output)
        ratio = torch.div(output.to(dtype), input.to(dtype)).nan_to_num_(0.0, 0.0, 0.0)
        return ratio.mul_(grad_output.to(dtype)).to(input.dtype), None


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
        dtype = _compute_dtype(output, grad_output)
        output, grad = output.to(dtype), grad_output.to(dtype)
        relevance = output * grad
        grad_input = relevance - output * relevance.sum(ctx.dim, keepdim=True)
        return grad_input.to(grad_output.dtype), None, None


def elementwise_identity(input: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """Return ``output`` (computed element-wise from ``input``) such that the identity rule (Eq. 9) applies."""
    return _ElementwiseIdentity.apply(input, output.detach())


class GradientRule(Hook):
    """Base class of the rules that act by a forward hook on the module's output.

    Subclasses implement :py:meth:`forward` and return a replacement output (or None to keep the output).
    Registering needs no input wrapping, so these rules add no memory to the backward pass beyond what they
    state.
    """
    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        return RemovableHandleList([
            RemovableHandle(self),
            module.register_forward_hook(self._forward_hook),
        ])

    def _forward_hook(self, module, input, output):
        if not self.active:
            return None
        return self.forward(module, input, output)

    def forward(self, module, input, output):
        """Return a replacement output with the rule's backward, or None."""
        return None

    def copy(self):
        duplicate = copy.copy(self)
        Hook.__init__(duplicate)
        return duplicate


def _tensor_output(module: torch.nn.Module, output) -> torch.Tensor:
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f'{type(module).__name__} returned {type(output).__name__}; this rule needs a module with a single '
            'tensor output'
        )
    return output


class Epsilon(GradientRule):
    """Epsilon rule (Eq. 8) for linear layers: ``R_i = sum_j W_ji x_i R_j / (z_j + eps sign(z_j))``.

    In the gradient convention this multiplies the output gradient by ``z / (z + eps sign(z))``; the bias
    and epsilon absorb their share of the relevance. With ``epsilon = 0`` (the default of the LLM composites)
    the rule is the plain gradient: no division happens in this formulation, so no stabiliser is needed, and
    nothing is registered.

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
        output = _tensor_output(module, output)
        if not output.requires_grad:
            return None
        detached = output.detach()
        epsilon = self.epsilon

        def hook(grad):
            dtype = _compute_dtype(detached, grad)
            factor = detached.to(dtype) / _stabilize(detached.to(dtype), epsilon)
            return (grad.to(dtype) * factor).to(grad.dtype)

        result = output.view_as(output)
        result.register_hook(hook)
        return result


class Identity(GradientRule):
    """Identity rule (Eq. 9) for element-wise non-linearities (GELU, SiLU, tanh, ...): ``R_in = R_out``."""
    def forward(self, module, input, output):
        output = _tensor_output(module, output)
        if not output.requires_grad or not input or not isinstance(input[0], torch.Tensor):
            return None
        if input[0].shape != output.shape:
            raise ValueError(
                f'The identity rule needs an element-wise module, but {type(module).__name__} maps '
                f'{tuple(input[0].shape)} to {tuple(output.shape)}'
            )
        return elementwise_identity(input[0], output)


class NormIdentity(GradientRule):
    """Identity rule on the normalisation ``x / g(x)`` of LayerNorm and RMSNorm (Prop. 3.4).

    ``g(x)`` is treated as a constant; the affine parts (mean subtraction, weight, bias) are linear and keep
    their epsilon-rule gradient. For RMSNorm the output is ``x_i c w_i`` with a per-row constant ``c``, so the
    rule is the element-wise ratio ``g_in = g_out y / x``, valid for every RMSNorm variant (Gemma's
    ``1 + w``, float32 up-casting, ...). For LayerNorm the output is recomputed with the standard deviation
    detached.
    """
    def forward(self, module, input, output):
        output = _tensor_output(module, output)
        if not output.requires_grad or not input[0].requires_grad:
            return None
        kind = norm_kind(module)
        if kind == 'rms':
            return elementwise_identity(input[0], output)
        if kind == 'layer':
            return self._layer_norm(module, input[0], output)
        raise TypeError(
            f'NormIdentity does not know how {type(module).__name__} normalises; supported are torch.nn.LayerNorm, '
            'torch.nn.RMSNorm and Hugging Face *RMSNorm modules'
        )

    @staticmethod
    def _layer_norm(module, input, output):
        dims = tuple(range(-len(module.normalized_shape), 0))
        dtype = _compute_dtype(input)
        x = input.to(dtype)
        centered = x - x.mean(dims, keepdim=True)
        variance = centered.detach().pow(2).mean(dims, keepdim=True)
        result = centered * torch.rsqrt(variance + module.eps)
        if module.weight is not None:
            result = result * module.weight.to(dtype)
        if module.bias is not None:
            result = result + module.bias.to(dtype)
        return result.to(output.dtype)


class Softmax(GradientRule):
    """Softmax rule (Prop. 3.1): Taylor decomposition at ``x`` with bias, ``R_in = x (R - s sum_j R_j)``.

    For a :py:class:`torch.nn.Softmax` module. The hidden bias absorbs part of the relevance. Inside
    attention no module exists for the softmax; there the plain softmax gradient between the operand rules
    is exactly this rule (see :py:class:`UniformOperand`).
    """
    def forward(self, module, input, output):
        output = _tensor_output(module, output)
        if not output.requires_grad:
            return None
        dim = getattr(module, 'dim', None)
        if dim is None:
            raise ValueError(f'{type(module).__name__} has no softmax dimension (attribute "dim")')
        return _SoftmaxTaylor.apply(input[0], output.detach(), dim)


class OperandRule(GradientRule):
    """Scale the gradient of an :py:class:`~zennit_attn.layers.Operand` by a factor per role.

    A factor of 0 detaches the operand (it is treated as a constant). Subclasses set :py:attr:`scales`.
    """
    scales: dict[str, float] = {}

    def forward(self, module, input, output):
        if not isinstance(module, Operand):
            raise TypeError(f'{type(self).__name__} applies to zennit_attn.layers.Operand, not {type(module).__name__}')
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
            scale = torch.cat([
                torch.full((size,), factor, dtype=output.dtype, device=output.device)
                for size, factor in zip(sizes, factors)
            ])
        result = output.view_as(output)
        result.register_hook(lambda grad: grad * scale)
        return result


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


class _InputGradientRule(Hook):
    """Base for rules that replace the gradients of a multi-input module through zennit's Hook mechanism."""
    def forward(self, module, input, output):
        self.stored_tensors['input'] = tuple(tensor.detach() for tensor in input)
        self.stored_tensors['output'] = output.detach()

    def copy(self):
        duplicate = copy.copy(self)
        Hook.__init__(duplicate)
        return duplicate


class UniformProduct(_InputGradientRule):
    """Uniform rule (Prop. 3.2) for :py:class:`~zennit_attn.layers.Product`: each of N factors gets ``R / N``.

    Each factor's share of ``R = f(x) g`` is ``x_i * (g prod_{k != i} x_k) / N``: the plain gradient over N.
    """
    def backward(self, module, grad_input, grad_output):
        count = len(self.stored_tensors['input'])
        return tuple(None if grad is None else grad / count for grad in grad_input)


class BilinearEpsilon(_InputGradientRule):
    """Epsilon + uniform rule for :py:class:`~zennit_attn.layers.MatMul` ``O = A B`` (Prop. 3.3).

    ``R_A[j, i] = sum_p A_ji B_ip R_jp / (2 O_jp + eps)``, and ``R_B`` by summing over ``j``. In the gradient
    convention ``g_A = (R / (2 O + eps)) B^T`` and ``g_B = A^T (R / (2 O + eps))`` with ``R = O g``.

    Parameters
    ----------
    epsilon: float
        Stabiliser of the division by ``2 O``; with 0 the rule halves the gradient.
    """
    def __init__(self, epsilon: float = 1e-6):
        super().__init__()
        self.epsilon = epsilon

    def backward(self, module, grad_input, grad_output):
        a, b = self.stored_tensors['input']
        output = self.stored_tensors['output']
        dtype = _compute_dtype(a, b, grad_output[0])
        grad = grad_output[0].to(dtype)
        if self.epsilon == 0:
            normed = grad / 2
        else:
            output = output.to(dtype)
            normed = output * grad / _stabilize(2 * output, self.epsilon)
        grad_a = torch.matmul(normed, b.to(dtype).transpose(-1, -2))
        grad_b = torch.matmul(a.to(dtype).transpose(-1, -2), normed)
        grads = (_sum_to(grad_a, a.shape).to(a.dtype), _sum_to(grad_b, b.shape).to(b.dtype))
        return tuple(None if old is None else new for old, new in zip(grad_input, grads))


def _sum_to(tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a broadcast gradient back to ``shape``."""
    while tensor.dim() > len(shape):
        tensor = tensor.sum(0)
    dims = tuple(index for index, size in enumerate(shape) if size == 1 and tensor.shape[index] != 1)
    return tensor.sum(dims, keepdim=True) if dims else tensor


class ConstantFactors(_InputGradientRule):
    """CP-LRP for :py:class:`~zennit_attn.layers.Product` and :py:class:`~zennit_attn.layers.MatMul`.

    The factors at ``indices`` are constants and receive nothing; the operation is then linear in the others,
    which keep their plain gradient (epsilon rule with epsilon -> 0).

    Parameters
    ----------
    indices: iterable of int
        Positions of the constant inputs (e.g. ``(0,)`` for the attention matrix of ``A @ V``).
    """
    def __init__(self, indices: Iterable[int] = (0,)):
        super().__init__()
        self.indices = tuple(indices)

    def backward(self, module, grad_input, grad_output):
        return tuple(None if index in self.indices else grad for index, grad in enumerate(grad_input))


def _view_with_hook(tensor: torch.Tensor, hook) -> torch.Tensor:
    """A view of ``tensor`` whose gradient passes ``hook`` on its way to ``tensor``.

    The hook sits on an inner view, so hooks that others register on the returned tensor see the gradient
    before the conversion.
    """
    inner = tensor.view_as(tensor)
    inner.register_hook(hook)
    return inner.view_as(inner)


def _to_relevance(tensor):
    """Input side of the boundary: the gradient reaching ``x`` becomes the relevance ``x * g``."""
    if not (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.requires_grad):
        return tensor
    detached = tensor.detach()
    return _view_with_hook(tensor, lambda grad: grad * detached)


def _to_gradient(tensor):
    """Output side of the boundary: the relevance ``R`` given at output ``y`` becomes the gradient ``R / y``."""
    if not (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.requires_grad):
        return tensor
    detached = tensor.detach()
    # one output-sized allocation (a division by 0 gives inf or nan, set to 0): logits can be large
    return _view_with_hook(tensor, lambda relevance: torch.div(relevance, detached).nan_to_num_(0.0, 0.0, 0.0))


#: Fields of Hugging Face model outputs that the boundary treats as outputs to be explained.
OUTPUT_FIELDS = ('logits', 'last_hidden_state', 'pooler_output', 'start_logits', 'end_logits')


class RelevanceBoundary(Hook):
    """Keep zennit's outward contract at the root module: relevance in, relevance out.

    zennit's :py:class:`~zennit.attribution.Gradient` passes the output relevance as ``grad_outputs`` and
    reads relevance at the input. Inside, the AttnLRP rules pass the modified gradient ``g = R / x``. This hook
    converts the relevance given at the model output ``y`` to ``R / y`` (0 where ``y == 0``: relevance at a
    zero activation cannot be propagated), and the gradient reaching every floating-point input ``x`` (as
    positional or keyword argument, e.g. ``pixel_values`` or ``inputs_embeds``) to ``x * g``. Outputs are
    tensors, tuples (their first element) or Hugging Face model outputs (the fields in
    :py:data:`OUTPUT_FIELDS`).
    """
    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        return RemovableHandleList([
            RemovableHandle(self),
            module.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
            module.register_forward_hook(self._post_forward),
        ])

    def _pre_forward(self, module, args, kwargs):
        if not self.active:
            return None
        return tuple(_to_relevance(arg) for arg in args), {key: _to_relevance(val) for key, val in kwargs.items()}

    def _post_forward(self, module, input, output):
        if not self.active:
            return None
        if isinstance(output, torch.Tensor):
            return _to_gradient(output)
        if isinstance(output, tuple) and not hasattr(output, 'keys'):
            return (_to_gradient(output[0]),) + tuple(output[1:]) if output else output
        if hasattr(output, 'keys'):
            for field in OUTPUT_FIELDS:
                if output.get(field) is not None:
                    output[field] = _to_gradient(output[field])
            return output
        raise TypeError(f'{type(module).__name__} returned {type(output).__name__}, which has no tensor to explain')

    def copy(self):
        return type(self)()


# ------------------------------------------------------------------------------------------------------------------
# zennit's relevance rules (gamma, z+, alpha-beta) in the gradient convention: the ViT composites (appendix A.2.3, B)

class _RelevanceRuleFunction(torch.autograd.Function):
    """Forward: return the module's precomputed output. Backward: ``g_in = rule(module, x, z * g_out) / x``."""
    @staticmethod
    def forward(ctx, input, output, module, rule):
        ctx.save_for_backward(input.detach(), output.detach())
        ctx.module, ctx.rule = module, rule
        return output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        input, output = ctx.saved_tensors
        relevance_out = output.to(input.dtype) * grad_output.to(input.dtype)
        relevance_in = ctx.rule.relevance(ctx.module, input, relevance_out)
        return _safe_divide(relevance_in, input).to(input.dtype), None, None, None


class RelevanceRule(GradientRule):
    """Adapter: a zennit relevance rule (a :py:class:`zennit.core.BasicHook` such as ``zennit.rules.Gamma``) in the
    gradient convention of this module.

    zennit's rules pass *relevance* and re-run the module's forward with modified parameters in the backward pass.
    At the module's boundary this adapter converts the modified gradient at the output into relevance,
    ``R_out = z * g_out`` (``z`` the module's output), applies the zennit rule's relevance computation (its input,
    parameter and output modifiers, gradient mapper and reducer), and converts the input relevance back into a
    gradient, ``g_in = R_in / x`` (0 where ``x == 0``). This is exact for every rule whose input relevance is a
    multiple of ``x`` (epsilon, gamma, z+, alpha-beta: they give ``R_in = 0`` where ``x == 0``); rules with relevance
    at ``x == 0`` (flat, w-square, z-box) would lose it there.

    The rule applies to modules with one tensor input and output (``torch.nn.Linear``, ``torch.nn.Conv2d``, ...). Its
    forward hook runs before hooks registered earlier (canonizer taps such as the
    :py:class:`~zennit_attn.layers.Operand` on a fused ``qkv`` projection), so those still act on the gradient
    before it reaches the rule. The parameters of the module get no gradient through a hooked module.

    Parameters
    ----------
    rule: zennit.core.BasicHook
        The zennit rule; only its modifier functions are used (not its state), so one instance may be shared.
    """
    def __init__(self, rule):
        super().__init__()
        from zennit.core import BasicHook

        if not isinstance(rule, BasicHook):
            raise TypeError(f'RelevanceRule needs a zennit.core.BasicHook rule, got {type(rule).__name__}')
        self.rule = rule

    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        return RemovableHandleList([
            RemovableHandle(self),
            module.register_forward_hook(self._forward_hook, prepend=True),
        ])

    def forward(self, module, input, output):
        output = _tensor_output(module, output)
        if len(input) != 1 or not isinstance(input[0], torch.Tensor):
            raise TypeError(f'{type(self).__name__} needs a module with one tensor input; {type(module).__name__} '
                            f'was called with {len(input)} positional inputs')
        if not (input[0].requires_grad and input[0].is_floating_point()):
            return None
        return _RelevanceRuleFunction.apply(input[0], output, module, self)

    def relevance(self, module: torch.nn.Module, input: torch.Tensor, relevance: torch.Tensor) -> torch.Tensor:
        """The zennit rule's input relevance of ``module`` at ``input`` for the output ``relevance``."""
        from zennit.core import ParamMod

        inputs, outputs = [], []
        for in_mod, param_mod, out_mod in zip(
                self.rule.input_modifiers, self.rule.param_modifiers, self.rule.output_modifiers):
            modified_input = in_mod(input).detach().requires_grad_()
            with ParamMod.ensure(param_mod)(module) as modified, torch.enable_grad():
                outputs.append(out_mod(modified.forward(modified_input)))
            inputs.append(modified_input)
        grad_outputs = self.rule.gradient_mapper(relevance, outputs)
        with torch.enable_grad():
            gradients = torch.autograd.grad(outputs, inputs, grad_outputs=grad_outputs, allow_unused=True)
        gradients = [torch.zeros_like(x) if grad is None else grad for x, grad in zip(inputs, gradients)]
        return self.rule.reducer(inputs, gradients).detach()


class Gamma(RelevanceRule):
    """Generalised gamma rule (appendix A.2.3, Eq. appendix-gamma-rule-general) for linear and convolution layers.

    With ``z_ij = W_ji x_i`` and ``z_j = sum_i z_ij + b_j`` (the bias is the contribution of a constant input 1):

    - ``z_j > 0``: ``R_i = sum_j (z_ij + gamma z_ij^+) / (z_j + gamma sum_k z_kj^+) R_j``,
    - ``z_j < 0``: ``R_i = sum_j (z_ij + gamma z_ij^-) / (z_j + gamma sum_k z_kj^-) R_j``,

    with ``(.)^+ = max(., 0)``, ``(.)^- = min(., 0)`` and the denominator stabilised by ``stabilizer * sign``
    (``z_j == 0`` passes nothing). Without bias the rule conserves relevance. ``gamma = 0`` is the epsilon rule,
    ``gamma -> inf`` the z+ rule. Computed by zennit's ``zennit.rules.Gamma`` through :py:class:`RelevanceRule`.

    Parameters
    ----------
    gamma: float
        Weight of the same-signed contributions (>= 0).
    stabilizer: float
        Added to the denominator with its sign.
    """
    def __init__(self, gamma: float = 0.25, stabilizer: float = 1e-6):
        from zennit.rules import Gamma as ZennitGamma

        if gamma < 0:
            raise ValueError(f'gamma must be >= 0, got {gamma}')
        super().__init__(ZennitGamma(gamma=gamma, stabilizer=stabilizer))
        self.gamma, self.stabilizer = gamma, stabilizer

    def __repr__(self) -> str:
        return f'Gamma({self.gamma!r})' if self.stabilizer == 1e-6 else \
            f'Gamma({self.gamma!r}, stabilizer={self.stabilizer!r})'


class ZPlus(RelevanceRule):
    """z+ rule (appendix A.2.3, Eq. appendix-zplus-rule): ``R_i = sum_j z_ij^+ / sum_k z_kj^+ R_j``, positive
    contributions only (zennit's version: ``x^+ w^+ + x^- w^-``, the positive bias included in the denominator).

    Parameters
    ----------
    stabilizer: float
        Added to the denominator.
    """
    def __init__(self, stabilizer: float = 1e-6):
        from zennit.rules import ZPlus as ZennitZPlus

        super().__init__(ZennitZPlus(stabilizer=stabilizer))
        self.stabilizer = stabilizer

    def __repr__(self) -> str:
        return 'ZPlus()' if self.stabilizer == 1e-6 else f'ZPlus(stabilizer={self.stabilizer!r})'


class AlphaBeta(RelevanceRule):
    """Alpha-beta rule (Bach et al. 2015): ``R_i = sum_j (alpha z_ij^+ / z_j^+ - beta z_ij^- / z_j^-) R_j`` with
    ``alpha - beta = 1`` (the paper's ViT search uses alpha 2, beta 1).

    Parameters
    ----------
    alpha, beta: float
        Weights of the positive and negative parts.
    stabilizer: float
        Added to the denominators with their sign.
    """
    def __init__(self, alpha: float = 2.0, beta: float = 1.0, stabilizer: float = 1e-6):
        from zennit.rules import AlphaBeta as ZennitAlphaBeta

        super().__init__(ZennitAlphaBeta(alpha=alpha, beta=beta, stabilizer=stabilizer))
        self.alpha, self.beta, self.stabilizer = alpha, beta, stabilizer

    def __repr__(self) -> str:
        return f'AlphaBeta({self.alpha!r}, {self.beta!r}' + (
            ')' if self.stabilizer == 1e-6 else f', stabilizer={self.stabilizer!r})')
