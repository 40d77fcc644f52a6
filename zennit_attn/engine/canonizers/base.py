"""Taps: where the operands of a module's inline products come from, as the family table declares them
(:py:mod:`~zennit_attn.engine.canonizers.families`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ..modules import Operand


@dataclass(frozen=True)
class Tap:
    """Where an operand comes from and what it is.

    Parameters
    ----------
    roles: str or tuple of str
        Role of the operand (see :py:data:`zennit_attn.engine.modules.ROLES`), or one role per section of the last
        dimension of a fused projection; stored as a tuple.
    sections: tuple of int, optional
        Section sizes (default: equal sections).
    index: int, optional
        For producers returning a tuple: the element that is the operand.
    """

    roles: tuple[str, ...]
    sections: tuple[int, ...] | None = None
    index: int | None = None

    def __post_init__(self):
        object.__setattr__(self, 'roles', (self.roles,) if isinstance(self.roles, str) else tuple(self.roles))
        if self.sections is not None:
            object.__setattr__(self, 'sections', tuple(int(size) for size in self.sections))
        self.operand()  # validates the roles and sections

    @classmethod
    def ensure(cls, spec) -> Tap:
        """``spec`` itself if it is a Tap, else ``Tap(spec)`` (a role or a tuple of roles)."""
        return spec if isinstance(spec, cls) else cls(spec)

    def operand(self) -> Operand:
        """A new :py:class:`~zennit_attn.engine.modules.Operand` module for this tap."""
        return Operand(self.roles, self.sections)

    def mask(self, role: str, size: int) -> torch.Tensor:
        """``[size]`` boolean mask of the entries of a last dimension of ``size`` that belong to ``role``."""
        parts = [
            torch.full((length,), name == role) for name, length in zip(self.roles, self.operand().section_sizes(size))
        ]
        return torch.cat(parts)


#: ``module -> {child attribute: role, roles or Tap}``: where the operands of a module's products come from.
OperandSpec = Callable[[torch.nn.Module], Mapping[str, object]]


def parse_taps(spec: OperandSpec | Mapping[str, object], module: torch.nn.Module) -> dict[str, Tap]:
    """The taps of ``module``: ``{child attribute or parameter name: Tap}`` from an operand specification, which
    is a mapping or a function of the module returning one, with a role, a tuple of roles or a :py:class:`Tap` per
    name. The one reader of the family table's operand entries (canonizers, composites and methods use it)."""
    items = spec(module) if callable(spec) else spec
    return {name: Tap.ensure(tap) for name, tap in items.items()}
