"""The attribution methods behind ``explain(..., method=NAME)``, one implementation each for every modality.

Each method is a function ``(task, position, target, **params) -> explanation`` registered in :py:data:`METHODS`;
``task`` is a :py:class:`~zennit_attn.task.Task` (:py:class:`~zennit_attn.task.TokenTask` for language models,
:py:class:`~zennit_attn.task.ImageTask` for vision transformers), which decides what the input is (word embeddings,
pixels), what a token is, and how the result is packaged, so that every method explains exactly the same logit.
Hyperparameters are keyword arguments with the defaults of the paper's appendix A.1 (Achtibat et al., ICML 2024),
checked with a :py:class:`ValueError` naming the parameter; each method's documentation states its cost in
forward/backward passes. Implementations of zennit (Integrated Gradients, SmoothGrad) and captum (KernelSHAP) are
reused where they exist.

Methods that read attention probabilities (the rollouts, Grad-CAM) run the model once with eager attention (see
:py:mod:`zennit_attn.attention`); token-level methods (rollout, Grad-CAM, AtMan) give an image's pixels the value of
their patch.
"""
from __future__ import annotations

import contextlib
import hashlib
import numbers
from typing import Callable

import torch
from captum.attr import KernelShap
from zennit.attribution import IntegratedGradients, SmoothGrad
from zennit.core import Composite

from .attention import attention_maps, discard, rollout, suppress_keys
from .lrp import attribute
from .task import Task

__all__ = ['METHODS', 'ALL_METHODS', 'BACKWARD_METHODS', 'Selected']


# ----------------------------------------------------------------------------------------------------------- helpers
def _count(value, name: str) -> int:
    """A positive integer parameter."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    return int(value)


def _within(value, name: str, low: float, high: float) -> float:
    """A real parameter in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not low <= value <= high:
        raise ValueError(f'{name} must be a number in [{low}, {high}], got {value!r}')
    return float(value)


def _seed(value) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ValueError(f'seed must be an integer or None, got {value!r}')
    return value


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
def attnlrp(task: Task, position=-1, target=None, composite: Composite | None = None):
    """AttnLRP (the paper's method): LRP with ``composite``, by default
    :py:class:`~zennit_attn.composites.AttnLRPEpsilon` for language models and
    :py:class:`~zennit_attn.composites.AttnLRPGamma` (the paper's ViT composite) for vision transformers. Cost: one
    forward and one backward pass."""
    return attribute(task, position, target, composite, 'attnlrp')


def cplrp(task: Task, position=-1, target=None, composite: Composite | None = None):
    """CP-LRP (Ali et al. 2022): LRP with the attention probabilities and gates constant, by default
    :py:class:`~zennit_attn.composites.CPLRPEpsilon` (language models) or
    :py:class:`~zennit_attn.composites.CPLRPGamma` (vision transformers). Cost: one forward and one backward pass."""
    return attribute(task, position, target, composite, 'cplrp')


def input_x_gradient(task: Task, position=-1, target=None):
    """Gradient x input (Eq. 11 of the paper's appendix) at the input (word embeddings, pixels). Cost: one forward
    and one backward pass."""
    with torch.enable_grad():
        inputs = task.inputs.clone().requires_grad_(True)
        logit = task.resolve(task.forward(inputs), position, target)
        (grad,) = torch.autograd.grad(logit.sum(), inputs)
    return task.finish(inputs.detach() * grad, logit, 'input_x_gradient')


def integrated_gradients(task: Task, position=-1, target=None, steps: int = 20, baseline: float = 0.0):
    """Integrated Gradients (Sundararajan et al. 2017) from a constant ``baseline`` input (default 0, the zero
    embedding or a black image), by zennit's :py:class:`zennit.attribution.IntegratedGradients` (right Riemann sum
    over ``steps`` points, the paper's Eq. of appendix A.1). Cost: ``steps`` forward and backward passes (plus one
    plain forward)."""
    steps = _count(steps, 'steps')
    baseline = _within(baseline, 'baseline', -float('inf'), float('inf'))
    logit = task.resolve_plain(position, target)
    attributor = IntegratedGradients(Selected(task), n_iter=steps,
                                     baseline_fn=lambda inputs: torch.full_like(inputs, baseline))
    with torch.enable_grad():
        _, relevance = attributor(task.inputs.clone(), torch.ones_like)
    return task.finish(relevance, logit, 'integrated_gradients')


