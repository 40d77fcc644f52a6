"""Instance-level canonizers that make transformer models attributable with AttnLRP.

:py:func:`canonizers_for` inspects a model, checks that every module class in it is understood, and returns
the canonizers for it; the composites call it when no canonizers are given.
"""
from __future__ import annotations

import torch

from ..layers import Operand, Product, MatMul
from ..types import LINEARS, NEUTRAL, is_activation, norm_kind
from .base import InlineActivationCanonizer, OperandCanonizer, INLINE_FUNCTIONS
from .families import FAMILIES, Family

__all__ = [
    'canonizers_for', 'supported_families', 'UnsupportedModelError', 'OperandCanonizer',
    'InlineActivationCanonizer', 'Family', 'FAMILIES', 'INLINE_FUNCTIONS',
]

#: Leaf modules that a composite has a rule for or that need none.
_LEAVES = LINEARS + NEUTRAL + (Operand, Product, MatMul, torch.nn.Softmax)


class UnsupportedModelError(TypeError):
    """A model contains modules that zennit-attn has no rule or canonizer for."""


def supported_families() -> list[str]:
    """Names of the model families with a table entry."""
    return [family.name for family in FAMILIES]


def _understood(module: torch.nn.Module, known: dict[str, str]) -> bool:
    cls = type(module)
    package = known.get(cls.__name__)
    if package is not None and cls.__module__.startswith(package + '.'):
        return True
    return isinstance(module, _LEAVES) or is_activation(module) or norm_kind(module) is not None


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
    families = [family for family in FAMILIES if any(type(module).__name__ in family.classes for _, module in modules)]
    known = {name: family.package for family in families for name in family.classes}

    unsupported: dict[str, str] = {}
    for name, module in modules:
        if not _understood(module, known):
            unsupported.setdefault(f'{type(module).__module__}.{type(module).__qualname__}', name or '<root>')

    config = getattr(model, 'config', None)
    problems = []
    for family in families:
        for key, expected in family.config.items():
            for conf in (config, getattr(config, 'text_config', None)):
                if conf is not None and getattr(conf, key, expected) != expected:
                    problems.append(f'config.{key}={getattr(conf, key)!r} (supported: {expected!r})')
    if unsupported or problems:
        lines = [f'  - {cls} (at {name})' for cls, name in sorted(unsupported.items())]
        lines += [f'  - {problem}' for problem in problems]
        raise UnsupportedModelError(
            f'zennit-attn cannot explain {type(model).__name__}: no AttnLRP rule or canonizer handles\n'
            + '\n'.join(lines)
            + f'\nSupported families: {", ".join(supported_families())}. Add a Family entry for this model '
            '(zennit_attn.canonizers.families) or pass canonizers=[...] to the composite yourself.'
        )

    operands, inline = {}, {}
    for family in families:
        operands.update(family.operands)
        inline.update(family.inline)
    canonizers = []
    if operands:
        canonizers.append(OperandCanonizer(operands))
    if inline:
        canonizers.append(InlineActivationCanonizer(inline))
    return canonizers
