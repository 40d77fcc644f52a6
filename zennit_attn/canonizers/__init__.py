"""Instance-level canonizers that make transformer models attributable with AttnLRP.

:py:func:`canonizers_for` inspects a model, checks that every module class in it is understood, and returns
the canonizers for it; the composites call it when no canonizers are given. :py:func:`block_stacks` finds the
transformer blocks (:py:mod:`zennit_attn.canonizers.blocks`).
"""
from __future__ import annotations

import torch

from ..layers import Logits, MatMul, Operand, Product
from ..module_kinds import CONVOLUTIONS, LINEARS, NEUTRAL, is_activation, norm_kind
from .base import (
    INLINE_FUNCTIONS, InlineActivationCanonizer, InlineOperandCanonizer, OperandCanonizer, SettingCanonizer, Tap,
    parse_taps,
)
from .blocks import NoBlocksError, block_stacks, transformer_blocks
from .families import ATTENTION_OUTPUTS, FAMILIES, Family, family_of, operand_taps

__all__ = [
    'canonizers_for', 'supported_families', 'UnsupportedModelError', 'OperandCanonizer',
    'InlineActivationCanonizer', 'InlineOperandCanonizer', 'SettingCanonizer', 'Tap', 'Family', 'FAMILIES',
    'INLINE_FUNCTIONS', 'ATTENTION_OUTPUTS', 'family_of', 'operand_taps', 'parse_taps', 'block_stacks',
    'transformer_blocks', 'NoBlocksError',
]

#: Leaf modules that a composite has a rule for or that need none.
_KNOWN = LINEARS + CONVOLUTIONS + NEUTRAL + (Operand, Product, MatMul, torch.nn.Softmax)


class UnsupportedModelError(TypeError):
    """A model contains modules that zennit-attn has no rule or canonizer for."""


def supported_families() -> list[str]:
    """Names of the model families with a table entry."""
    return [family.name for family in FAMILIES]


def _understood(module: torch.nn.Module, families: list[Family]) -> bool:
    if any(family.owns(module) for family in families):
        return True
    return (type(module) is Logits or isinstance(module, _KNOWN) or is_activation(module)
            or norm_kind(module) is not None)


def canonizers_for(model: torch.nn.Module) -> list:
    """Return the canonizers for ``model``, or raise :py:class:`UnsupportedModelError`.

    Every module class in the model must be either a leaf that a rule handles (linear layers, embeddings,
    dropout, element-wise activations, LayerNorm/RMSNorm) or listed in a family entry of
    :py:data:`~zennit_attn.canonizers.families.FAMILIES`; configuration options that a family does not support
    yet are refused too. The error names every module class that cannot be handled, with one module path each.

    Parameters
    ----------
    model: torch.nn.Module
        A Hugging Face model instance (any head or a base model).

    Returns
    -------
    list of zennit.canonizers.Canonizer
        Canonizers to pass to a composite (the composites of zennit-attn call this themselves).
    """
    modules = list(model.named_modules())
    # what is checked depends only on a module's class: one representative (and its first path) per class
    first: dict[type, tuple[str, torch.nn.Module]] = {}
    for name, module in modules:
        first.setdefault(type(module), (name, module))
    families = [family for family in FAMILIES
                if any(family.owns(module) for _, module in first.values())]

    unsupported: dict[str, str] = {}
    for name, module in first.values():
        if not _understood(module, families):
            unsupported.setdefault(f'{type(module).__module__}.{type(module).__qualname__}', name or '<root>')

    config = getattr(model, 'config', None)
    problems = [problem for family in families for problem in family.config_problems(config)]
    if unsupported or problems:
        lines = [f'  - {cls} (at {name})' for cls, name in sorted(unsupported.items())]
        lines += [f'  - {problem}' for problem in problems]
        raise UnsupportedModelError(
            f'zennit-attn cannot explain {type(model).__name__}: no AttnLRP rule or canonizer handles\n'
            + '\n'.join(lines)
            + f'\nSupported families: {", ".join(supported_families())}. Add a Family entry for this model '
            '(zennit_attn.canonizers.families) or pass canonizers=[...] to the composite yourself.'
        )

    canonizers = []
    for kind, field in ((OperandCanonizer, 'operands'), (InlineActivationCanonizer, 'inline'),
                        (InlineOperandCanonizer, 'inline_operands')):
        specs = {key: value for family in families for key, value in getattr(family, field).items()}
        if specs:
            canonizers.append(kind(specs))
    settings = {key: value for family in families for key, value in family.settings.items()}
    if settings:
        canonizers.append(SettingCanonizer(settings))
    return canonizers
