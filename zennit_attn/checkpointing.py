"""Activation checkpointing of transformer blocks for long contexts: ``explain(..., checkpointing=True)``.

Each transformer block's forward runs under non-reentrant :py:func:`torch.utils.checkpoint.checkpoint`: autograd
keeps only the block's inputs, and the block is run again in the backward pass, when its saved tensors are first
needed. The rules of the LRP composites are hooks on module instances (forward hooks, tensor hooks, custom autograd
functions); they run again in the recomputation exactly as in the first forward pass, so the relevance is the same
as without checkpointing. The saved activations then grow with layers x sequence x hidden (one residual stream per
block) plus one block's activations at a time, instead of all blocks' activations.

The checkpointing is set on the model instance for the time of the :py:func:`checkpointed` context (the blocks'
``forward`` is replaced by an instance attribute, whatever was there before, e.g. an ``accelerate`` hook, is put
back on exit, also after an exception); classes are not changed. Unlike Hugging Face's
``gradient_checkpointing_enable()``, it works in eval mode (transformers checkpoints only while training).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import torch
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

__all__ = ['transformer_blocks', 'checkpointed', 'recomputing', 'NoBlocksError']

#: Class names of the repeated blocks of models that are not Hugging Face ``GradientCheckpointingLayer``\ s (timm's
#: vision transformers).
BLOCK_CLASSES = ('Block', 'ResPostBlock', 'ParallelScalingBlock', 'ParallelThingsBlock')

#: Marks the instance ``forward`` installed by :py:func:`checkpointed`.
WRAPPED_ATTRIBUTE = 'zennit_attn_checkpointed'


class NoBlocksError(TypeError):
    """The model has no transformer blocks that :py:func:`checkpointed` recognises."""


def _is_block(module: torch.nn.Module) -> bool:
    if isinstance(module, GradientCheckpointingLayer):
        return True
    cls = type(module)
    return cls.__name__ in BLOCK_CLASSES and cls.__module__.startswith('timm.')


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of ``model``, outermost first in module order.

    A block is a Hugging Face ``GradientCheckpointingLayer`` (the decoder/encoder layers of every transformers
    model that supports gradient checkpointing) or a timm vision transformer block; blocks nested in a block are
    not listed.

    Parameters
    ----------
    model: torch.nn.Module

    Returns
    -------
    list of torch.nn.Module
        Empty if none is recognised.
    """
    blocks: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> None:
        if _is_block(module):
            blocks.append(module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    return blocks


#: True while a checkpointed block is run again in the backward pass (per thread and task)
_RECOMPUTING: contextvars.ContextVar[bool] = contextvars.ContextVar('zennit_attn_recomputing', default=False)


def recomputing() -> bool:
    """Whether the current forward computation is the recomputation of a checkpointed block in the backward pass
    (hooks that record the forward pass, e.g. :py:class:`zennit_attn.latent.recording.Recorder`, skip it: the first
    forward pass already recorded the same values, and the backward pass runs through the first pass's graph)."""
    return _RECOMPUTING.get()


@contextlib.contextmanager
def _recomputation() -> Iterator[None]:
    token = _RECOMPUTING.set(True)
    try:
        yield
    finally:
        _RECOMPUTING.reset(token)


def _contexts():
    return contextlib.nullcontext(), _recomputation()


def _checkpointed_forward(inner):
    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, context_fn=_contexts, **kwargs)
    setattr(forward, WRAPPED_ATTRIBUTE, True)
    return forward


@contextlib.contextmanager
def checkpointed(model: torch.nn.Module, blocks: list[torch.nn.Module] | None = None) -> Iterator[list]:
    """Recompute each transformer block of ``model`` in the backward pass instead of saving its activations.

    Parameters
    ----------
    model: torch.nn.Module
    blocks: list of torch.nn.Module, optional
        The modules to checkpoint; default :py:func:`transformer_blocks` of ``model``.

    Yields
    ------
    list of torch.nn.Module
        The checkpointed blocks.

    Raises
    ------
    NoBlocksError
        If ``model`` has no recognised blocks (and none are given).
    ValueError
        If a block is already checkpointed (nested contexts on one model).
    """
    blocks = transformer_blocks(model) if blocks is None else list(blocks)
    if not blocks:
        raise NoBlocksError(
            f'checkpointing=True found no transformer blocks in {type(model).__name__} (Hugging Face '
            'GradientCheckpointingLayer or timm Block): explain it without checkpointing'
        )
    if any(getattr(block.__dict__.get('forward'), WRAPPED_ATTRIBUTE, False) for block in blocks):
        raise ValueError(f'{type(model).__name__} is already checkpointed (nested checkpointed() contexts)')
    previous = []
    try:
        for block in blocks:
            previous.append((block, 'forward' in block.__dict__, block.__dict__.get('forward')))
            block.forward = _checkpointed_forward(block.forward)
        yield blocks
    finally:
        for block, had, value in reversed(previous):
            if had:
                block.__dict__['forward'] = value
            else:
                block.__dict__.pop('forward', None)
