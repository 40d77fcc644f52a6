"""The one finder of a model's transformer blocks, for checkpointing, the latent sites and the conservation report;
the finders of the parts of a model that the ViT composites treat apart (attention projections, vision towers), all
from the module tree (what a model computes is read in :py:mod:`zennit_attn.structure`).

A *block* is a module that transformers marks as one (a ``GradientCheckpointingLayer``: the decoder/encoder layers
of every transformers model that supports gradient checkpointing). In a model that marks none (timm's vision
transformers, older transformers models, models of your own), a block is an element of a ``ModuleList`` or
``Sequential`` whose elements are all of one class, that holds an attention module (a module whose class name says
``Attention`` or ``Attn``; timm's ``Block``); a container (``ModuleList``, ``Sequential``, ``ModuleDict``) is never a
block: it is not called, its elements are. Blocks inside a block are not blocks. A *stack* is the blocks that one
parent module holds, named by the parent's path: one stack in decoder-only, encoder-only and vision models, the
encoder's and the decoder's in encoder-decoder models. Blocks held in nested lists (Funnel's
``funnel.encoder.blocks[i][j]``: one inner list per group of blocks between two poolings) are one stack, named by
the outermost list's path, in module order.
"""

from __future__ import annotations

import re

import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from .kinds import LINEARS

__all__ = [
    'NoBlocksError',
    'is_block',
    'is_marked_block',
    'is_repeated_block',
    'block_stacks',
    'transformer_blocks',
    'attention_linears',
    'vision_towers',
]

#: Modules that hold modules without being called: never blocks, and a list of them is searched for blocks.
CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)
#: Class names of attention modules, and of the modules inside them that are not attention (an MLP of a pooling head).
_ATTENTION = re.compile(r'Attention|Attn')
_NOT_ATTENTION = re.compile(r'MLP|Mlp|FeedForward|FFN|Ffn|Intermediate|Expert|Router|Gate')
#: Child names of attention output projections (the others inside an attention module are input projections).
ATTENTION_OUTPUT_NAMES = frozenset(
    {
        'o_proj',
        'out_proj',
        'dense',
        'proj',
        'c_proj',
        'o',
        'out_lin',
        'wo',
        'out',
        'to_out',
        'output',
        'attn_out',
        'linear_out',
    }
)
#: Child names under which multimodal models hold their vision towers.
VISION_TOWER_NAMES = frozenset(
    {
        'vision_tower',
        'visual',
        'vision_model',
        'vision_encoder',
        'image_encoder',
        'vision',
        'vision_backbone',
        'image_tower',
    }
)


class NoBlocksError(TypeError):
    """A model has no transformer block that :py:func:`block_stacks` recognises."""


def is_block(module: torch.nn.Module, container: torch.nn.Module | None = None) -> bool:
    """Whether ``module`` is a transformer block: a transformers ``GradientCheckpointingLayer``, or, with the
    ``container`` that holds it, a repeated module that holds attention (:py:func:`is_repeated_block`)."""
    return is_marked_block(module) or (container is not None and is_repeated_block(module, container))


def is_marked_block(module: torch.nn.Module) -> bool:
    """Whether transformers marks ``module`` as a block (a ``GradientCheckpointingLayer``)."""
    return isinstance(module, GradientCheckpointingLayer)


def is_repeated_block(module: torch.nn.Module, container: torch.nn.Module) -> bool:
    """Whether ``module`` is an element of ``container`` (a ``ModuleList`` or ``Sequential``) whose elements are all of
    ``module``'s class, and holds an attention module below it (timm's ``Block`` in ``VisionTransformer.blocks``); not
    a container itself (an inner list of nested lists of blocks: Funnel's encoder)."""
    if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)) or isinstance(module, CONTAINERS):
        return False
    if any(type(element) is not type(module) for element in container.children()):
        return False
    return any(_is_attention(type(inner).__name__) for inner in module.modules() if inner is not module)


