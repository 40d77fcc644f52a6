"""Baseline attribution methods behind ``explain(..., method=NAME)``, all explaining the same logit as AttnLRP.

Each method is a function ``(task, position, target, **params) -> Explanation`` registered in
:py:data:`METHODS`; ``task`` is a :py:class:`~zennit_attn.explain.Task`. Hyperparameters are keyword arguments
with the defaults of the paper's appendix A.1 (Achtibat et al., ICML 2024); each method's documentation states
its cost in forward/backward passes. Implementations of zennit (Integrated Gradients, SmoothGrad) and captum
(KernelSHAP) are reused where they exist.

Methods that read attention probabilities (the rollouts, Grad-CAM) run the model once with
``attn_implementation='eager'`` and ``output_attentions=True`` (switched for the call and restored after).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from .explain import Explanation, Task, _scores
from .types import norm_kind


# ----------------------------------------------------------------------------------------------------------- helpers
def _finish(task: Task, relevance: torch.Tensor, logit: torch.Tensor) -> Explanation:
    """Zero padding positions and package the explanation."""
    if task.attention_mask is not None:
        mask = (task.attention_mask != 0).to(relevance.dtype)
        relevance = relevance * (mask[..., None] if relevance.dim() == 3 else mask)
    return task.explanation(relevance.detach(), logit.detach())


def _rows(task: Task, count: int, row: int | None = None) -> torch.Tensor:
    """``rows`` for a batch of ``count`` elements: all variants of ``row``, or ``i % batch`` (row-major copies)."""
    device = task.embeddings.device
    if row is not None:
        return torch.full((count,), row, dtype=torch.long, device=device)
    return torch.arange(count, device=device) % task.batch


class _Selected(torch.nn.Module):
    """The explained logit as a module on the input embeddings (for zennit's attributors); a batch of ``k``
    times the task's batch holds ``k`` stacked copies of the input rows."""
    def __init__(self, task: Task):
        super().__init__()
        self.task = task

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        rows = _rows(self.task, embeddings.shape[0])
        return self.task.select(self.task.forward(embeddings, rows), rows)


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


def _configs(model: torch.nn.Module) -> list:
    configs = {}
    for module in model.modules():
        config = getattr(module, 'config', None)
        if config is not None and hasattr(config, '_attn_implementation'):
            configs[id(config)] = config
            for sub in ('text_config', 'vision_config'):
                nested = getattr(config, sub, None)
                if nested is not None and hasattr(nested, '_attn_implementation'):
                    configs[id(nested)] = nested
    return list(configs.values())


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module):
    """Switch every configuration in ``model`` to ``attn_implementation='eager'`` (attention probabilities are
    materialised and returned with ``output_attentions=True``) and restore the previous implementation after."""
    configs = _configs(model)
    saved = [config._attn_implementation for config in configs]
    try:
        for config in configs:
            config._attn_implementation = 'eager'
        yield model
    finally:
        for config, value in zip(configs, saved):
            config._attn_implementation = value


