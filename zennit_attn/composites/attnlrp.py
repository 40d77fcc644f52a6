"""The AttnLRP composites for language models (epsilon rule on linear layers)."""
from __future__ import annotations

from typing import Sequence

import torch
from zennit.core import Composite, Hook

from ..canonizers import canonizers_for
from ..layers import Operand, Product, MatMul
from ..rules import (
    BilinearEpsilon, ConstantFactors, ConstantOperand, Epsilon, Identity, NormIdentity, RelevanceBoundary,
    Softmax, UniformOperand, UniformProduct,
)
from ..types import LINEARS, is_activation, norm_kind


class AttnLRPComposite(Composite):
    """Base of the AttnLRP composites: maps module types to rules and picks canonizers for the model.

    The root module gets a :py:class:`~zennit_attn.rules.RelevanceBoundary`, so that, as with any zennit
    composite, relevance given at the output (``grad_outputs``) comes out as relevance at the floating-point
    inputs. Use as ``with composite.context(model) as modified: ...``; everything is undone on exit, also when
    the block raises.

    Parameters
    ----------
    epsilon: float
        Stabiliser of the epsilon rule (Eq. 8) on linear layers and of the matmul rule (Prop. 3.3) on
        :py:class:`~zennit_attn.layers.MatMul` modules. 0 (default) is the exact limit, which needs no
        stabiliser in the gradient formulation and registers nothing on linear layers.
    canonizers: sequence of zennit.canonizers.Canonizer, optional
        Canonizers to apply. By default :py:func:`~zennit_attn.canonizers.canonizers_for` chooses them for the
        model at registration, and raises for models it does not know.
    """
    #: rule for the operands of inline products
    operand_rule: type = UniformOperand

    def __init__(self, epsilon: float = 0.0, canonizers: Sequence | None = None):
        if epsilon < 0:
            raise ValueError(f'epsilon must be >= 0, got {epsilon}')
        self.epsilon = epsilon
        self.fixed_canonizers = None if canonizers is None else list(canonizers)
        super().__init__(module_map=self.mapping, canonizers=self.fixed_canonizers)

    def register(self, module: torch.nn.Module) -> None:
        self.remove()
        self.canonizers = canonizers_for(module) if self.fixed_canonizers is None else self.fixed_canonizers
        try:
            super().register(module)
        except BaseException:
            self.remove()
            raise

    def mapping(self, ctx: dict, name: str, module: torch.nn.Module) -> Hook | None:
        """Return the rule for ``module`` (``name`` is its path; '' is the root)."""
        if name == '':
            return RelevanceBoundary()
        if isinstance(module, Operand):
            return self.operand_rule()
        if isinstance(module, Product):
            return self.product_rule()
        if isinstance(module, MatMul):
            return self.matmul_rule()
        if is_activation(module):
            return Identity()
        if norm_kind(module) is not None:
            return NormIdentity()
        if isinstance(module, torch.nn.Softmax):
            return Softmax()
        if isinstance(module, LINEARS):
            return Epsilon(self.epsilon)
        return None

    def product_rule(self) -> Hook:
        return UniformProduct()

    def matmul_rule(self) -> Hook:
        return BilinearEpsilon(self.epsilon)


class AttnLRPEpsilon(AttnLRPComposite):
    """AttnLRP for language models (Sec. 3): epsilon rule on linear layers, identity rule on activations and
    normalisations, softmax rule (Prop. 3.1) and uniform/bilinear rules (Props. 3.2, 3.3) in attention and
    gated MLPs."""


class CPLRPEpsilon(AttnLRPComposite):
    """CP-LRP baseline (Ali et al. 2022), as in the paper's comparisons: the attention probabilities and the
    non-linear gate of gated MLPs are constants (no relevance through the softmax or the gate); everything
    else as in :py:class:`AttnLRPEpsilon`. For :py:class:`~zennit_attn.layers.Product` and
    :py:class:`~zennit_attn.layers.MatMul` modules the first factor is the constant one (gate, attention
    matrix)."""
    operand_rule = ConstantOperand

    def product_rule(self) -> Hook:
        return ConstantFactors((0,))

    def matmul_rule(self) -> Hook:
        return ConstantFactors((0,))