def _is_attention(kind: str) -> bool:
    """Whether a class name says attention and not a part of another kind (an MLP of a pooling head)."""
    return bool(_ATTENTION.search(kind)) and not _NOT_ATTENTION.search(kind)


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
        ``f'{stack path}.{index}'`` where the parent holds nothing but blocks; blocks held in nested lists (Funnel's
        ``funnel.encoder.blocks[i][j]``) are one stack named by the outermost list, ``[('funnel.encoder.blocks',
        [12 blocks]), ('funnel.decoder.layers', [2 blocks])]``.

    Raises
    ------
    NoBlocksError
        If ``model`` holds no block (``model`` itself being a block counts: one stack of one block, path ``''``).
    """
    stacks = _stacks(model, marked=True) or _stacks(model, marked=False)
    if not stacks:
        raise NoBlocksError(
            f'{type(model).__name__} has no transformer blocks: none of its modules is a transformers '
            'GradientCheckpointingLayer, and no ModuleList or Sequential holds modules of one class that hold an '
            'attention module'
        )
    return list(stacks.items())


def _stacks(model: torch.nn.Module, marked: bool) -> dict[str, list[torch.nn.Module]]:
    """The stacks of the blocks transformers marks (``marked``) or of the repeated blocks, by parent path (the
    outermost list's path for blocks in nested lists)."""
    stacks: dict[str, list[torch.nn.Module]] = {}

    def visit(path: str, module: torch.nn.Module, container: torch.nn.Module | None, stack: str) -> None:
        # ``stack``: the stack ``module`` belongs to if it is a block (its parent's path, or the outermost list's)
        found = is_marked_block(module) if marked else container is not None and is_repeated_block(module, container)
        if found:
            stacks.setdefault(stack, []).append(module)
            return
        nested = isinstance(module, CONTAINERS) and isinstance(container, CONTAINERS)
        for name, child in module.named_children():
            visit(f'{path}.{name}' if path else name, child, module, stack if nested else path)

    visit('', model, None, '')
    return stacks


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every transformer block of ``model``, the blocks of all :py:func:`block_stacks` in module order.

    Raises
    ------
    NoBlocksError
        If ``model`` holds no block.
    """
    return [block for _, blocks in block_stacks(model) for block in blocks]


def attention_linears(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """``(input projections, output projections)``: the names of the linear layers inside attention modules.

    A linear layer is an attention projection if its nearest ancestor whose class name says attention
    (``...Attention``, ``...Attn``) is not separated from it by an MLP-like module (a pooling head's MLP); it is the
    output projection if its name is one of :py:data:`ATTENTION_OUTPUT_NAMES` or its parent's class name ends in
    ``Output`` (BERT's ``SelfOutput``), an input projection (query, key, value, fused or low-rank) otherwise. On the
    24 families of the former family table this agrees with the table's operand taps and attention outputs (tested
    against them, kept as data), and with the projections :py:func:`~zennit_attn.structure.model_structure`
    finds from what the model computes.
    """
    inputs, outputs = [], []

    def visit(path: str, module: torch.nn.Module, inside: bool, parent: str) -> None:
        for name, child in module.named_children():
            child_path = f'{path}.{name}' if path else name
            if isinstance(child, LINEARS):
                if inside:
                    is_output = name in ATTENTION_OUTPUT_NAMES or parent.endswith('Output')
                    (outputs if is_output else inputs).append(child_path)
                continue
            kind = type(child).__name__
            visit(
                child_path, child, (inside or bool(_ATTENTION.search(kind))) and not _NOT_ATTENTION.search(kind), kind
            )

    visit('', model, _is_attention(type(model).__name__), type(model).__name__)
    return inputs, outputs


def vision_towers(model: torch.nn.Module) -> list[str]:
    """Names of the vision towers of a multimodal model: the outermost submodules (not ``model`` itself) held under
    one of :py:data:`VISION_TOWER_NAMES` or whose class name says ``Vision`` and ``Model``, ``Transformer``,
    ``Encoder`` or ``Tower`` (LLaVA's and Gemma 3's ``vision_tower``, Qwen2-VL's ``visual``, CLIP's and Idefics3's
    ``vision_model``); empty for a model without one."""
    found = []

    def visit(path: str, module: torch.nn.Module) -> None:
        for name, child in module.named_children():
            child_path = f'{path}.{name}' if path else name
            kind = type(child).__name__
            if name in VISION_TOWER_NAMES or ('Vision' in kind and re.search(r'Model|Transformer|Encoder|Tower', kind)):
                found.append(child_path)
            else:
                visit(child_path, child)

    visit('', model)
    return found
