"""zennit's relevance rules (gamma, z+, alpha-beta) in the gradient convention: the ViT composites (appendix A.2.3,
B)."""

from __future__ import annotations

import torch
from zennit.core import BasicHook, ParamMod, RemovableHandle, RemovableHandleList, zero_wrap
from zennit.rules import AlphaBeta as ZennitAlphaBeta
from zennit.rules import Gamma as ZennitGamma
from zennit.rules import ZPlus as ZennitZPlus

from ..core.errors import UnsupportedModelError
from .base import GradientRule, stabilize, tensor_output


def _safe_divide(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator``, and 0 where the denominator is exactly 0."""
    return torch.where(denominator == 0, torch.zeros_like(numerator), numerator / denominator)


class _RelevanceRuleFunction(torch.autograd.Function):
    """Forward: return the module's precomputed output. Backward: ``g_in = rule(module, x, z * g_out) / x``, with the
    output ``z`` computed again from the saved input (``module.forward``, without hooks): a model may change the output
    in place after the module (Twins' ``x += cnn_feat_token``, FastViT's ``out += rc(x)``), which a saved output would
    refuse in the backward pass; and only the input is kept, as the plain pass keeps it."""

    @staticmethod
    def forward(ctx, input, output, module, rule):
        ctx.save_for_backward(input.detach())
        ctx.module, ctx.rule = module, rule
        return output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        with torch.no_grad():
            output = ctx.module.forward(input).to(input.dtype)
        relevance_in = ctx.rule.relevance(ctx.module, input, output, output * grad_output.to(input.dtype))
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
    forward hook runs before hooks registered earlier (a latent site recorded or steered at the module's output), so
    those still act on the gradient before it reaches the rule. The parameters of the module get no gradient through
    a hooked module. The modified parameters are computed from the rule's parameter modifiers and passed to the
    recomputation (:py:meth:`relevance`); the module keeps its own parameter objects, with zennit 0.5.1 and 1.0
    alike.

    Parameters
    ----------
    rule: zennit.core.BasicHook
        The zennit rule; only its modifier functions are used (not its state), so one instance may be shared.
    """

    def __init__(self, rule):
        super().__init__()
        if not isinstance(rule, BasicHook):
            raise TypeError(f'RelevanceRule needs a zennit.core.BasicHook rule, got {type(rule).__name__}')
        self.rule = rule

    def __repr__(self) -> str:
        return (
            f'RelevanceRule({type(self.rule).__module__}.{type(self.rule).__name__}(...))'
            if type(self) is RelevanceRule
            else super().__repr__()
        )

    def register(self, module: torch.nn.Module) -> RemovableHandleList:
        return RemovableHandleList(
            [
                RemovableHandle(self),
                module.register_forward_hook(self._forward_hook, prepend=True, with_kwargs=True),
            ]
        )

    def forward(self, module, input, output):
        output = tensor_output(module, output)
        if len(input) != 1 or not isinstance(input[0], torch.Tensor):
            raise TypeError(
                f'{type(self).__name__} needs a module with one tensor input; {type(module).__name__} '
                f'was called with {len(input)} inputs'
            )
        if not (input[0].requires_grad and input[0].is_floating_point()):
            return None
        _check_linear_in_weight(module, input[0], self)
        return _RelevanceRuleFunction.apply(input[0], output, module, self)

    def relevance(
        self, module: torch.nn.Module, input: torch.Tensor, output: torch.Tensor, relevance: torch.Tensor
    ) -> torch.Tensor:
        """The zennit rule's input relevance of ``module`` at ``input`` (its ``output`` there, kept from the forward
        pass) for the output ``relevance``.

        The module's forward runs once per input modifier of the rule, with the parameters that the matching
        parameter modifier gives (:py:func:`modified_parameters`), passed to :py:func:`torch.func.functional_call`:
        the module keeps its own parameter objects (their identity, ``requires_grad``, ties to other modules),
        whatever zennit's ``ParamMod`` context would do (zennit 1.0 replaces them by new ones).
        """
        inputs, outputs = [], []
        runner = _Forward(module)
        for in_mod, param_mod, out_mod in zip(
            self.rule.input_modifiers, self.rule.param_modifiers, self.rule.output_modifiers
        ):
            modified_input = in_mod(input).detach().requires_grad_()
            parameters = {
                f'module.{name}': tensor
                for name, tensor in modified_parameters(ParamMod.ensure(param_mod), module).items()
            }
            with torch.enable_grad():
                outputs.append(out_mod(torch.func.functional_call(runner, parameters, (modified_input,))))
            inputs.append(modified_input)
        grad_outputs = self.rule.gradient_mapper(relevance, outputs)
        with torch.enable_grad():
            gradients = torch.autograd.grad(outputs, inputs, grad_outputs=grad_outputs, allow_unused=True)
        gradients = [torch.zeros_like(x) if grad is None else grad for x, grad in zip(inputs, gradients)]
        return self.rule.reducer(inputs, gradients).detach()


#: The forward of torch's linear and convolution modules: linear in the weight, which a rule may modify.
_LINEAR_FORWARDS = frozenset(
    klass.forward for klass in (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
)
#: ``forward function -> whether the output is linear in the weight``, found once per forward in a process
_LINEAR_IN_WEIGHT: dict = {}


def _check_linear_in_weight(module: torch.nn.Module, input: torch.Tensor, rule: RelevanceRule) -> None:
    """Refuse a module whose output is not linear in its weight (a weight-standardised convolution: BiT's
    ``WeightStandardizedConv2d``, timm's ``StdConv2d``, which standardise whatever weight they are given), for a rule
    that re-runs the module with a modified weight (:py:meth:`RelevanceRule.relevance`): the standardisation undoes
    the modification, and the rule's denominators lose their sign (the gamma rule gave a tiny BiT relevance of
    4.5e15 for logits of 0.16). Found once per forward function, on the module's input: without the bias, the output
    for the doubled weight must be twice the output.

    Raises
    ------
    UnsupportedModelError
        Naming the module and what to do.
    """
    forward = getattr(type(module).forward, '__func__', type(module).forward)
    weight = getattr(module, 'weight', None)
    if forward in _LINEAR_FORWARDS or not isinstance(weight, torch.Tensor):
        return
    linear = _LINEAR_IN_WEIGHT.get(forward)
    if linear is None:
        runner = _Forward(module)
        others = {
            f'module.{name}': torch.zeros_like(tensor)
            for name, tensor in module.named_parameters(recurse=False)
            if name != 'weight'
        }
        probe = (input.detach(),)
        # the rule's probe, not the model's: the classifying mode need not see it
        with torch.no_grad(), torch._C.DisableTorchFunction():
            once = torch.func.functional_call(runner, {'module.weight': weight.detach(), **others}, probe)
            twice = torch.func.functional_call(runner, {'module.weight': 2 * weight.detach(), **others}, probe)
        scale = float(once.abs().max()) or 1.0
        linear = _LINEAR_IN_WEIGHT[forward] = float((twice - 2 * once).abs().max()) <= 1e-4 * scale
    if not linear:
        raise UnsupportedModelError(
            f'{type(module).__name__} computes its output from a transformed weight (doubling its weight does not '
            f'double its output: a weight-standardised convolution), and {type(rule).__name__} re-runs it with a '
            'modified weight, which the transformation undoes: give it the epsilon rule (e.g. '
            'AttnLRPGamma(conv=Epsilon()), or the CP-LRP/AttnLRP epsilon composites)'
        )


def modified_parameters(modifier: ParamMod, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``{name: modified tensor}`` of the parameters of ``module`` (not of its submodules) that the zennit parameter
    modifier ``modifier`` changes, as its context manager would set them (zennit 0.5.1 and 1.0 alike), without
    touching ``module``.

    Parameters named in ``modifier.param_keys`` (all of the module's own parameters for None) are passed through
    ``modifier.modifier(tensor, name)``, those in ``modifier.zero_params`` are zeros (zennit's ``zero_wrap``);
    parameters that are None are left out. The modifier gets the parameter's data (no gradient).

    Parameters
    ----------
    modifier: zennit.core.ParamMod
        The parameter modifier of a zennit rule (``ParamMod.ensure`` makes one of a plain function).
    module: torch.nn.Module

    Returns
    -------
    dict[str, torch.Tensor]

    Raises
    ------
    RuntimeError
        If ``modifier.require_params`` is set and ``module`` has no attribute of a name in ``param_keys`` (as zennit).
    """
    keys = modifier.param_keys
    if keys is None:
        keys = [name for name, _ in module.named_parameters(recurse=False)]
    missing = [key for key in keys if not hasattr(module, key)]
    if modifier.require_params and missing:
        raise RuntimeError(f'Module {module} requires missing parameters: {missing}')
    function = zero_wrap(modifier.zero_params or [])(modifier.modifier)
    modified = {}
    for key in keys:
        parameter = getattr(module, key, None)
        if parameter is not None:
            modified[key] = function(parameter.detach(), key)
    return modified


class _Forward(torch.nn.Module):
    """Runs ``module.forward`` (not ``module(...)``: the module's hooks, this rule's among them, stay out of the
    recomputation) as the forward of a module that holds it as ``module``, for
    :py:func:`torch.func.functional_call`."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module.forward(*args)


class Gamma(RelevanceRule):
    """Generalised gamma rule (appendix A.2.3, Eq. appendix-gamma-rule-general) for linear and convolution layers.

    With ``z_ij = W_ji x_i`` and ``z_j = sum_i z_ij + b_j`` (the bias is the contribution of a constant input 1):

    - ``z_j > 0``: ``R_i = sum_j (z_ij + gamma z_ij^+) / (z_j + gamma sum_k z_kj^+) R_j``,
    - ``z_j < 0``: ``R_i = sum_j (z_ij + gamma z_ij^-) / (z_j + gamma sum_k z_kj^-) R_j``,

    with ``(.)^+ = max(., 0)``, ``(.)^- = min(., 0)`` and the denominator stabilised by ``stabilizer * sign``
    (``z_j == 0`` passes nothing). Without bias the rule conserves relevance. ``gamma = 0`` is the epsilon rule,
    ``gamma -> inf`` the z+ rule. On a ``torch.nn.Linear`` in closed form (:py:meth:`relevance`), on other modules by
    zennit's ``zennit.rules.Gamma`` through :py:class:`RelevanceRule`.

    Parameters
    ----------
    gamma: float
        Weight of the same-signed contributions (>= 0).
    stabilizer: float
        Added to the denominator with its sign.
    """

    def __init__(self, gamma: float = 0.25, stabilizer: float = 1e-6):
        if gamma < 0:
            raise ValueError(f'gamma must be >= 0, got {gamma}')
        super().__init__(ZennitGamma(gamma=gamma, stabilizer=stabilizer))
        self.gamma, self.stabilizer = gamma, stabilizer

    def relevance(
        self, module: torch.nn.Module, input: torch.Tensor, output: torch.Tensor, relevance: torch.Tensor
    ) -> torch.Tensor:
        """The input relevance: in closed form for a ``torch.nn.Linear`` (its forward, ``F.linear``), by zennit's
        rule (:py:meth:`RelevanceRule.relevance`, the module run once per modifier) for other modules.

        With ``|W| |x| + |b| = z^+ - z^-`` and ``z = z^+ + z^-`` (``z^+ = W^+ x^+ + W^- x^- + b^+``, ``z^-`` the
        rest), the two cases of the rule are ``s^+ = [z > 0] R / (z + gamma z^+)`` and ``s^- = [z < 0] R / (z + gamma
        z^-)`` (stabilised), and

            ``R_in = (1 + gamma / 2) x * W^T (s^+ + s^-) + (gamma / 2) |x| * |W|^T (s^+ - s^-)``

        (``x^+ W^+ + x^- W^-`` and ``x^+ W^- + x^- W^+`` written with ``x``, ``|x|``, ``W``, ``|W|``): three matrix
        products (the output is the forward pass's) instead of zennit's five forward passes and their backward pass;
        equal to zennit's to rounding (``tests/composites/test_gamma.py``).
        """
        if type(module).forward is not torch.nn.Linear.forward:
            return super().relevance(module, input, output, relevance)
        weight, bias = module.weight.detach(), None if module.bias is None else module.bias.detach()
        magnitude = torch.nn.functional.linear(input.abs(), weight.abs(), None if bias is None else bias.abs())
        positive = (output + magnitude) / 2
        negative = output - positive
        zero = torch.zeros((), dtype=output.dtype, device=output.device)
        above = torch.where(output > 0, relevance / stabilize(output + self.gamma * positive, self.stabilizer), zero)
        below = torch.where(output < 0, relevance / stabilize(output + self.gamma * negative, self.stabilizer), zero)
        plain = input * torch.matmul(above + below, weight)
        signed = input.abs() * torch.matmul(above - below, weight.abs())
        return (1 + self.gamma / 2) * plain + (self.gamma / 2) * signed

    def __repr__(self) -> str:
        return (
            f'Gamma({self.gamma!r})'
            if self.stabilizer == 1e-6
            else f'Gamma({self.gamma!r}, stabilizer={self.stabilizer!r})'
        )


class ZPlus(RelevanceRule):
    """z+ rule (appendix A.2.3, Eq. appendix-zplus-rule): ``R_i = sum_j z_ij^+ / sum_k z_kj^+ R_j``, positive
    contributions only (zennit's version: ``x^+ w^+ + x^- w^-``, the positive bias included in the denominator).

    Parameters
    ----------
    stabilizer: float
        Added to the denominator.
    """

    def __init__(self, stabilizer: float = 1e-6):
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
        super().__init__(ZennitAlphaBeta(alpha=alpha, beta=beta, stabilizer=stabilizer))
        self.alpha, self.beta, self.stabilizer = alpha, beta, stabilizer

    def __repr__(self) -> str:
        return f'AlphaBeta({self.alpha!r}, {self.beta!r}' + (
            ')' if self.stabilizer == 1e-6 else f', stabilizer={self.stabilizer!r})'
        )
