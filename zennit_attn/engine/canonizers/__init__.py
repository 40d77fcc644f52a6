"""Instance-level canonizers that make transformer models attributable with AttnLRP.

:py:func:`canonizers_for` inspects a model, checks that every module class in it is understood, and returns
the canonizers for it; the composites call it when no canonizers are given. :py:func:`block_stacks` finds the
transformer blocks (:py:mod:`zennit_attn.engine.canonizers.blocks`).
"""

from __future__ import annotations

import torch

from ..kinds import CONVOLUTIONS, LINEARS, NEUTRAL, UnsupportedModelError, is_activation, norm_kind
from ..modules import Logits, MatMul, Operand, Product
from .base import (
    INLINE_FUNCTIONS,
    InlineActivationCanonizer,
    InlineOperandCanonizer,
    OperandCanonizer,
    SettingCanonizer,
    Tap,
    parse_taps,
)
from .blocks import NoBlocksError, attention_linears, block_stacks, transformer_blocks, vision_towers
from .families import ATTENTION_OUTPUTS, FAMILIES, Family, family_of, operand_taps
from .general import GeneralCanonizer

__all__ = [
    'canonizers_for',
    'supported_families',
    'UnsupportedModelError',
    'OperandCanonizer',
    'InlineActivationCanonizer',
    'InlineOperandCanonizer',
    'SettingCanonizer',
    'Tap',
    'Family',
    'FAMILIES',
    'INLINE_FUNCTIONS',
    'ATTENTION_OUTPUTS',
    'family_of',
    'operand_taps',
    'parse_taps',
    'block_stacks',
    'transformer_blocks',
    'NoBlocksError',
    'GeneralCanonizer',
    'table_problems',
    'attention_linears',
    'vision_towers',
]

#: Leaf modules that a composite has a rule for or that need none.
_KNOWN = LINEARS + CONVOLUTIONS + NEUTRAL + (Operand, Product, MatMul, torch.nn.Softmax)


def supported_families() -> list[str]:
    """Names of the model families with a table entry."""
    return [family.name for family in FAMILIES]


def _understood(module: torch.nn.Module, families: list[Family]) -> bool:
    if any(family.owns(module) for family in families):
        return True
    return (
        type(module) is Logits or isinstance(module, _KNOWN) or is_activation(module) or norm_kind(module) is not None
    )


def table_problems(model: torch.nn.Module) -> list[str]:
    """What the family table does not cover in ``model``: one line per module class that is neither a known leaf
    nor listed (with one module path), and per configuration value a listed family does not support; empty when
    the table covers the model."""
    first: dict[type, tuple[str, torch.nn.Module]] = {}
    for name, module in model.named_modules():
        first.setdefault(type(module), (name, module))
    families = [family for family in FAMILIES if any(family.owns(module) for _, module in first.values())]
    unsupported: dict[str, str] = {}
    for name, module in first.values():
        if not _understood(module, families):
            unsupported.setdefault(f'{type(module).__module__}.{type(module).__qualname__}', name or '<root>')
    config = getattr(model, 'config', None)
    lines = [f'{cls} (at {name})' for cls, name in sorted(unsupported.items())]
    return lines + [problem for family in families for problem in family.config_problems(config)]


def canonizers_for(model: torch.nn.Module, constant_gates: bool = False, general: bool | None = None) -> list:
    """Return the canonizers for ``model``.

    A model whose every module class is either a leaf that a rule handles (linear layers, embeddings, dropout,
    element-wise activations, normalisations) or listed in a family entry of
    :py:data:`~zennit_attn.engine.canonizers.families.FAMILIES` (with supported configuration values) gets the table's
    canonizers; any other model gets the :py:class:`~zennit_attn.engine.canonizers.general.GeneralCanonizer`, which
    applies the rules at the operations the model performs and raises :py:class:`UnsupportedModelError` for an
    operation without a rule (naming it and the module path).

    Parameters
    ----------
    model: torch.nn.Module
        A Hugging Face or timm model instance (any head or a base model).
    constant_gates: bool
        For the general mechanism: CP-LRP's constant softmax outputs and gates (the composites set it).
    general: bool, optional
        True: the general mechanism also for a model the table covers; False: the table only (raise
        :py:class:`UnsupportedModelError` listing what it does not cover); None (default): the table where it
        covers the model, else the general mechanism.

    Returns
    -------
    list of zennit.canonizers.Canonizer
        Canonizers to pass to a composite (the composites of zennit-attn call this themselves).
    """
    problems = table_problems(model) if not general else ['general mechanism requested']
    if problems and general is not False:
        return [GeneralCanonizer(constant_gates)]
    if problems:
        raise UnsupportedModelError(
            f'zennit-attn cannot explain {type(model).__name__} with the family table: no table entry handles\n'
            + '\n'.join(f'  - {problem}' for problem in problems)
            + f'\nFamilies of the table: {", ".join(supported_families())}. Add a Family entry for this model '
            '(zennit_attn.engine.canonizers.families), or let the general mechanism explain it (general=None).'
        )
    modules = [module for _, module in model.named_modules()]
    families = [family for family in FAMILIES if any(family.owns(module) for module in modules)]
    canonizers = []
    for kind, field in (
        (OperandCanonizer, 'operands'),
        (InlineActivationCanonizer, 'inline'),
        (InlineOperandCanonizer, 'inline_operands'),
    ):
        specs = {key: value for family in families for key, value in getattr(family, field).items()}
        if specs:
            canonizers.append(kind(specs))
    settings = {key: value for family in families for key, value in family.settings.items()}
    if settings:
        canonizers.append(SettingCanonizer(settings))
    return canonizers