def attention_maps(task: Task, embeddings: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run the task's model on ``embeddings`` (one per input row) with eager attention and return the scores
    and the attention probabilities of every layer, ``[batch, heads, seq, seq]`` each, in the autograd graph."""
    with eager_attention(task.model):
        output = task.model(inputs_embeds=embeddings, **task.model_kwargs, output_attentions=True)
    attentions = getattr(output, 'attentions', None)
    if not attentions or any(attention is None for attention in attentions):
        raise TypeError(f'{type(task.model).__name__} returned no attention probabilities with output_attentions=True')
    return _scores(output), tuple(attentions)


def _query_positions(task: Task) -> torch.Tensor:
    """The query position whose attention row is read: the explained position; for 2-D outputs (classification
    heads) the last non-padding token of causal models and the first token of encoders."""
    if task.positions is not None:
        return task.positions
    device = task.embeddings.device
    from .explain import _is_causal
    if not _is_causal(task.model):
        return torch.zeros(task.batch, dtype=torch.long, device=device)
    seq = task.input_ids.shape[1]
    if task.attention_mask is None:
        return torch.full((task.batch,), seq - 1, dtype=torch.long, device=device)
    order = torch.arange(seq, device=device)
    return ((task.attention_mask.to(device) != 0) * (order + 1)).argmax(-1)


def _discard(mean_attention: torch.Tensor, dt: float) -> torch.Tensor:
    """Appendix A.1: set the entries above the ``dt``-quantile (of the nonzero entries of each map) to 0."""
    if dt >= 1.0:
        return mean_attention
    result = mean_attention.clone()
    for index, matrix in enumerate(mean_attention):
        values = matrix[matrix > 0]
        if values.numel():
            threshold = torch.quantile(values.float(), dt).to(matrix.dtype)
            result[index] = torch.where(matrix > threshold, torch.zeros_like(matrix), matrix)
    return result


def rollout(maps: list[torch.Tensor] | tuple[torch.Tensor, ...], normalize: bool) -> torch.Tensor:
    """``R = (I + A_L) ... (I + A_1)`` of ``[batch, seq, seq]`` head-averaged maps, first layer first (Eq. of
    appendix A.1). ``normalize`` divides each ``I + A`` by its row sums (Abnar & Zuidema: ``0.5 (I + A)``)."""
    batch, seq, _ = maps[0].shape
    eye = torch.eye(seq, dtype=maps[0].dtype, device=maps[0].device).expand(batch, seq, seq)
    result = eye.clone()
    for matrix in maps:
        step = eye + matrix
        if normalize:
            step = step / step.sum(-1, keepdim=True).clamp(min=torch.finfo(step.dtype).tiny)
        result = step @ result
    return result


def _row(matrices: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return matrices[torch.arange(matrices.shape[0], device=matrices.device), positions.to(matrices.device)]


# ----------------------------------------------------------------------------------------------------------- methods
def input_x_gradient(task: Task, position=-1, target=None) -> Explanation:
    """Gradient x input (Eq. 11 of the paper's appendix) at the word embeddings. Cost: one forward and one
    backward pass."""
    with torch.enable_grad():
        embeddings = task.embeddings.clone().requires_grad_(True)
        logit = task.resolve(task.forward(embeddings), position, target)
        (grad,) = torch.autograd.grad(logit.sum(), embeddings)
    return _finish(task, embeddings.detach() * grad, logit)


def integrated_gradients(task: Task, position=-1, target=None, steps: int = 20) -> Explanation:
    """Integrated Gradients (Sundararajan et al. 2017) from the zero embedding, by zennit's
    :py:class:`zennit.attribution.IntegratedGradients` (right Riemann sum over ``steps`` points, the paper's
    Eq. of appendix A.1). Cost: ``steps`` forward and backward passes (plus one plain forward)."""
    from zennit.attribution import IntegratedGradients

    logit = task.resolve_plain(position, target)
    attributor = IntegratedGradients(_Selected(task), n_iter=steps)
    with torch.enable_grad():
        _, relevance = attributor(task.embeddings.clone(), torch.ones_like)
    return _finish(task, relevance, logit)


def smoothgrad(task: Task, position=-1, target=None, sigma: float = 0.1, samples: int = 20, seed: int | None = 0,
               multiply_input: bool = True) -> Explanation:
    """SmoothGrad (Smilkov et al. 2017) by zennit's :py:class:`zennit.attribution.SmoothGrad`: the mean gradient
    over ``samples`` inputs with Gaussian noise of standard deviation ``sigma`` times the range (max - min) of each
    row's embeddings (zennit's ``noise_level``; the paper uses ``sigma=0.1``; zennit's last sample is
    noise-free). With ``multiply_input`` (default) the mean gradient is multiplied by the input embedding so that
    the per-token sum is a signed relevance like gradient x input; otherwise the gradient itself is summed.
    Cost: ``samples`` forward and backward passes (plus one plain forward)."""
    from zennit.attribution import SmoothGrad

    logit = task.resolve_plain(position, target)
    attributor = SmoothGrad(_Selected(task), noise_level=sigma, n_iter=samples)
    with torch.enable_grad(), _seeded(seed, task.embeddings.device):
        _, gradient = attributor(task.embeddings.clone(), torch.ones_like)
    relevance = gradient * task.embeddings if multiply_input else gradient
    return _finish(task, relevance, logit)


def attention_rollout(task: Task, position=-1, target=None, dt: float = 1.0) -> Explanation:
    """Attention rollout (Abnar & Zuidema 2020, appendix A.1): head-averaged attention maps, entries above the
    ``dt``-quantile discarded (``dt=1``, the paper's choice for LLMs, discards nothing), ``R = prod_l 0.5 (I + A_l)``
    (rows renormalised after discarding); the relevance of token ``j`` is ``R[position, j]``. Independent of the
    target. Cost: one forward pass with eager attention."""
    with torch.no_grad():
        scores, attentions = attention_maps(task, task.embeddings)
        logit = task.resolve(scores, position, target)
        maps = [_discard(attention.mean(1), dt) for attention in attentions]
        relevance = _row(rollout(maps, normalize=True), _query_positions(task))
    return _finish(task, relevance, logit)


def grad_attention_rollout(task: Task, position=-1, target=None, dt: float = 1.0) -> Explanation:
    """Gradient x attention rollout, Chefer et al. 2021 ("generic attention-model explainability") for
    self-attention: ``A_l = mean_heads((dlogit/dA_l * A_l)^+)``, entries above the ``dt``-quantile discarded,
    ``R = prod_l (I + A_l)`` (no normalisation); the relevance of token ``j`` is ``R[position, j]``.
    Cost: one forward and one backward pass with eager attention (all attention maps kept)."""
    with torch.enable_grad():
        embeddings = task.embeddings.clone().requires_grad_(True)
        scores, attentions = attention_maps(task, embeddings)
        logit = task.resolve(scores, position, target)
        grads = torch.autograd.grad(logit.sum(), attentions, allow_unused=True)
    with torch.no_grad():
        maps = [
            _discard((attention * (torch.zeros_like(attention) if grad is None else grad)).clamp(min=0).mean(1), dt)
            for attention, grad in zip(attentions, grads)
        ]
        relevance = _row(rollout(maps, normalize=False), _query_positions(task))
    return _finish(task, relevance, logit)


def gradcam(task: Task, position=-1, target=None, layer: int = -1) -> Explanation:
    """Grad-CAM for transformers as in Chefer et al. 2021 (the paper's baseline: "the last attention map weighted
    with the gradient"): per head the weight ``w_h`` is the mean gradient of the logit over the attention row of
    the explained position (keys it may attend to), and the relevance of token ``j`` is
    ``max(0, mean_h w_h A_h[position, j])`` of ``layer`` (default the last). Cost: one forward and one backward
    pass with eager attention."""
    with torch.enable_grad():
        embeddings = task.embeddings.clone().requires_grad_(True)
        scores, attentions = attention_maps(task, embeddings)
        logit = task.resolve(scores, position, target)
        attention = attentions[layer]
        (grad,) = torch.autograd.grad(logit.sum(), attention)
    with torch.no_grad():
        positions = _query_positions(task)
        index = torch.arange(task.batch, device=attention.device)
        row = attention[index, :, positions.to(attention.device)]  # [batch, heads, seq]
        row_grad = grad[index, :, positions.to(attention.device)]
        allowed = (row > 0).to(row.dtype)
        weights = (row_grad * allowed).sum(-1, keepdim=True) / allowed.sum(-1, keepdim=True).clamp(min=1)
        relevance = (weights * row).mean(1).clamp(min=0)
    return _finish(task, relevance, logit)


def _roles(role) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    if isinstance(role, str):
        return (role,), None
    if len(role) == 2 and isinstance(role[0], tuple):
        return tuple(role[0]), tuple(role[1])
    return tuple(role), None


def key_sites(model: torch.nn.Module) -> list[tuple[torch.nn.Module, int, int]]:
    """Modules whose output holds the attention keys, from the family table
    (:py:data:`zennit_attn.canonizers.families.FAMILIES`, role ``'key'``): ``(module, section, sections)`` where
    the key is section ``section`` of ``sections`` equal parts of the last dimension (fused projections such as
    GPT-2's ``c_attn``). Where an attention module normalises its keys after the projection (``k_norm`` of Qwen3
    and Gemma 3, an RMSNorm that would undo a scaling of the projection), the normalisation is the site."""
    from .canonizers.families import FAMILIES

    specs = {name: spec for family in FAMILIES for name, spec in family.operands.items()}
    sites = []
    for module in model.modules():
        spec = specs.get(type(module).__name__)
        if spec is None:
            continue
        for child, role in spec(module).items():
            roles, sections = _roles(role)
            if 'key' not in roles:
                continue
            if sections is not None and len(set(sections)) > 1:
                raise NotImplementedError(f'AtMan: unequal fused sections {sections} of {type(module).__name__}')
            site = getattr(module, child)
            k_norm = getattr(module, 'k_norm', None)
            if isinstance(k_norm, torch.nn.Module) and norm_kind(k_norm) is not None and len(roles) == 1:
                site = k_norm
            sites.append((site, roles.index('key'), len(roles)))
    if not sites:
        raise TypeError(
            f'AtMan found no key projection in {type(model).__name__}: its attention classes have no entry in '
            'zennit_attn.canonizers.families.FAMILIES'
        )
    return sites


@contextlib.contextmanager
def suppress_keys(model: torch.nn.Module, factors: Callable[[], torch.Tensor | None]):
    """While active, multiply the key of token ``i`` of batch element ``b`` in every attention layer by
    ``factors()[b, i]`` (``[batch, seq]``; None: no change). Scaling key ``i`` scales the pre-softmax scores
    ``q . k_i`` of that key column in every head exactly (rotary embeddings are linear in ``k``)."""
    def hook(section, sections):
        def scale(module, input, output):
            factor = factors()
            if factor is None:
                return None
            factor = factor.to(output.dtype).reshape(factor.shape + (1,) * (output.dim() - 2))
            if sections == 1:
                return output * factor
            size = output.shape[-1] // sections
            parts = list(output.split(size, dim=-1))
            parts[section] = parts[section] * factor
            return torch.cat(parts, dim=-1)
        return scale

    handles = [site.register_forward_hook(hook(section, sections)) for site, section, sections in key_sites(model)]
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()


def atman(task: Task, position=-1, target=None, p: float = 1.0, score: str = 'log_softmax',
          batch_size: int = 16) -> Explanation:
    """AtMan (Deb et al. 2023, appendix A.1): for each token ``i`` the pre-softmax attention scores of key ``i``
    are multiplied by ``1 - p`` in every layer and head, and the relevance of ``i`` is the drop of the explained
    score: ``R_i = s(x) - s(x | i suppressed)``. ``score='log_softmax'`` (default) uses the log-probability of the
    target, since AtMan relies on the softmax (the paper attributes AtMan with it, all other methods without);
    ``'logit'`` uses the logit. ``p=1.0`` is the paper's Wikipedia setting (0.7-0.9 on SQuAD). Keys are scaled
    by forward hooks on the key projections named in the family table. Tokens after the explained position of a
    causal model get 0 without a pass. Cost: one forward pass per token, batched ``batch_size`` at a time."""
    if score not in ('log_softmax', 'logit'):
        raise ValueError(f"score must be 'log_softmax' or 'logit', got {score!r}")

    def read(scores, rows=None):
        return task.select(scores.log_softmax(-1) if score == 'log_softmax' else scores, rows)

    current: list[torch.Tensor | None] = [None]
    device = task.embeddings.device
    seq = task.input_ids.shape[1]
    with torch.no_grad(), suppress_keys(task.model, lambda: current[0]):
        scores = task.forward(task.embeddings)
        logit = task.resolve(scores, position, target)
        reference = read(scores)
        from .explain import _is_causal
        last = task.positions if task.positions is not None and _is_causal(task.model) else None
        jobs = [(row, token) for row in range(task.batch) for token in range(seq)
                if (task.attention_mask is None or task.attention_mask[row, token] != 0)
                and (last is None or token <= int(last[row]))]
        relevance = torch.zeros(task.batch, seq, dtype=reference.dtype, device=device)
        for start in range(0, len(jobs), batch_size):
            chunk = jobs[start:start + batch_size]
            rows = torch.tensor([row for row, _ in chunk], device=device)
            tokens = torch.tensor([token for _, token in chunk], device=device)
            factor = torch.ones(len(chunk), seq, dtype=task.embeddings.dtype, device=device)
            factor[torch.arange(len(chunk), device=device), tokens] = 1.0 - p
            current[0] = factor
            try:
                suppressed = read(task.forward(task.embeddings[rows], rows), rows)
            finally:
                current[0] = None
            relevance[rows, tokens] = reference[rows] - suppressed
    return _finish(task, relevance, logit)


def kernelshap(task: Task, position=-1, target=None, samples: int = 2000, batch_size: int = 64,
               seed: int | None = 0) -> Explanation:
    """KernelSHAP (Lundberg & Lee 2017) by captum's :py:class:`captum.attr.KernelShap`, one feature per token,
    absent tokens set to the zero embedding (the baseline of the perturbation metric); ``samples`` coalitions
    (captum's and the paper's default 2000). Cost: ``samples`` forward passes per input row, ``batch_size`` at
    a time, plus a linear regression."""
    from captum.attr import KernelShap

    logit = task.resolve_plain(position, target)
    seq = task.input_ids.shape[1]
    device = task.embeddings.device
    mask = torch.arange(seq, device=device)[None, :, None].expand(1, seq, task.embeddings.shape[-1])
    relevance = torch.zeros(task.batch, seq, dtype=task.embeddings.dtype, device=device)
    for row in range(task.batch):
        def forward(embeddings, row=row):
            rows = _rows(task, embeddings.shape[0], row)
            return task.select(task.forward(embeddings, rows), rows)

        with torch.no_grad(), _seeded(seed, device):
            attribution = KernelShap(forward).attribute(
                task.embeddings[row:row + 1], baselines=0.0, feature_mask=mask, n_samples=samples,
                perturbations_per_eval=batch_size, show_progress=False,
            )
        relevance[row] = attribution[0, :, 0]
    return _finish(task, relevance, logit)


def random(task: Task, position=-1, target=None, seed: int | None = 0) -> Explanation:
    """Standard normal relevance per token (the paper's random baseline), from a generator seeded with
    ``seed`` (None: the global random state). Cost: one plain forward pass (for the logit)."""
    logit = task.resolve_plain(position, target)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    relevance = torch.randn(task.input_ids.shape, generator=generator, dtype=torch.float64)
    return _finish(task, relevance.to(device=task.embeddings.device, dtype=task.embeddings.dtype), logit)


#: Registered baseline methods by name (``'attnlrp'`` and ``'cplrp'`` are dispatched by :py:func:`explain`).
METHODS: dict[str, Callable[..., Explanation]] = {
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

#: Every method :py:func:`~zennit_attn.explain` accepts, in the order of the paper's tables.
ALL_METHODS: tuple[str, ...] = (
    'attnlrp', 'cplrp', 'input_x_gradient', 'integrated_gradients', 'smoothgrad', 'attention_rollout',
    'grad_attention_rollout', 'gradcam', 'atman', 'kernelshap', 'random',
)