def smoothgrad(task: Task, position=-1, target=None, sigma: float = 0.1, samples: int = 20, seed: int | None = 0,
               multiply_input: bool = True):
    """SmoothGrad (Smilkov et al. 2017) by zennit's :py:class:`zennit.attribution.SmoothGrad`: the mean gradient
    over ``samples`` inputs with Gaussian noise of standard deviation ``sigma`` times the range (max - min) of each
    row's input (zennit's ``noise_level``; the paper uses ``sigma=0.1``; zennit's last sample is noise-free). With
    ``multiply_input`` (default) the mean gradient is multiplied by the input, a signed relevance like gradient x
    input; otherwise the gradient itself is returned. Cost: ``samples`` forward and backward passes (plus one plain
    forward)."""
    samples = _count(samples, 'samples')
    sigma = _within(sigma, 'sigma', 0.0, float('inf'))
    logit = task.resolve_plain(position, target)
    attributor = SmoothGrad(Selected(task), noise_level=sigma, n_iter=samples)
    with torch.enable_grad(), _seeded(_seed(seed), task.inputs.device):
        _, gradient = attributor(task.inputs.clone(), torch.ones_like)
    return task.finish(gradient * task.inputs if multiply_input else gradient, logit, 'smoothgrad')


def attention_rollout(task: Task, position=-1, target=None, dt: float = 1.0):
    """Attention rollout (Abnar & Zuidema 2020, appendix A.1): head-averaged attention maps, entries above the
    ``dt``-quantile discarded (``dt=1``, the paper's choice for LLMs, discards nothing), ``R = prod_l 0.5 (I + A_l)``
    (rows renormalised after discarding); the relevance of token ``j`` is the explained token's row of ``R``.
    Independent of the target. Cost: one forward pass with eager attention."""
    dt = _within(dt, 'dt', 0.0, 1.0)
    with torch.no_grad():
        scores, attentions = attention_maps(task, task.inputs)
        logit = task.resolve(scores, position, target)
        maps = [discard(attention.mean(1), dt) for attention in attentions]
        relevance = task.attention_row(rollout(maps, normalize=True))
    return task.finish(task.token_relevance(relevance), logit, 'attention_rollout')


def grad_attention_rollout(task: Task, position=-1, target=None, dt: float = 1.0):
    """Gradient x attention rollout, Chefer et al. 2021 ("generic attention-model explainability") for
    self-attention: ``A_l = mean_heads((dlogit/dA_l * A_l)^+)``, entries above the ``dt``-quantile discarded,
    ``R = prod_l (I + A_l)`` (no normalisation); the relevance of token ``j`` is the explained token's row of ``R``.
    Cost: one forward and one backward pass with eager attention (all attention maps kept)."""
    dt = _within(dt, 'dt', 0.0, 1.0)
    with torch.enable_grad():
        inputs = task.inputs.clone().requires_grad_(True)
        scores, attentions = attention_maps(task, inputs)
        logit = task.resolve(scores, position, target)
        grads = torch.autograd.grad(logit.sum(), attentions, allow_unused=True)
    with torch.no_grad():
        maps = [
            discard((attention * (torch.zeros_like(attention) if grad is None else grad)).clamp(min=0).mean(1), dt)
            for attention, grad in zip(attentions, grads)
        ]
        relevance = task.attention_row(rollout(maps, normalize=False))
    return task.finish(task.token_relevance(relevance), logit, 'grad_attention_rollout')


def gradcam(task: Task, position=-1, target=None, layer: int = -1):
    """Grad-CAM for transformers as in Chefer et al. 2021 (the paper's baseline: "the last attention map weighted
    with the gradient"): per head the weight ``w_h`` is the mean gradient of the logit over the attention row of
    the explained token (the keys it may attend to), and the relevance of token ``j`` is
    ``max(0, mean_h w_h A_h[row, j])`` of ``layer`` (default the last). Cost: one forward and one backward pass with
    eager attention."""
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise ValueError(f'layer must be an integer, got {layer!r}')
    with torch.enable_grad():
        inputs = task.inputs.clone().requires_grad_(True)
        scores, attentions = attention_maps(task, inputs)
        if not -len(attentions) <= layer < len(attentions):
            raise ValueError(f'layer {layer} is out of range: {type(task.model).__name__} has {len(attentions)} '
                             'attention layers')
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


