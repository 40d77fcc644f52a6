"""The one finder of a model's transformer blocks, for checkpointing, the latent sites and the conservation report.

A *block* is a module that transformers marks as one (a ``GradientCheckpointingLayer``: the decoder/encoder layers
of every transformers model that supports gradient checkpointing, also of families outside the table) or whose
class a family of the table lists in :py:attr:`~zennit_attn.canonizers.families.Family.blocks` (timm's ``Block``).
Blocks inside a block are not blocks. A *stack* is the blocks that one parent module holds (a ``ModuleList`` or
``Sequential``), named by the parent's path: one stack in decoder-only, encoder-only and vision models, the
encoder's and the decoder's in encoder-decoder models.
"""
from __future__ import annotations

import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from .families import FAMILIES

__all__ = ['NoBlocksError', 'is_block', 'block_stacks', 'transformer_blocks']


class NoBlocksError(TypeError):
    """A model has no transformer block that :py:func:`block_stacks` recognises."""


def is_block(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a transformer block: a transformers ``GradientCheckpointingLayer`` or an instance of a
    class that a family of the table lists in ``blocks``."""
    return isinstance(module, GradientCheckpointingLayer) or any(family.is_block(module) for family in FAMILIES)


def block_stacks(model: torch.nn.Module) -> list[tuple[str, list[torch.nn.Module]]]:
    """The stacks of transformer blocks of ``model``, in module order.

    Parameters
    ----------
    model: torch.nn.Module

    Returns
    -------
    list of (str, list of torch.nn.Module)
        ``(path of the parent module, its blocks in order)`` per stack: ``[('model.layers', [...])]`` for a Llama
        ``ForCausalLM``; ``[('encoder.block', [...]), ('decoder.block', [...])]`` for T5 (the encoder first, as it
        runs); the path is ``''`` for blocks that are children of ``model`` itself, and a block's path is
        ``f'{stack path}.{index}'`` where the parent holds nothing but blocks.

    Raises
    ------
    NoBlocksError
        If ``model`` holds no block (``model`` itself being a block counts: one stack of one block, path ``''``).
    """
    stacks: dict[str, list[torch.nn.Module]] = {}

    def visit(path: str, module: torch.nn.Module) -> None:
        if is_block(module):
            stacks.setdefault(path.rpartition('.')[0], []).append(module)
            return
        for name, child in module.named_children():
            visit(f'{path}.{name}' if path else name, child)

    visit('', model)
    if not stacks:
        raise NoBlocksError(
            f'{type(model).__name__} has no transformer blocks: none of its modules is a transformers '
            'GradientCheckpointingLayer or of a block class of the family table (Family.blocks in '
            'zennit_attn.canonizers.families)'
        )
    return list(stacks.items())


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every transformer block of ``model``, the blocks of all :py:func:`block_stacks` in module order.

    Raises
    ------
    NoBlocksError
        If ``model`` holds no block.
    """
    return [block for _, blocks in block_stacks(model) for block in blocks]
