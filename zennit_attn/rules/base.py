"""What the gradient rules share: the hook base class, the identity rule's autograd function and numerics."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
from collections.abc import Callable

import torch
from zennit.core import Hook, RemovableHandle, RemovableHandleList

from ..core.audit import sanction
from ..core.errors import UnsupportedModelError


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """Float32 for half-precision tensors, the tensors' own dtype otherwise."""
    dtype = functools.reduce(torch.promote_types, (tensor.dtype for tensor in tensors))
    return torch.float32 if torch.finfo(dtype).bits < 32 else dtype


def stabilize(tensor: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``tensor + epsilon * sign(tensor)`` with sign(0) = 1: the stabiliser of Eq. 5 and Eq. 8 (zennit's
    ``Stabilizer`` of a float)."""
    return tensor + epsilon * torch.where(tensor >= 0, 1.0, -1.0).to(tensor.dtype)


def _identity_gradient(input: torch.Tensor, output: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """The identity rule's gradient ``g_in = g_out * f(x) / x`` (0 where the ratio is not finite), computed in
    float32 at least."""
    dtype = compute_dtype(input, output, grad_output)
    ratio = torch.div(output.to(dtype), input.to(dtype)).nan_to_num_(0.0, 0.0, 0.0)
    return ratio.mul_(grad_output.to(dtype)).to(input.dtype)


class _ElementwiseIdentity(torch.autograd.Function):
    """Forward: return the precomputed ``output = f(input)``. Backward: ``g_in = g_out * f(x) / x``.

    This is the identity rule ``R_in = R_out`` (Eq. 9) written for the modified gradient: with
    ``R_out = f(x) g_out`` and ``R_in = x g_in``. Where ``x == 0`` no gradient can carry the relevance ``f(0) g_out``
    to ``x``: the gradient is 0 there (a non-finite ratio ``f(x) / x`` is set to 0 as well), and ``f(0)`` acts as a
    constant of the model (a bias). :py:func:`elementwise_identity` applies the rule from the first input of a chain
    of element-wise functions, so that this happens only where that input is 0, not where an inner function (ReLU)
    gives 0 to an outer one with ``f(0) != 0`` (sigmoid). The node keeps ``input`` (``source``) for that.
    """

    @staticmethod
    def forward(ctx, input, output):
        ctx.save_for_backward(input.detach(), output.detach())
        _hold_source(ctx, input)
        return output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        input, output = ctx.saved_tensors
        return _identity_gradient(input, output, grad_output), None


class _GradientMap(torch.autograd.Function):
    """Forward: ``input`` (its storage, not a view). Backward: ``function(g_out)``, or ``function(g_out, input)`` with
    ``input`` saved (``keep``). Not a view, so that a model may change the tensor in place: a hook on a view is dropped
    from the graph when the view is changed in place (``scores += bias``), and its rule with it."""

    @staticmethod
    def forward(ctx, input, function, keep):
        ctx.function = function
        if keep:
            ctx.save_for_backward(input.detach())
        return input.detach()

    @staticmethod
    def backward(ctx, grad_output):
        return ctx.function(grad_output, *ctx.saved_tensors), None, None


def contiguous_gradient(gradient: torch.Tensor) -> torch.Tensor:
    """``gradient`` in contiguous memory, for the gradient that reaches the output of a batch normalisation: torch's CPU
    backward of ``batch_norm`` with running statistics returns a wrong input gradient for a batch of one whose gradient
    is channels-last with a batch stride that is not ``C H W`` (torch 2.15; what ``x.flatten(2).transpose(1, 2)``
    after the norm sends back, as XCiT's and EfficientFormer's patch embeddings do: a bias-free ``conv -> BatchNorm2d
    -> flatten(2).transpose(1, 2) -> mean`` got gradient x input 3.4 times its output in float64, -1.37 in float32).
    The engine applies it to ``batch_norm`` (:py:func:`~zennit_attn.operations.elementwise.running_norm`), the
    gradient baselines to the outputs of batch normalisation modules."""
    return gradient.contiguous()


def gradient_map(tensor: torch.Tensor, function, with_value: bool = False) -> torch.Tensor:
    """``tensor`` whose gradient passes ``function`` on its way back (a rule in the gradient formulation), also where
    the model changes the returned tensor in place. With ``with_value``, ``function(gradient, value)`` gets the
    tensor's forward value, saved for the backward pass: where the model changed it in place since, torch's backward
    raises (the saved value would be wrong), never a silently wrong rule."""
    return _GradientMap.apply(tensor, function, with_value)


def scaled_gradient(tensor: torch.Tensor, factor) -> torch.Tensor:
    """``tensor`` with its gradient multiplied by ``factor`` (a number, or a tensor that broadcasts); detached for 0."""
    if isinstance(factor, (int, float)) and factor == 0:
        return tensor.detach()
    if isinstance(factor, (int, float)) and factor == 1:
        return tensor
    return gradient_map(tensor, lambda grad: grad * factor)


class _RecomputedIdentity(torch.autograd.Function):
    """:py:class:`_ElementwiseIdentity` for ``y = f(x)`` whose output is not kept for the backward pass: only ``input``
    is saved (the tensor the function's own graph saves in a plain pass, so that the rule holds no more activations
    than the plain gradient), and the backward pass computes ``compute(input)`` again (without gradients: the same
    operations on the same values, the same output) for ``g_in = g_out f(x) / x``. The model may then change the
    output in place after the function (``y = act(x); y += residual``), which a saved output would not allow.
    ``source`` is the first input of a chain of element-wise functions (see :py:func:`elementwise_identity`), from
    which the ratio is taken. The other tensors ``compute`` holds (``sigmoid(x)`` of ``x * sigmoid(x)``,
    :py:func:`_held`) are saved as well (references, no copies), so that torch refuses the backward pass where the
    model changed one in place since, as it refuses the plain pass; before, the output was computed again from the
    changed tensor (AttnLRP's relevance of ``y = x * g; g.mul_(3)`` three times that of ``x * g``)."""

    @staticmethod
    def forward(ctx, source, input, output, compute):
        ctx.save_for_backward(source.detach(), input.detach(), *(tensor.detach() for tensor in _held(compute)))
        ctx.compute = compute
        _hold_source(ctx, source)
        return output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        source, input = ctx.saved_tensors[:2]
        with torch.no_grad():
            output = ctx.compute(input)
        return _identity_gradient(source, output, grad_output), None, None, None


def _held(compute: Callable) -> list[torch.Tensor]:
    """The tensors among the bound arguments of ``compute`` (a :py:class:`functools.partial`; lists and tuples of them
    searched), which it reads when it computes an output again in the backward pass."""
    if not isinstance(compute, functools.partial):
        return []
    found, stack = [], [*compute.args, *compute.keywords.values()]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return found


class _RecomputedGate(_RecomputedIdentity):
    """:py:class:`_RecomputedIdentity` for the output of an activation: its autograd node marks the tensor as a gate, a
    constant factor for CP-LRP (see :py:mod:`zennit_attn.operations.graph`)."""


def module_output(module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> module.forward(x)`` as :py:class:`_RecomputedIdentity` computes a module's output again: without its
    hooks, with its own weights loaded where ``accelerate`` offloads them, on a copy where the module computes in
    place (its ``inplace`` flag may be back on by the time of the backward pass)."""
    return functools.partial(_module_forward, module)


def called_on_input_alone(args: tuple, kwargs: dict) -> bool:
    """Whether a module's call (the ``args`` and ``kwargs`` its forward pre-hook sees) is ``module(x)``, whose output
    :py:func:`module_output` computes again from ``x`` alone in the backward pass."""
    return len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor)


def _module_forward(module: torch.nn.Module, input: torch.Tensor) -> torch.Tensor:
    with loaded_weights(module):
        return module.forward(input.clone() if getattr(module, 'inplace', False) else input)


#: The autograd functions of the identity rule, whose nodes hold the ``source`` of a chain of element-wise functions.
_IDENTITY_FUNCTIONS = (_ElementwiseIdentity, _RecomputedIdentity)

#: The identity nodes made inside a :py:func:`released_sources` context (per thread and task), None outside one.
_HOLDERS: contextvars.ContextVar[list | None] = contextvars.ContextVar('zennit_attn_identity_sources', default=None)


def _hold_source(ctx, source: torch.Tensor) -> None:
    """Keep ``source`` on the identity node ``ctx`` for the chains of :py:func:`elementwise_identity` (noted for
    :py:func:`released_sources` inside one)."""
    ctx.source = source
    holders = _HOLDERS.get()
    if holders is not None:
        holders.append(ctx)


@contextlib.contextmanager
def released_sources():
    """Let the identity rule's autograd nodes made inside the context drop their reference to the first input of
    their chain (``source``) when it exits.

    The reference is needed only while the forward pass builds the chain (:py:func:`elementwise_identity`); the
    backward pass reads the tensors the nodes saved. Activation checkpointing
    (:py:func:`~zennit_attn.canonizers.checkpointing.checkpointed`) discards a block's saved tensors after its forward
    and recomputes them, but an attribute of a node would keep the tensor alive until the backward pass: the context
    around a checkpointed block's forward releases them, so that the block keeps no more than its inputs, as in a
    plain pass.
    """
    holders = []
    token = _HOLDERS.set(holders)
    try:
        yield
    finally:
        _HOLDERS.reset(token)
        for ctx in holders:
            ctx.source = None


class _GateIdentity(_ElementwiseIdentity):
    """:py:class:`_ElementwiseIdentity` for the output of an activation: its autograd node marks the tensor as a gate,
    a constant factor for CP-LRP (see :py:mod:`zennit_attn.operations.graph`)."""


#: How the engine reads the autograd nodes of the rules' own functions (by function): ``'gate'`` for the output of an
#: activation's identity rule (a gate of CP-LRP), ``'values'`` for a function whose output has the values of its first
#: input (another gradient, the same tensor: :py:func:`gradient_map`), ``'rescaled'`` for an element-wise rule whose
#: output is its input times a constant of the relevance pass (a normalisation's identity rule, Prop. 3.4, or a bound).
RULE_NODES = {
    _GateIdentity: 'gate',
    _GradientMap: 'values',
    _ElementwiseIdentity: 'rescaled',
    _RecomputedIdentity: 'rescaled',
    _RecomputedGate: 'gate',
}


def rule_node(node) -> str | None:
    """What the autograd ``node`` is among :py:data:`RULE_NODES` (None for any other node)."""
    return RULE_NODES.get(getattr(type(node), '_forward_cls', None))


def rule_input(node):
    """The autograd node of the tensor that the output of a rule's function (``node``, see :py:data:`RULE_NODES`) was
    computed from: its input, also where an identity rule applies from the first input of a chain of element-wise
    functions (:py:func:`elementwise_identity`, whose first argument is that chain's input)."""
    inputs = node.next_functions
    if issubclass(getattr(type(node), '_forward_cls', type(None)), _RecomputedIdentity):
        return inputs[1][0]
    return getattr(node, 'immediate', None) or (inputs[0][0] if inputs else None)


def elementwise_identity(
    input: torch.Tensor,
    output: torch.Tensor,
    gate: bool = False,
    compute: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Return ``output`` (computed element-wise from ``input``) such that the identity rule (Eq. 9) applies;
    ``gate`` marks the output of an activation (as opposed to a normalisation). With ``compute`` (``output =
    compute(input)``, the same function again; a module's: :py:func:`module_output`), ``output`` is not saved for the
    backward pass but computed again there (:py:class:`_RecomputedIdentity`): the rule keeps the activations of a
    plain pass, and the model may change ``output`` in place after it (``y = act(x); y += r``, which a saved output
    would make autograd refuse).

    Where ``input`` is itself the output of the identity rule on ``x0`` (``f(g(x0))``, unchanged since), the rule
    applies from ``x0`` to ``output`` at once: the identity rule of the composed element-wise function. This is the
    same gradient as the two rules one after the other (``f(y) / y * g(x0) / x0`` with ``y = g(x0)``) wherever
    ``y != 0``, and keeps the relevance ``f(0) g`` where ``y == 0`` (``sigmoid(relu(x))``), which a chain of ratios
    loses.
    """
    source, node = input, input.grad_fn  # the node of a function's output; changed in place since, another one
    if issubclass(getattr(type(node), '_forward_cls', type(None)), _IDENTITY_FUNCTIONS) and node.source is not None:
        source = node.source
    if compute is not None:
        result = (_RecomputedGate if gate else _RecomputedIdentity).apply(source, input, output.detach(), compute)
    else:
        result = (_GateIdentity if gate else _ElementwiseIdentity).apply(source, output.detach())
        if source is not input and result.requires_grad:  # what it is computed from in the chain (the engine's marks)
            result.grad_fn.immediate = input.grad_fn
    return result


def layer_norm_identity(
    input: torch.Tensor, dims: int, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """LayerNorm over the last ``dims`` dimensions with the standard deviation a constant: the identity rule on
    ``x / g(x)`` (Prop. 3.4), the mean subtraction and the affine part linear. Computed in float32 at least."""
    axes = tuple(range(-dims, 0))
    dtype = compute_dtype(input)
    x = input.to(dtype)
    centered = x - x.mean(axes, keepdim=True)
    variance = centered.detach().pow(2).mean(axes, keepdim=True)
    result = centered * torch.rsqrt(variance + eps)
    if weight is not None:
        result = result * weight.to(dtype)
    if bias is not None:
        result = result + bias.to(dtype)
    return result.to(input.dtype).contiguous()  # as torch's layer_norm returns it (models view its output)


@contextlib.contextmanager
def loaded_weights(module: torch.nn.Module):
    """Load ``module``'s own weights for the time of the context where ``accelerate`` offloads them (CPU or disk
    offload: on the meta device except during the module's forward, which our forward hooks run after).

    Uses the offloading hook's own ``pre_forward`` (load) and ``post_forward`` (offload again); nothing happens for
    modules without an ``accelerate`` hook or without meta weights.
    """
    hook = module.__dict__.get('_hf_hook')  # accelerate sets it as a plain attribute
    if hook is None or not any(tensor.is_meta for tensor in module.parameters(recurse=False)):
        yield
        return
    hook.pre_forward(module)
    try:
        yield
    finally:
        hook.post_forward(module, None)


class GradientRule(Hook):
    """Base class of the rules that act by a forward hook on the module's output.

    Subclasses implement :py:meth:`forward` and return a replacement output (or None to keep the output).
    Registering needs no input wrapping, so these rules add no memory to the backward pass beyond what they
    state. The hook runs before the forward hooks registered earlier (a user's hook on a normalisation, a latent site
    recorded or steered at the module's output): the rule replaces the module's own output, and what those hooks
    change afterwards the engine sees (:py:mod:`zennit_attn.core.audit`). The replacement is sanctioned to the
    engine's audit as computed from the module's output.
    """

    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        return RemovableHandleList(
            [
                RemovableHandle(self),
                module.register_forward_hook(self._forward_hook, prepend=True, with_kwargs=True),
            ]
        )

    def _forward_hook(self, module, args, kwargs, output):
        if not self.active:
            return None
        # the rule's own operations are not the model's: the classifying mode neither classifies them nor guards the
        # gradient hooks they register (the rule's output is sanctioned to its audit below)
        with loaded_weights(module), torch._C.DisableTorchFunction():
            result = self.forward(module, module_inputs(module, args, kwargs), output)
        if result is not None:
            sanction(result, output)
        return result

    def forward(self, module, input, output):
        """Return a replacement output with the rule's backward, or None."""
        return None

    def copy(self):
        duplicate = copy.copy(self)
        Hook.__init__(duplicate)
        return duplicate


def module_inputs(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple:
    """The arguments ``module`` was called with, in the order of its forward's parameters: ``args``, and the keyword
    arguments bound to their parameters (``act(input=x)``, ``norm(hidden_states=x)``: the input is the first either
    way)."""
    if not kwargs:
        return args
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except (TypeError, ValueError):  # no signature to bind to: the keyword arguments after the positional ones
        return (*args, *kwargs.values())
    return tuple(bound.arguments.values())


def tensor_output(module: torch.nn.Module, output) -> torch.Tensor:
    if not isinstance(output, torch.Tensor):
        raise UnsupportedModelError(
            f'{type(module).__name__} returned {type(output).__name__}; this rule needs a module with a single '
            'tensor output'
        )
    return output
