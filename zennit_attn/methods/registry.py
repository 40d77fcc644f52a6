"""The attribution methods behind ``explain(..., method=NAME)``, one implementation each for every modality, and their
registry :py:data:`METHODS`.

Each method is a function ``(task, position, target, **params) -> explanation`` registered with the
:py:func:`method` decorator, which records what :py:func:`~zennit_attn.explain` and the command line need to know
about it (a :py:class:`Method`): whether it runs a backward pass (``checkpointing=True`` applies), whether it is one
forward and one backward pass carrying relevance (``latent=`` and ``condition=`` work), whether it can explain a
:py:class:`~zennit_attn.latent.Neuron`, whether it is LRP (``composite=``), and its hyperparameters with their
defaults and checks. :py:func:`check_params` validates parameters without a model.

``task`` is a :py:class:`~zennit_attn.inputs.task.Task` (:py:class:`~zennit_attn.inputs.task.TokenTask` for language models,
:py:class:`~zennit_attn.inputs.task.ImageTask` for vision transformers), which decides what the input is (word embeddings,
pixels), what a token is, and how the result is packaged, so that every method explains exactly the same logit.
Hyperparameters have the defaults of the paper's appendix A.1 (Achtibat et al., ICML 2024); each method's
documentation states its cost in forward/backward passes. Implementations of zennit (Integrated Gradients,
SmoothGrad) and captum (KernelSHAP) are reused where they exist.

Methods that read attention probabilities (the rollouts, Grad-CAM) run the model once with eager attention (see
:py:mod:`zennit_attn.methods.attention`); token-level methods (rollout, Grad-CAM, AtMan) give an image's pixels the value of
their patch.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from captum.attr import KernelShap
from zennit.attribution import IntegratedGradients, SmoothGrad
from zennit.core import Composite

from ..engine.composites import AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma
from ..inputs.objectives import OutputFunction
from ..inputs.task import ImageTask, Task
from .attention import attention_maps, discard, rollout, suppress_keys
from .lrp import attribute

__all__ = ['Method', 'METHODS', 'method', 'check_params', 'Selected']

#: A parameter check: ``(value, name) -> value`` (normalised), raising a ValueError that names the parameter.
Check = Callable[[Any, str], Any]


# ----------------------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Method:
    """One attribution method of :py:data:`METHODS` and what is known about it.

    Attributes
    ----------
    name: str
        The name ``explain(..., method=name)`` takes.
    function: callable
        ``function(task, position, target, **params)``, returning the task's explanation; it trusts its
        parameters (call the method itself, ``METHODS[name](task, ...)``, to have them checked first).
    backward: bool
        It runs a backward pass: ``checkpointing=True`` applies.
    latent: bool
        It is one forward and one backward pass whose gradient times activation is relevance at every tensor:
        ``latent=`` and ``condition=`` work with it.
    neuron: bool
        It reads the explained value through the task, so it can explain a
        :py:class:`~zennit_attn.latent.Neuron` target.
    lrp: bool
        It is LRP and takes ``composite=`` (a zennit composite; default chosen by the method for the modality).
    params: mapping
        Hyperparameter name -> default (``composite`` not included).
    """

    name: str
    function: Callable
    backward: bool
    latent: bool
    neuron: bool
    lrp: bool
    params: Mapping[str, Any]
    checks: Mapping[str, Check] = field(repr=False, compare=False)

    def check(self, params: Mapping[str, Any]) -> dict:
        """``params`` checked and normalised (integers as int, reals as float); see :py:func:`check_params`."""
        if not isinstance(params, Mapping):
            raise TypeError(
                f'the parameters of {self.name} must be a mapping of name to value, got {type(params).__name__}'
            )
        params = dict(params)
        composite = params.pop('composite', None)
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            takes = ', '.join(self.params) or 'none'
            hint = '; configure LRP through composite=' if self.lrp else ''
            raise TypeError(f'{self.name} takes no parameter(s) {unknown}; it takes {takes}{hint}')
        checked = {name: self.checks[name](value, name) for name, value in params.items()}
        if composite is not None:
            if not self.lrp:
                raise ValueError(
                    f'composite= applies to the LRP methods '
                    f'({", ".join(name for name, entry in METHODS.items() if entry.lrp)}), not to '
                    f'{self.name!r}'
                )
            if not isinstance(composite, Composite):
                raise TypeError(
                    f'composite must be a zennit Composite (e.g. zennit_attn.engine.composites.AttnLRPEpsilon()), '
                    f'got {type(composite).__name__}'
                )
            checked['composite'] = composite
        return checked

    def __call__(self, task: Task, position=-1, target=None, **params):
        """Run the method on ``task`` with checked ``params``."""
        return self.function(task, position=position, target=target, **self.check(params))


#: Every method :py:func:`~zennit_attn.explain` accepts, by name, in the order of the paper's tables.
METHODS: dict[str, Method] = {}


def method(
    name: str, *, backward: bool, latent: bool = False, neuron: bool = False, lrp: bool = False, **checks: Check
) -> Callable[[Callable], Callable]:
    """Register the decorated function in :py:data:`METHODS` under ``name`` (as zennit registers composites).

    Parameters
    ----------
    name: str
    backward, latent, neuron, lrp: bool
        As the attributes of :py:class:`Method`.
    **checks
        One check per hyperparameter of the function (its keyword parameters after ``task, position, target``,
        besides ``composite``): ``check(value, name) -> value``, raising a ValueError that names the parameter.

    Returns
    -------
    callable
        The decorator; it returns the function unchanged.
    """

    def register(function: Callable) -> Callable:
        if name in METHODS:
            raise ValueError(f'a method named {name!r} is already registered')
        parameters = list(inspect.signature(function).parameters.values())
        if [parameter.name for parameter in parameters[:3]] != ['task', 'position', 'target']:
            raise TypeError(f'{function.__name__} must take (task, position, target, ...)')
        params = {parameter.name: parameter.default for parameter in parameters[3:] if parameter.name != 'composite'}
        if lrp != any(parameter.name == 'composite' for parameter in parameters):
            raise TypeError(f'{function.__name__}: lrp={lrp}, but it takes composite= {"not " * lrp}')
        if set(checks) != set(params):
            raise TypeError(
                f'{function.__name__}: a check for each of its parameters {sorted(params)} is needed, '
                f'got checks for {sorted(checks)}'
            )
        METHODS[name] = Method(
            name, function, backward, latent, neuron, lrp, MappingProxyType(params), MappingProxyType(dict(checks))
        )
        return function

    return register


def check_params(name: str, params: Mapping[str, Any]) -> dict:
    """Validate the names and values of the hyperparameters ``params`` of the method ``name``, without a model.

    Parameters
    ----------
    name: str
        A key of :py:data:`METHODS`.
    params: mapping
        Parameter name -> value; ``composite`` is accepted by the LRP methods.

    Returns
    -------
    dict
        The parameters checked and normalised (integers as int, reals as float); defaults are not added.

    Raises
    ------
    ValueError
        For an unknown method, a value out of its range or of the wrong kind (the message names the parameter),
        or ``composite`` given to a method that is not LRP.
    TypeError
        For a parameter the method does not take, or a composite that is not a zennit composite.
    """
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f'Unknown method {name!r}; known: {", ".join(METHODS)}')
    return METHODS[name].check(params)


# ----------------------------------------------------------------------------------------------------------- checks
def positive(value, name: str) -> int:
    """A positive integer parameter."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    return int(value)


