"""Activation checkpointing of transformer blocks for long contexts: ``explain(..., checkpointing=True)``.

Each transformer block's forward (the blocks of :py:func:`zennit_attn.core.blocks.transformer_blocks`) runs
under non-reentrant :py:func:`torch.utils.checkpoint.checkpoint`: autograd keeps only the block's inputs, and the
block is run again in the backward pass, when its saved tensors are first needed. The rules of the LRP composites
are hooks on module instances (forward hooks, tensor hooks, custom autograd functions); they run again in the
recomputation exactly as in the first forward pass, so the relevance is the same as without checkpointing. The
saved activations then grow with layers x sequence x hidden (one residual stream per block) plus one block's
activations at a time, instead of all blocks' activations.

The checkpointing is set on the model instance for the time of the :py:func:`checkpointed` context (the blocks'
``forward`` is replaced by an instance attribute, whatever was there before, e.g. an ``accelerate`` hook, is put
back on exit, also after an exception); classes are not changed. Unlike Hugging Face's
``gradient_checkpointing_enable()``, it works in eval mode (transformers checkpoints only while training).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from ..core.blocks import NoBlocksError, transformer_blocks
from ..rules.base import released_sources
from .operations import active_classifier

__all__ = ['checkpointed', 'recomputing']

#: Marks the instance ``forward`` installed by :py:func:`checkpointed`.
WRAPPED_ATTRIBUTE = 'zennit_attn_checkpointed'


#: True while a checkpointed block is run again in the backward pass (per thread and task)
_RECOMPUTING: contextvars.ContextVar[bool] = contextvars.ContextVar('zennit_attn_recomputing', default=False)


def recomputing() -> bool:
    """Whether the current forward computation is the recomputation of a checkpointed block in the backward pass
    (hooks that record the forward pass, e.g. :py:class:`zennit_attn.latent.recording.Recorder`, skip it: the first
    forward pass already recorded the same values, and the backward pass runs through the first pass's graph)."""
    return _RECOMPUTING.get()


@contextlib.contextmanager
def _recomputation(classifier, rules: list | None) -> Iterator[None]:
    """The context of a block's recomputation in the backward pass: :py:func:`recomputing` is true, and the engine's
    classifying mode of the forward that ran the block (if any) is entered again with the product rules of the scopes
    the block ran in (``rules``, innermost last), so that the recomputation gets the rules the forward got.

    The rules are set in the list the engine shares with its state, and put back after: the recomputation calls the
    block's ``forward`` without the block's hooks, so a scope rooted at the block itself
    (:py:class:`~zennit_attn.composites.AttnLRPLateEpsilon`'s later blocks) would not be entered again."""
    token = _RECOMPUTING.set(True)
    current = None if classifier is None else classifier.state.rules
    saved = None if current is None else current[:]
    try:
        if current is not None:
            current[:] = rules
        with classifier if classifier is not None else contextlib.nullcontext():
            yield
    finally:
        if current is not None:
            current[:] = saved
        _RECOMPUTING.reset(token)


@contextlib.contextmanager
def _forward(classifier) -> Iterator[None]:
    """The context of a checkpointed block in the forward: the engine's audit accepts this checkpoint (its
    recomputation is classified as the forward, :py:func:`_recomputation`)."""
    if classifier is not None:
        classifier.state.audit.checkpointing()
    yield


def _contexts():
    """Called by the checkpoint when the block runs in the forward: for the forward, the audit's acceptance of the
    checkpoint, and for the recomputation the classifying mode active now with the product rules of the scopes being
    run now."""
    classifier = active_classifier()
    rules = None if classifier is None else list(classifier.state.rules)
    return _forward(classifier), _recomputation(classifier, rules)


def _checkpointed_forward(inner):
    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        with released_sources():  # the rules' nodes keep nothing of the block beyond its saved tensors
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
        The modules to checkpoint; default every transformer block of ``model``
        (:py:func:`~zennit_attn.core.blocks.transformer_blocks`).

    Yields
    ------
    list of torch.nn.Module
        The checkpointed blocks.

    Raises
    ------
    zennit_attn.core.NoBlocksError
        If ``model`` has no transformer blocks (and none are given): a ``TypeError``.
    ValueError
        If a block is already checkpointed (nested contexts on one model).
    """
    if blocks is None:
        try:
            blocks = transformer_blocks(model)
        except NoBlocksError as error:
            raise NoBlocksError(f'checkpointing=True: {error}; explain it without checkpointing') from None
    blocks = list(blocks)
    if not blocks:
        raise ValueError('checkpointed() got an empty list of blocks')
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
