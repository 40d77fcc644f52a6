"""Rules for products of relevance-carrying tensors: how the relevance of a product is shared among its factors.

The engine (:py:mod:`zennit_attn.operations`) applies a composite's product rule to every product it meets,
whatever the model: element-wise products (``act(gate) * up``, routing weight times expert output), matrix products
(``Q K^T`` and ``A V`` of attention, also inside ``scaled_dot_product_attention``), products of the elements of one
tensor and scattered products. A rule sees the kind of each relevance-carrying factor, as the computation graph tells
it: ``'softmax'`` (a softmax output: attention weights, routing weights), ``'activation'`` (the output of an
element-wise non-linearity: a gate) or None (any other value), and returns each factor's share of the relevance.

In the gradient formulation (see :py:mod:`zennit_attn.rules`) a factor's share ``s`` multiplies its gradient:
the relevance of factor ``x_i`` of a product ``z = prod_k x_k`` is ``s_i z g``, so shares that sum to 1 conserve the
relevance of the product, and a share of 0 makes the factor a constant of the explanation.

- :py:class:`Uniform` (AttnLRP): ``1/N`` each (Prop. 3.2; for matrix products Prop. 3.3 with epsilon -> 0);
- :py:class:`ConstantGates` (CP-LRP, Ali et al. 2022): gates and softmax outputs are constants, the product is linear
  in the other factors;
- :py:class:`ConstantAttention` (RelP, Rezaei Jafari et al. 2025): softmax outputs are constants (CP-LRP's attention),
  every other product shares uniformly (AttnLRP's half rule on gates);
- :py:class:`HalfGates` (a relevance patching method): the half rule on gated products only, the plain gradient
  (share 1 for every factor) on every other product, attention included.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ['ProductRule', 'Uniform', 'ConstantGates', 'ConstantAttention', 'HalfGates', 'SOFTMAX', 'ACTIVATION']

#: The kind of a factor that is (a selection, rescaling or join of) softmax outputs.
SOFTMAX = 'softmax'
#: The kind of a factor that is (a selection, rescaling or join of) outputs of element-wise non-linearities.
ACTIVATION = 'activation'


class ProductRule:
    """How a product shares its relevance among its relevance-carrying factors; subclasses implement :py:meth:`shares`.

    :py:attr:`needs_kinds` says whether :py:meth:`shares` reads the kinds of the factors: where it does not, the
    engine does not look them up in the computation graph (a walk per factor).
    """

    #: whether :py:meth:`shares` depends on the kinds of the factors
    needs_kinds: bool = True

    def shares(self, kinds: Sequence[str | None]) -> tuple[float, ...]:
        """The share of each factor of a product of ``len(kinds)`` relevance-carrying factors, of the kinds given
        (:py:data:`SOFTMAX`, :py:data:`ACTIVATION` or None), in their order."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f'{type(self).__name__}()'

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash(type(self))


class Uniform(ProductRule):
    """AttnLRP's uniform rule (Prop. 3.2): each of the ``N`` factors of a product gets ``1/N`` of its relevance,
    whatever it is; for a matrix product ``A B`` the bilinear rule (Prop. 3.3) with epsilon -> 0, ``1/2`` each.

    Inside attention this gives query and key ``1/4`` of the relevance of the attention output (half of the scores'
    half, the softmax between them passing its share by its plain gradient, Prop. 3.1) and the values ``1/2``.
    """

    needs_kinds = False

    def shares(self, kinds: Sequence[str | None]) -> tuple[float, ...]:
        return (1.0 / len(kinds),) * len(kinds)


class ConstantGates(ProductRule):
    """CP-LRP (Ali et al. 2022), as the paper's baseline: the attention probabilities and the non-linear gates are
    constants where they enter a product, which is then linear in its other factors.

    - Where some factor is not a gate, every gate (softmax or activation output) gets 0 and the other factors share
      uniformly (``silu(gate) * up``: ``up`` gets everything; routing weights times an expert's output; ``A V``).
    - Where every factor is a gate, the softmax outputs are the constants and the activated values share
      (``softmax(q k^T) @ silu(v)``: an activated value).
    - Where every factor is a gate of one kind (``gelu(a) * silu(b)``, ``relu(x) * relu(x)``), no factor gates the
      others: the uniform rule (Prop. 3.2).
    """

    def shares(self, kinds: Sequence[str | None]) -> tuple[float, ...]:
        gates = [kind is not None for kind in kinds]
        if not all(gates):
            constant = gates
        elif any(kind == SOFTMAX for kind in kinds) and not all(kind == SOFTMAX for kind in kinds):
            constant = [kind == SOFTMAX for kind in kinds]
        else:
            constant = [False] * len(kinds)
        free = len(kinds) - sum(constant)
        return tuple(0.0 if fixed else 1.0 / free for fixed in constant)


class ConstantAttention(ProductRule):
    """RelP's rules for products (Rezaei Jafari, Eberle, Khakzar, Nanda 2025): the attention probabilities are
    constants where they enter a product with other factors (CP-LRP's attention: ``A V`` is linear in ``V``, no
    relevance reaches query and key), and every other product shares uniformly (Prop. 3.2: the half rule on
    ``act(gate) * up``).

    - Where some factor is a softmax output and some is not, the softmax outputs get 0 and the others share
      uniformly.
    - Otherwise the uniform rule (Prop. 3.2, 3.3).
    """

    def shares(self, kinds: Sequence[str | None]) -> tuple[float, ...]:
        constant = [kind == SOFTMAX for kind in kinds]
        if all(constant) or not any(constant):
            return (1.0 / len(kinds),) * len(kinds)
        free = len(kinds) - sum(constant)
        return tuple(0.0 if fixed else 1.0 / free for fixed in constant)


class HalfGates(ProductRule):
    """AttnLRP's rule on gated products only: a product with a gate (an activation output, ``act(gate) * up``) and
    no softmax output shares uniformly (Prop. 3.2: half each); every other product, the attention's ``q k^T`` and
    ``A V`` included, passes the plain gradient (share 1 for every factor: no rule).

    Together with the identity rule on the activation and the plain gradient through normalisations
    (:py:class:`~zennit_attn.composites.attnlrp.MLPRules`) this estimates activation patching best on
    SmolLM2 where the corrupted prompt differs in one token (see the guide "From heatmaps to circuits"): the LRP
    rules where the MLP's non-linearity is, the first-order gradient elsewhere.
    """

    needs_kinds = True

    def shares(self, kinds: Sequence[str | None]) -> tuple[float, ...]:
        if ACTIVATION in kinds and SOFTMAX not in kinds:
            return (1.0 / len(kinds),) * len(kinds)
        return (1.0,) * len(kinds)
