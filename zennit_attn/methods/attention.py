"""Reading and changing attention: the probabilities of every layer (for attention rollout and Grad-CAM), the rollout
product itself, and the key scaling of AtMan, for language models and vision transformers alike.

- :py:func:`attention_maps` runs a task's model once and returns its attention probabilities. Hugging Face models are
  switched to eager attention (:py:func:`eager_attention`) and asked for ``output_attentions``; timm's attention
  computes them only on its non-fused path, which is switched on for the call, and they are read at ``attn_drop``.
- :py:func:`rollout` multiplies ``(I + A_l)`` over the layers (appendix A.1), :py:func:`discard` drops the largest
  entries of a map.
- :py:func:`key_sites` finds the modules whose output holds the attention keys, from what the model computes
  (:py:func:`~zennit_attn.structure.model_structure`), and :py:func:`suppress_keys` scales the key of chosen
  tokens in every layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from ..core.errors import UnsupportedModelError
from ..core.kinds import model_configs
from ..core.modules import is_encoder_decoder, output_scores
from ..inputs.task import Task
from ..structure import model_structure

__all__ = ['eager_attention', 'attention_maps', 'rollout', 'discard', 'key_sites', 'suppress_keys']


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module):
    """Switch every configuration in ``model`` to ``attn_implementation='eager'`` (attention probabilities are
    materialised and returned with ``output_attentions=True``) and restore the previous implementation after."""
    configs = model_configs(model)
    saved = [config._attn_implementation for config in configs]
    try:
        for config in configs:
            config._attn_implementation = 'eager'
        yield model
    finally:
        for config, value in zip(configs, saved):
            config._attn_implementation = value


def _is_timm_attention(module: torch.nn.Module) -> bool:
    return (
        type(module).__module__.startswith('timm.')
        and hasattr(module, 'fused_attn')
        and hasattr(module, 'attn_drop')
        and hasattr(module, 'qkv')
    )


@contextlib.contextmanager
def _timm_capture(model: torch.nn.Module):
    """Collect timm attention probabilities (at ``attn_drop``, with ``fused_attn`` off) during the block; yields the
    list, or None where the model has no timm attention."""
    maps: list[torch.Tensor] = []
    handles, fused = [], []
    try:
        for module in model.modules():
            if _is_timm_attention(module):
                fused.append((module, module.fused_attn))
                module.fused_attn = False
                handles.append(module.attn_drop.register_forward_hook(lambda mod, args, output: maps.append(output)))
        yield maps if handles else None
    finally:
        for handle in handles:
            handle.remove()
        for module, value in fused:
            module.fused_attn = value


@contextlib.contextmanager
def _hooks_kept(model: torch.nn.Module):
    """Leave ``model``'s forward hooks as they were: transformers installs its output-recording hooks on a model's
    first call with ``output_attentions`` and marks the model (``_output_capturing_hooks_installed``); the hooks and
    the mark that the block added are removed after it."""
    modules = list(model.modules())
    hooks = [set(module._forward_hooks) for module in modules]
    marks = [module.__dict__.get('_output_capturing_hooks_installed', _UNSET) for module in modules]
    try:
        yield
    finally:
        for module, before, mark in zip(modules, hooks, marks):
            for key in set(module._forward_hooks) - before:
                del module._forward_hooks[key]
                module._forward_hooks_with_kwargs.pop(key, None)
                module._forward_hooks_always_called.pop(key, None)
            if mark is _UNSET:
                module.__dict__.pop('_output_capturing_hooks_installed', None)


_UNSET = object()


@contextlib.contextmanager
def attention_maps(task: Task, inputs: torch.Tensor) -> Iterator[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
    """Run the task's model on ``inputs`` (one per input row) and yield its scores and the attention probabilities
    of every layer, ``[batch, heads, tokens, tokens]`` each, first layer first, in the autograd graph.

    The model keeps eager attention (and timm its non-fused path) until the context exits: a backward pass through
    the maps runs inside it, so that blocks recomputed in the backward pass (``explain(..., checkpointing=True)``)
    compute what the forward pass computed.

    Raises
    ------
    NotImplementedError
        For encoder-decoder models: their attention-map methods would need rules for cross-attention; for tokens
        not laid out as the model's sequences (a multiple-choice head's, :py:meth:`Task.check_token_layout`).
    TypeError
        Where the model returns no attention probabilities.
    """
    model = task.model
    task.check_token_layout('attention-map methods (rollout, Grad-CAM)')
    if is_encoder_decoder(model):
        raise NotImplementedError(
            f'attention-map methods (rollout, Grad-CAM) are not implemented for the encoder-decoder '
            f'{type(model).__name__}: use attnlrp, cplrp, atman, kernelshap or a gradient method'
        )
    with eager_attention(model), _hooks_kept(model), _timm_capture(model) as captured:
        try:
            output = task.run(inputs) if captured is not None else task.run(inputs, output_attentions=True)
        except TypeError as error:
            if 'output_attentions' not in str(error):
                raise
            raise UnsupportedModelError(
                f'the attention-map methods (rollout, Grad-CAM) ask {type(model).__name__} for its attention '
                'probabilities (output_attentions=True), which its forward does not take: pass it on to the model '
                'inside it and return its attentions, or use attnlrp, cplrp, atman or a gradient method'
            ) from error
        attentions = list(captured) if captured is not None else getattr(output, 'attentions', None)
        if not attentions or any(attention is None for attention in attentions):
            raise TypeError(
                f'{type(model).__name__} returned no attention probabilities (with eager attention and '
                'output_attentions=True)'
            )
        _check_maps(task, inputs.shape[0], attentions)
        yield output_scores(output), tuple(attentions)


def _check_maps(task: Task, batch: int, attentions) -> None:
    """Refuse attention maps that are not ``[batch, heads, tokens, tokens]`` over the task's tokens in every layer:
    windowed attention (Swin: a batch of windows), keys reduced or pooled (SegFormer, PVT, Hiera), stages of other
    lengths. Rollout multiplies the maps of all layers and Grad-CAM reads the explained token's row, so they need one
    sequence of the input's tokens throughout (a plain ViT's patches and class token, a language model's tokens).

    Raises
    ------
    zennit_attn.core.errors.UnsupportedModelError
        Naming the first map that is not one and what it would need.
    """
    tokens = task.token_count()
    for layer, attention in enumerate(attentions):
        shape = tuple(attention.shape) if isinstance(attention, torch.Tensor) else None
        if shape is None or len(shape) != 4 or shape[0] != batch or shape[2:] != (tokens, tokens):
            found = f'shape {shape}' if shape is not None else f'a {type(attention).__name__}'
            raise UnsupportedModelError(
                f'the attention-map methods (rollout, Grad-CAM) multiply or read attention maps over one sequence of '
                f'the input tokens in every layer ({batch} x heads x {tokens} x {tokens}); {type(task.model).__name__} '
                f'gives layer {layer} a map of {found} (windowed, pooled or reduced attention, stages of other '
                'lengths): use attnlrp, cplrp or a gradient method'
            )


def discard(mean_attention: torch.Tensor, dt: float) -> torch.Tensor:
    """Appendix A.1: set the entries above the ``dt``-quantile (of the nonzero entries of each map) to 0; ``dt >= 1``
    keeps all."""
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
    """``R = (I + A_L) ... (I + A_1)`` of ``[batch, tokens, tokens]`` head-averaged maps, first layer first
    (appendix A.1). ``normalize`` divides each ``I + A`` by its row sums (Abnar & Zuidema: ``0.5 (I + A)``)."""
    batch, tokens, _ = maps[0].shape
    eye = torch.eye(tokens, dtype=maps[0].dtype, device=maps[0].device).expand(batch, tokens, tokens)
    result = eye.clone()
    for matrix in maps:
        step = eye + matrix
        if normalize:
            step = step / step.sum(-1, keepdim=True).clamp(min=torch.finfo(step.dtype).tiny)
        result = step @ result
    return result


def key_sites(model: torch.nn.Module) -> list[tuple[torch.nn.Module, Callable[[int], torch.Tensor]]]:
    """Modules whose output holds the attention keys over the input tokens, in every attention operation (in
    encoder-decoder models those of the encoder and of the cross-attention), found from what the model computes
    (:py:meth:`~zennit_attn.structure.ModelStructure.key_sites`): ``(module, mask)`` where ``mask(size)`` marks
    the key entries of an output's last dimension of ``size`` (fused projections such as GPT-2's ``c_attn`` or
    GPT-NeoX's per-head ``query_key_value``). Where an attention module normalises its keys after the projection
    (``k_norm`` of Qwen3, Gemma 3, OLMo 2: a normalisation that would undo a scaling of the projection), the
    normalisation is the site: the keys are a linear function of each site's output (checked), so that scaling the
    site's key features of a token scales that token's key exactly.

    Raises
    ------
    zennit_attn.structure.StructureError
        If the model computes no attention operation, or one whose keys no module's output scales exactly (keys
        normalised inline, or computed from several kinds of tensors): AtMan cannot suppress tokens in it.
    """
    return [(site.module, site.select) for site in model_structure(model).key_sites()]


@contextlib.contextmanager
def suppress_keys(model: torch.nn.Module, factors: Callable[[], torch.Tensor | None]):
    """While active, multiply the key of token ``i`` of batch element ``b`` in every attention layer by
    ``factors()[b, i]`` (``[batch, tokens]``; None: no change). Scaling key ``i`` scales the pre-softmax scores
    ``q . k_i`` of that key column in every head exactly (rotary embeddings are linear in ``k``)."""

    def hook(mask):
        def scale(module, input, output):
            factor = factors()
            if factor is None:
                return None
            # the token dimension: 1 for [batch, tokens, features]; for per-head keys ([batch, tokens, heads, dim]
            # or transposed [batch, heads, tokens, dim], e.g. Gemma 3's k_norm) the one of largest stride in the
            # input, a view of the projection's [batch, tokens, features] output
            dim = 1 if output.dim() <= 3 else 1 + max(range(output.dim() - 2), key=lambda d: input[0].stride(d + 1))
            if output.shape[dim] != factor.shape[1] or output.shape[0] != factor.shape[0]:
                raise UnsupportedModelError(
                    f'AtMan scales the key of every input token in every attention layer; {type(module).__name__} '
                    f'returned keys of shape {tuple(output.shape)} for {factor.shape[0]} input(s) of '
                    f'{factor.shape[1]} tokens (windowed, pooled or reduced attention: Swin, LeViT, MobileViT): use '
                    'attnlrp, cplrp or a gradient method'
                )
            shape = [factor.shape[0]] + [1] * (output.dim() - 1)
            shape[dim] = factor.shape[1]
            factor = factor.to(output.dtype).reshape(shape)
            keys = mask(output.shape[-1]).to(output.device)
            return output * torch.where(keys, factor, torch.ones_like(factor))

        return scale

    handles = [site.register_forward_hook(hook(mask)) for site, mask in key_sites(model)]
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()
