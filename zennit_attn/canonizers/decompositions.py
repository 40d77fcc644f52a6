"""Torch functions that the general mechanism opens: their arithmetic re-run as plain torch operations.

A :py:class:`~torch.overrides.TorchFunctionMode` sees a composite torch function such as
:py:func:`torch.nn.functional.multi_head_attention_forward` as one call and none of the operations inside it. The
functions here compute the same result from operations that
:py:class:`~zennit_attn.canonizers.general.GeneralCanonizer` classifies one by one (linear maps, the attention
products, the softmax), so that AttnLRP's rules apply inside them.
"""
from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

__all__ = ['DECOMPOSED', 'multi_head_attention']


def multi_head_attention(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:py:func:`torch.nn.functional.multi_head_attention_forward` (same arguments and result) from linear maps,
    ``q @ k^T``, softmax and ``A @ v``: the attention of :py:class:`torch.nn.MultiheadAttention` (SigLIP's
    attention-pooling head, ...).

    Raises
    ------
    NotImplementedError
        For the options outside standard softmax attention: ``bias_k``/``bias_v``, ``add_zero_attn``, ``static_k``/
        ``static_v``, and dropout in training mode (the message names the option).
    """
    bound = inspect.signature(F.multi_head_attention_forward).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    unsupported = [name for name in ('bias_k', 'bias_v', 'static_k', 'static_v') if a[name] is not None]
    if a['add_zero_attn']:
        unsupported.append('add_zero_attn')
    if a['training'] and a['dropout_p'] > 0:
        unsupported.append('dropout in training mode')
    if unsupported:
        raise NotImplementedError(f'multi_head_attention_forward with {", ".join(unsupported)}')
    query, key, value = a['query'], a['key'], a['value']
    batched = query.dim() == 3
    if not batched:  # (L, E) -> (L, 1, E)
        query, key, value = (tensor.unsqueeze(1) for tensor in (query, key, value))
    length, batch, width = query.shape
    heads = a['num_heads']
    size = width // heads
    if a['use_separate_proj_weight']:
        weights = a['q_proj_weight'], a['k_proj_weight'], a['v_proj_weight']
    else:
        weights = a['in_proj_weight'].chunk(3)
    biases = (None,) * 3 if a['in_proj_bias'] is None else a['in_proj_bias'].chunk(3)

    def split(tensor, weight, bias):  # (S, N, E) -> (N, heads, S, size)
        projected = F.linear(tensor, weight, bias)
        return projected.reshape(projected.shape[0], batch, heads, size).permute(1, 2, 0, 3)

    q, k, v = (split(tensor, weight, bias) for tensor, weight, bias in zip((query, key, value), weights, biases))
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(size)
    mask = _mask(a['attn_mask'], a['key_padding_mask'], a['is_causal'], scores, batch, heads, length, k.shape[2],
                 batched)
    if mask is not None:
        scores = scores + mask
    attention = torch.softmax(scores, -1)
    mixed = torch.matmul(attention, v).permute(2, 0, 1, 3).reshape(length, batch, width)
    output = F.linear(mixed, a['out_proj_weight'], a['out_proj_bias'])
    weights_out = None
    if a['need_weights']:
        weights_out = attention
        if a['average_attn_weights']:
            weights_out = weights_out.mean(1)
        if not batched:
            weights_out = weights_out.squeeze(0)
    return (output if batched else output.squeeze(1)), weights_out


def _mask(attn_mask, key_padding_mask, is_causal, scores, batch, heads, length, source, batched):
    """The additive mask ``[N, heads or 1, L, S]`` of the attention mask and the key padding mask (True: masked)."""
    total = None
    for mask in (attn_mask, key_padding_mask):
        if mask is None:
            continue
        if mask is key_padding_mask:
            mask = mask.reshape(batch if batched else 1, 1, 1, source)
        elif mask.dim() == 3:  # (N * heads, L, S)
            mask = mask.reshape(batch, heads, length, source)
        if mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=scores.dtype).masked_fill(mask, float('-inf'))
        mask = mask.to(scores.dtype)
        total = mask if total is None else total + mask
    if total is None and is_causal:
        total = torch.full((length, source), float('-inf'), dtype=scores.dtype).triu(1)
    return total


#: torch functions (by name) -> their decomposition
DECOMPOSED = {'multi_head_attention_forward': multi_head_attention}
