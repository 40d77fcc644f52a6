"""The baselines on attention maps: attention rollout, gradient x attention rollout and Grad-CAM. Each runs the model
once with eager attention (:py:func:`~zennit_attn.methods.attention.attention_maps`) and gives a token's relevance;
an image's pixels get the value of their patch."""

from __future__ import annotations

import torch

from ..inputs.task import Task
from .attention import attention_maps, discard, rollout
from .gradients import batch_norm_gradients

__all__ = ['attention_rollout', 'grad_attention_rollout', 'gradcam']


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


def grad_attention_rollout(task: Task, position=-1, target=None, dt: float = 1.0):
    """Gradient x attention rollout, Chefer et al. 2021 ("generic attention-model explainability") for
    self-attention: ``A_l = mean_heads((dlogit/dA_l * A_l)^+)``, entries above the ``dt``-quantile discarded,
    ``R = prod_l (I + A_l)`` (no normalisation); the relevance of token ``j`` is the explained token's row of ``R``.
    Cost: one forward and one backward pass with eager attention (all attention maps kept)."""
    with torch.enable_grad(), batch_norm_gradients(task.model):
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


def gradcam(task: Task, position=-1, target=None, layer: int = -1):
    """Grad-CAM for transformers as in Chefer et al. 2021 (the paper's baseline: "the last attention map weighted
    with the gradient"): per head the weight ``w_h`` is the mean gradient of the logit over the attention row of
    the explained token (the keys it may attend to), and the relevance of token ``j`` is
    ``max(0, mean_h w_h A_h[row, j])`` of ``layer`` (default the last). Cost: one forward and one backward pass with
    eager attention."""
    with torch.enable_grad(), batch_norm_gradients(task.model):
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