def between(low: float, high: float) -> Check:
    """The check of a finite real parameter in ``[low, high]`` (a bound may be infinite; the value may not)."""
    bounds = (
        f'in [{low}, {high}]'
        if math.isfinite(low) and math.isfinite(high)
        else f'>= {low}'
        if math.isfinite(low)
        else f'<= {high}'
        if math.isfinite(high)
        else ''
    )

    def check(value, name: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            raise ValueError(f'{name} must be a finite number {bounds}'.rstrip() + f', got {value!r}')
        return float(value)

    return check


def one_of(*options: str) -> Check:
    """The check of a parameter that takes one of ``options``."""

    def check(value, name: str) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValueError(f'{name} must be one of {", ".join(map(repr, options))}, got {value!r}')
        return value

    return check


def integer(value, name: str) -> int:
    """An integer parameter (of any sign)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f'{name} must be an integer, got {value!r}')
    return int(value)


def seed(value, name: str) -> int | None:
    """A random seed: an integer, or None for the global random state."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ValueError(f'{name} must be an integer or None, got {value!r}')
    return None if value is None else int(value)


def flag(value, name: str) -> bool:
    """A boolean parameter."""
    if not isinstance(value, bool):
        raise ValueError(f'{name} must be True or False, got {value!r}')
    return value


# ----------------------------------------------------------------------------------------------------------- helpers
def _rows(task: Task, count: int, row: int | None = None) -> torch.Tensor:
    """``rows`` for a batch of ``count`` elements: all variants of ``row``, or ``i % batch`` (row-major copies)."""
    device = task.inputs.device
    if row is not None:
        return torch.full((count,), row, dtype=torch.long, device=device)
    return torch.arange(count, device=device) % task.batch


class Selected(torch.nn.Module):
    """The explained logit of a resolved task as a module on its inputs (for zennit's and captum's attributors); a
    batch of ``k`` times the task's batch holds ``k`` stacked copies of the input rows, or, with ``row``, variants
    of that one row."""

    def __init__(self, task: Task, row: int | None = None):
        super().__init__()
        self.task, self.row = task, row

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        rows = _rows(self.task, inputs.shape[0], self.row)
        return self.task.select(self.task.forward(inputs, rows), rows)


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device):
    """Fork the global random state (CPU and ``device``) and seed it; nothing when ``seed`` is None."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == 'cuda' else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


# ----------------------------------------------------------------------------------------------------------- methods
@method('attnlrp', backward=True, latent=True, neuron=True, lrp=True)
def attnlrp(task: Task, position=-1, target=None, composite: Composite | None = None):
    """AttnLRP (the paper's method): LRP with ``composite``, by default
    :py:class:`~zennit_attn.engine.composites.AttnLRPEpsilon` for language models and
    :py:class:`~zennit_attn.engine.composites.AttnLRPGamma` (the paper's ViT composite) for vision transformers. Cost: one
    forward and one backward pass."""
    if composite is None:
        composite = AttnLRPGamma() if isinstance(task, ImageTask) else AttnLRPEpsilon()
    return attribute(task, position, target, composite, 'attnlrp')


@method('cplrp', backward=True, latent=True, neuron=True, lrp=True)
def cplrp(task: Task, position=-1, target=None, composite: Composite | None = None):
    """CP-LRP (Ali et al. 2022): LRP with the attention probabilities and gates constant, by default
    :py:class:`~zennit_attn.engine.composites.CPLRPEpsilon` (language models) or
    :py:class:`~zennit_attn.engine.composites.CPLRPGamma` (vision transformers). Cost: one forward and one backward pass."""
    if composite is None:
        composite = CPLRPGamma() if isinstance(task, ImageTask) else CPLRPEpsilon()
    return attribute(task, position, target, composite, 'cplrp')


@method('input_x_gradient', backward=True, latent=True, neuron=True)
def input_x_gradient(task: Task, position=-1, target=None):
    """Gradient x input (Eq. 11 of the paper's appendix) at the input (word embeddings, pixels). Cost: one forward
    and one backward pass."""
    with torch.enable_grad():
        inputs = task.inputs.clone().requires_grad_(True)
        logit = task.resolve(task.forward(inputs), position, target)
        (grad,) = torch.autograd.grad(logit.sum(), inputs)
    return task.finish(inputs.detach() * grad, logit, 'input_x_gradient')


@method(
    'integrated_gradients', backward=True, neuron=True, steps=positive, baseline=between(-float('inf'), float('inf'))
)
def integrated_gradients(task: Task, position=-1, target=None, steps: int = 20, baseline: float = 0.0):
    """Integrated Gradients (Sundararajan et al. 2017) from a constant ``baseline`` input (default 0, the zero
    embedding or a black image), by zennit's :py:class:`zennit.attribution.IntegratedGradients` (right Riemann sum
    over ``steps`` points, the paper's Eq. of appendix A.1). Cost: ``steps`` forward and backward passes (plus one
    plain forward)."""
    logit = task.resolve_plain(position, target)
    attributor = IntegratedGradients(
        Selected(task), n_iter=steps, baseline_fn=lambda inputs: torch.full_like(inputs, baseline)
    )
    with torch.enable_grad():
        _, relevance = attributor(task.inputs.clone(), torch.ones_like)
    return task.finish(relevance, logit, 'integrated_gradients')


@method(
    'smoothgrad',
    backward=True,
    neuron=True,
    sigma=between(0.0, float('inf')),
    samples=positive,
    seed=seed,
    multiply_input=flag,
)
def smoothgrad(
    task: Task,
    position=-1,
    target=None,
    sigma: float = 0.1,
    samples: int = 20,
    seed: int | None = 0,
    multiply_input: bool = True,
):
    """SmoothGrad (Smilkov et al. 2017) by zennit's :py:class:`zennit.attribution.SmoothGrad`: the mean gradient
    over ``samples`` inputs with Gaussian noise of standard deviation ``sigma`` times the range (max - min) of each
    row's input (zennit's ``noise_level``; the paper uses ``sigma=0.1``; zennit's last sample is noise-free). With
    ``multiply_input`` (default) the mean gradient is multiplied by the input, a signed relevance like gradient x
    input; otherwise the gradient itself is returned. Cost: ``samples`` forward and backward passes (plus one plain
    forward)."""
    logit = task.resolve_plain(position, target)
    attributor = SmoothGrad(Selected(task), noise_level=sigma, n_iter=samples)
    with torch.enable_grad(), _seeded(seed, task.inputs.device):
        _, gradient = attributor(task.inputs.clone(), torch.ones_like)
    return task.finish(gradient * task.inputs if multiply_input else gradient, logit, 'smoothgrad')


@method('attention_rollout', backward=False, dt=between(0.0, 1.0))
def attention_rollout(task: Task, position=-1, target=None, dt: float = 1.0):
    """Attention rollout (Abnar & Zuidema 2020, appendix A.1): head-averaged attention maps, entries above the
    ``dt``-quantile discarded (``dt=1``, the paper's choice for LLMs, discards nothing), ``R = prod_l 0.5 (I + A_l)``
    (rows renormalised after discarding); the relevance of token ``j`` is the explained token's row of ``R``.
    Independent of the target. Cost: one forward pass with eager attention."""
    with torch.no_grad(), attention_maps(task, task.inputs) as (scores, attentions):
        logit = task.resolve(scores, position, target)
        maps = [discard(attention.mean(1), dt) for attention in attentions]
        relevance = task.attention_row(rollout(maps, normalize=True))
    return task.finish(task.token_relevance(relevance), logit, 'attention_rollout')


@method('grad_attention_rollout', backward=True, dt=between(0.0, 1.0))
def grad_attention_rollout(task: Task, position=-1, target=None, dt: float = 1.0):
    """Gradient x attention rollout, Chefer et al. 2021 ("generic attention-model explainability") for
    self-attention: ``A_l = mean_heads((dlogit/dA_l * A_l)^+)``, entries above the ``dt``-quantile discarded,
    ``R = prod_l (I + A_l)`` (no normalisation); the relevance of token ``j`` is the explained token's row of ``R``.
    Cost: one forward and one backward pass with eager attention (all attention maps kept)."""
    with torch.enable_grad():
        inputs = task.inputs.clone().requires_grad_(True)
        with attention_maps(task, inputs) as (scores, attentions):
            logit = task.resolve(scores, position, target)
            grads = torch.autograd.grad(logit.sum(), attentions, allow_unused=True)
    with torch.no_grad():
        maps = [
            discard((attention * (torch.zeros_like(attention) if grad is None else grad)).clamp(min=0).mean(1), dt)
            for attention, grad in zip(attentions, grads)
        ]
        relevance = task.attention_row(rollout(maps, normalize=False))
    return task.finish(task.token_relevance(relevance), logit, 'grad_attention_rollout')


@method('gradcam', backward=True, layer=integer)
def gradcam(task: Task, position=-1, target=None, layer: int = -1):
    """Grad-CAM for transformers as in Chefer et al. 2021 (the paper's baseline: "the last attention map weighted
    with the gradient"): per head the weight ``w_h`` is the mean gradient of the logit over the attention row of
    the explained token (the keys it may attend to), and the relevance of token ``j`` is
    ``max(0, mean_h w_h A_h[row, j])`` of ``layer`` (default the last). Cost: one forward and one backward pass with
    eager attention."""
    with torch.enable_grad():
        inputs = task.inputs.clone().requires_grad_(True)
        with attention_maps(task, inputs) as (scores, attentions):
            if not -len(attentions) <= layer < len(attentions):
                raise ValueError(
                    f'layer {layer} is out of range: {type(task.model).__name__} has {len(attentions)} attention layers'
                )
            logit = task.resolve(scores, position, target)
            attention = attentions[layer]
            (grad,) = torch.autograd.grad(logit.sum(), attention)
    with torch.no_grad():
        row = task.attention_row(attention)  # [batch, heads, tokens]
        row_grad = task.attention_row(grad)
        allowed = (row > 0).to(row.dtype)
        weights = (row_grad * allowed).sum(-1, keepdim=True) / allowed.sum(-1, keepdim=True).clamp(min=1)
        relevance = (weights * row).mean(1).clamp(min=0)
    return task.finish(task.token_relevance(relevance), logit, 'gradcam')


@method('atman', backward=False, p=between(0.0, 1.0), score=one_of('log_softmax', 'logit'), perturbation_batch=positive)
def atman(
    task: Task, position=-1, target=None, p: float = 1.0, score: str = 'log_softmax', perturbation_batch: int = 16
):
    """AtMan (Deb et al. 2023, appendix A.1): for each token ``i`` the pre-softmax attention scores of key ``i``
    are multiplied by ``1 - p`` in every layer and head, and the relevance of ``i`` is the drop of the explained
    score: ``R_i = s(x) - s(x | i suppressed)``. ``score='log_softmax'`` (default) uses the log-probability of the
    target, since AtMan relies on the softmax (the paper attributes AtMan with it, all other methods without);
    ``'logit'`` uses the logit. ``p=1.0`` is the paper's Wikipedia setting (0.7-0.9 on SQuAD). Keys are scaled
    by forward hooks on the key projections named in the family table. Tokens that cannot change the explained
    logit (after the explained position of a causal model, padding, an image's class token) get 0 without a pass.
    Cost: one forward pass per token, ``perturbation_batch`` perturbed inputs per forward pass.

    With a contrast (``explain(..., contrast=...)``) both scores give the same value (the log-softmax normaliser
    cancels in the difference). A target function receives the logits: it needs ``score='logit'`` (it may apply the
    log-softmax itself)."""
    if isinstance(task.objective, OutputFunction) and score == 'log_softmax':
        raise ValueError(
            "atman with a target function: its score='log_softmax' would hand the function "
            "log-probabilities instead of the logits; pass score='logit' (the function is then the "
            'score; it may apply log_softmax itself)'
        )

    def read(scores, rows=None):
        return task.select(scores.log_softmax(-1) if score == 'log_softmax' else scores, rows)

    current: list[torch.Tensor | None] = [None]
    device = task.inputs.device
    with torch.no_grad(), suppress_keys(task.model, lambda: current[0]):
        scores = task.forward(task.inputs)
        logit = task.resolve(scores, position, target)
        reference = read(scores)
        tokens = task.token_count()
        jobs = task.attributable_tokens().nonzero().tolist()
        relevance = torch.zeros(task.batch, tokens, dtype=reference.dtype, device=device)
        for start in range(0, len(jobs), perturbation_batch):
            chunk = jobs[start : start + perturbation_batch]
            rows = torch.tensor([row for row, _ in chunk], device=device)
            suppressed_tokens = torch.tensor([token for _, token in chunk], device=device)
            factor = torch.ones(len(chunk), tokens, dtype=task.inputs.dtype, device=device)
            factor[torch.arange(len(chunk), device=device), suppressed_tokens] = 1.0 - p
            current[0] = factor
            try:
                suppressed = read(task.forward(task.inputs[rows], rows), rows)
            finally:
                current[0] = None
            relevance[rows, suppressed_tokens] = reference[rows] - suppressed
    return task.finish(task.token_relevance(relevance), logit, 'atman')


@method('kernelshap', backward=False, neuron=True, samples=positive, perturbation_batch=positive, seed=seed)
def kernelshap(
    task: Task, position=-1, target=None, samples: int = 2000, perturbation_batch: int = 64, seed: int | None = 0
):
    """KernelSHAP (Lundberg & Lee 2017) by captum's :py:class:`captum.attr.KernelShap`, one feature per token (per
    patch of an image), absent features set to 0 (the zero embedding, black patches: the baseline of the
    perturbation metric); ``samples`` coalitions (captum's and the paper's default 2000). With a single feature (a
    one-token text, a one-patch image) its Shapley value is exactly ``f(x) - f(0)``, computed directly (there is no
    coalition to sample). Cost: ``samples`` forward passes per input row, ``perturbation_batch`` perturbed inputs
    per forward pass, plus a linear regression."""
    logit = task.resolve_plain(position, target)
    mask = task.feature_mask()
    flat = mask[0].flatten()
    features = int(flat.max()) + 1
    if 1 < features and samples <= features:
        raise ValueError(
            f'kernelshap: samples={samples} coalitions cannot determine the Shapley values of {features} '
            f'features (a linear model with {features + 1} coefficients): use samples > {features} '
            '(default 2000)'
        )
    if features == 1:
        with torch.no_grad():
            absent = task.select(task.forward(torch.zeros_like(task.inputs)))
            present = task.select(task.forward(task.inputs))
        relevance = task.feature_relevance((present - absent)[:, None].to(task.inputs.dtype))
        return task.finish(relevance, logit, 'kernelshap')
    # captum gives every entry of a feature the feature's value: read it at the feature's first entry
    first = torch.full((features,), flat.numel(), device=flat.device).scatter_reduce(
        0, flat, torch.arange(flat.numel(), device=flat.device), 'amin'
    )
    values = []
    for row in range(task.batch):
        with torch.no_grad(), _seeded(seed, task.inputs.device):
            attribution = KernelShap(Selected(task, row)).attribute(
                task.inputs[row : row + 1],
                baselines=0.0,
                feature_mask=mask,
                n_samples=samples,
                perturbations_per_eval=perturbation_batch,
                show_progress=False,
            )
        values.append(attribution.flatten(1)[0, first].to(task.inputs.dtype))
    relevance = task.feature_relevance(torch.stack(values))
    return task.finish(relevance, logit, 'kernelshap')


def _content_seed(seed: int, values: torch.Tensor) -> int:
    """A seed from ``seed`` and the bytes of ``values``: the same for the same input, another for another input."""
    digest = hashlib.sha256(str(seed).encode())
    digest.update(values.detach().cpu().contiguous().numpy().tobytes())
    return int.from_bytes(digest.digest()[:8], 'little') & (2**63 - 1)


@method('random', backward=False, neuron=True, seed=seed)
def random(task: Task, position=-1, target=None, seed: int | None = 0):
    """Standard normal relevance per input entry (the paper's random baseline; per token for language models).

    With an integer ``seed`` each row's values come from a generator seeded with ``seed`` and the row's content (its
    token ids without padding, or its pixels): reproducible, the same for a text alone or padded in a batch, and
    independent between different inputs, so that over a dataset the random orders are independent (one generator
    seeded alike for every input would give every text of one length the same order, and the faithfulness of
    "random" would measure that one order). None: the global random state. Cost: one plain forward pass (for the
    logit)."""
    logit = task.resolve_plain(position, target)
    shape = task.inputs.shape[:2] if task.inputs.dim() == 3 else task.inputs.shape
    if seed is None:
        relevance = torch.randn(shape, dtype=torch.float64)
    else:
        relevance = torch.zeros(shape, dtype=torch.float64)
        ids = getattr(task, 'input_ids', None)
        mask = getattr(task, 'attention_mask', None)
        for row in range(shape[0]):
            if ids is not None and ids.shape == shape:
                valid = torch.ones(shape[1], dtype=torch.bool) if mask is None else (mask[row] != 0).cpu()
                content = ids[row].cpu()[valid]
            else:
                valid, content = None, task.inputs[row]
            generator = torch.Generator().manual_seed(_content_seed(seed, content))
            if valid is None:
                relevance[row] = torch.randn(shape[1:], generator=generator, dtype=torch.float64)
            else:
                relevance[row, valid] = torch.randn(int(valid.sum()), generator=generator, dtype=torch.float64)
    return task.finish(relevance.to(device=task.inputs.device, dtype=task.inputs.dtype), logit, 'random')