def atman(task: Task, position=-1, target=None, p: float = 1.0, score: str = 'log_softmax', batch_size: int = 16):
    """AtMan (Deb et al. 2023, appendix A.1): for each token ``i`` the pre-softmax attention scores of key ``i``
    are multiplied by ``1 - p`` in every layer and head, and the relevance of ``i`` is the drop of the explained
    score: ``R_i = s(x) - s(x | i suppressed)``. ``score='log_softmax'`` (default) uses the log-probability of the
    target, since AtMan relies on the softmax (the paper attributes AtMan with it, all other methods without);
    ``'logit'`` uses the logit. ``p=1.0`` is the paper's Wikipedia setting (0.7-0.9 on SQuAD). Keys are scaled
    by forward hooks on the key projections named in the family table. Tokens that cannot change the explained
    logit (after the explained position of a causal model, padding, an image's class token) get 0 without a pass.
    Cost: one forward pass per token, batched ``batch_size`` at a time."""
    if score not in ('log_softmax', 'logit'):
        raise ValueError(f"score must be 'log_softmax' or 'logit', got {score!r}")
    p = _within(p, 'p', 0.0, 1.0)
    batch_size = _count(batch_size, 'batch_size')

    def read(scores, rows=None):
        return task.select(scores.log_softmax(-1) if score == 'log_softmax' else scores, rows)

    current: list[torch.Tensor | None] = [None]
    device = task.inputs.device
    with torch.no_grad(), suppress_keys(task.model, lambda: current[0]):
        scores = task.forward(task.inputs)
        logit = task.resolve(scores, position, target)
        reference = read(scores)
        tokens = task.tokens()
        jobs = task.attributable_tokens().nonzero().tolist()
        relevance = torch.zeros(task.batch, tokens, dtype=reference.dtype, device=device)
        for start in range(0, len(jobs), batch_size):
            chunk = jobs[start:start + batch_size]
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


def kernelshap(task: Task, position=-1, target=None, samples: int = 2000, batch_size: int = 64,
               seed: int | None = 0):
    """KernelSHAP (Lundberg & Lee 2017) by captum's :py:class:`captum.attr.KernelShap`, one feature per token (per
    patch of an image), absent features set to 0 (the zero embedding, black patches: the baseline of the
    perturbation metric); ``samples`` coalitions (captum's and the paper's default 2000). Cost: ``samples`` forward
    passes per input row, ``batch_size`` at a time, plus a linear regression."""
    samples = _count(samples, 'samples')
    batch_size = _count(batch_size, 'batch_size')
    logit = task.resolve_plain(position, target)
    mask = task.feature_mask()
    flat = mask[0].flatten()
    # captum gives every entry of a feature the feature's value: read it at the feature's first entry
    first = torch.full((int(flat.max()) + 1,), flat.numel(), device=flat.device).scatter_reduce(
        0, flat, torch.arange(flat.numel(), device=flat.device), 'amin')
    values = []
    for row in range(task.batch):
        with torch.no_grad(), _seeded(_seed(seed), task.inputs.device):
            attribution = KernelShap(Selected(task, row)).attribute(
                task.inputs[row:row + 1], baselines=0.0, feature_mask=mask, n_samples=samples,
                perturbations_per_eval=batch_size, show_progress=False,
            )
        values.append(attribution.flatten(1)[0, first].to(task.inputs.dtype))
    relevance = task.feature_relevance(torch.stack(values))
    return task.finish(relevance, logit, 'kernelshap')


def _content_seed(seed: int, values: torch.Tensor) -> int:
    """A seed from ``seed`` and the bytes of ``values``: the same for the same input, another for another input."""
    digest = hashlib.sha256(str(seed).encode())
    digest.update(values.detach().cpu().contiguous().numpy().tobytes())
    return int.from_bytes(digest.digest()[:8], 'little') & (2 ** 63 - 1)


def random(task: Task, position=-1, target=None, seed: int | None = 0):
    """Standard normal relevance per input entry (the paper's random baseline; per token for language models).

    With an integer ``seed`` each row's values come from a generator seeded with ``seed`` and the row's content (its
    token ids without padding, or its pixels): reproducible, the same for a text alone or padded in a batch, and
    independent between different inputs, so that over a dataset the random orders are independent (one generator
    seeded alike for every input would give every text of one length the same order, and the faithfulness of
    "random" would measure that one order). None: the global random state. Cost: one plain forward pass (for the
    logit)."""
    logit = task.resolve_plain(position, target)
    seed = _seed(seed)
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


#: Every method :py:func:`~zennit_attn.explain` accepts, by name, in the order of the paper's tables.
METHODS: dict[str, Callable] = {
    'attnlrp': attnlrp,
    'cplrp': cplrp,
    'input_x_gradient': input_x_gradient,
    'integrated_gradients': integrated_gradients,
    'smoothgrad': smoothgrad,
    'attention_rollout': attention_rollout,
    'grad_attention_rollout': grad_attention_rollout,
    'gradcam': gradcam,
    'atman': atman,
    'kernelshap': kernelshap,
    'random': random,
}

#: The names of :py:data:`METHODS`.
ALL_METHODS: tuple[str, ...] = tuple(METHODS)

#: The methods that run a backward pass (``explain(..., checkpointing=True)`` applies to them).
BACKWARD_METHODS: tuple[str, ...] = ('attnlrp', 'cplrp', 'input_x_gradient', 'integrated_gradients', 'smoothgrad',
                                     'grad_attention_rollout', 'gradcam')
