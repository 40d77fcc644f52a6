"""Products in the classifying mode: the composite's product rule (:py:mod:`zennit_attn.engine.rules.products`) on
every product of relevance-carrying tensors, whatever its spelling.

- multilinear operations (``a * b``, ``q @ k^T``, ``einsum``, ``linear`` with a relevance-carrying weight): the rule's
  share for each relevance-carrying factor (Prop. 3.2; Prop. 3.3 for matrix products), an additive term (``addmm``'s
  input, ``linear``'s bias) keeping its plain gradient; one relevance-carrying factor: linear, the plain gradient;
- the product of the elements of one tensor (``prod``): the rule's share for N factors of one kind;
- scatters that multiply (``scatter_reduce(..., 'prod')``): the rule per output, over the factors scattered to it;
- ``scaled_dot_product_attention``: the rule on its two products, ``q k^T`` and ``softmax(.) V`` (Props. 3.1, 3.3);
- an attention sink ``(softmax(z) @ V) * sigmoid(logsumexp(z) - s)``: the product of the extended softmax
  ``softmax([z, s])`` with ``[V; 0]`` (see :py:mod:`~zennit_attn.engine.canonizers.graph`);
- linear attention (a contraction of relevance-carrying factors without a softmax, used in another product) is
  refused; inside modules named like state-space or linear-attention mixers, products are gates of a declared
  recurrence (:py:mod:`~zennit_attn.engine.canonizers.recurrences`), refused elsewhere.
"""

from __future__ import annotations

import torch

from ..rules import scaled_gradient
from ..rules.products import SOFTMAX
from .graph import attention_scores, gate_kind, is_outer_product, reaches, sink_scores
from .registry import ADDITIVE, OPERATIONS, in_place

__all__ = ['Products', 'replaced']


class Products:
    """The product handlers of :py:class:`~zennit_attn.engine.canonizers.classifier.Classifier` (a mixin: it reads
    ``self.canonizer``, the :py:class:`~zennit_attn.engine.canonizers.operations.OperationCanonizer` whose
    ``product_rule`` applies)."""

    canonizer: object

    def kinds(self, factors: list[torch.Tensor]) -> list[str | None]:
        """The kinds of ``factors`` (softmax outputs, activation outputs or values) where the active product rule
        reads them, else Nones (no walk of the graph)."""
        if not self.canonizer.product_rule.needs_kinds:
            return [None] * len(factors)
        return [gate_kind(tensor) for tensor in factors]

    def product(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """A multilinear operation: the product rule on its relevance-carrying factors (see the module's list)."""
        factors = self.factors(name, args, kwargs, carrying)
        if len(factors) < 2:
            return func(*args, **kwargs)
        if in_place(func, kwargs):
            self.canonizer.refuse(func.__name__, 'an in-place product of relevance-carrying tensors')
        contraction = self.refuse_linear_attention(name, factors)
        sinks = [tensor for tensor in factors if sink_scores(tensor) is not None]
        shares = self.sink_shares(factors, sinks) if sinks else self.canonizer.product_rule.shares(self.kinds(factors))
        output = self.shared(func, args, kwargs, carrying, factors, shares)
        if contraction:  # recorded before a constant factor leaves the graph
            self.canonizer.contractions.add(output.grad_fn)
        return output

    @staticmethod
    def shared(func, args, kwargs, carrying: list[torch.Tensor], factors: list[torch.Tensor], shares):
        """Run the product with each factor's gradient scaled by its share; where every relevance-carrying tensor is a
        factor with one share, the output's gradient is scaled once instead (one pass over the output in the backward
        instead of one per factor)."""
        if len(set(shares)) == 1 and len(factors) == len(carrying):
            return scaled_gradient(func(*args, **kwargs), shares[0])
        scales, scaled = {}, {}
        for tensor, share in zip(factors, shares):
            scales[id(tensor)] = share

        def swap(value):
            # each distinct tensor scaled once: ``x * x`` gives x the gradient 2 x g / 2, its relevance x^2 g
            if isinstance(value, torch.Tensor) and value.requires_grad:
                if id(value) not in scaled:
                    scaled[id(value)] = scaled_gradient(value, scales.get(id(value), 1.0))
                return scaled[id(value)]
            if isinstance(value, (list, tuple)):
                return type(value)(swap(item) for item in value)
            return value

        return func(*swap(tuple(args)), **{key: swap(value) for key, value in kwargs.items()})

    def factors(self, name: str, args, kwargs, carrying: list[torch.Tensor]) -> list[torch.Tensor]:
        """The relevance-carrying tensors among the factors of a product: without the additive term of ``addmm`` and
        its kind and the bias of ``linear`` and the convolutions (:py:data:`~.registry.ADDITIVE`), which keep their
        plain gradient; a tensor that is both refused."""
        position, key = ADDITIVE.get(name, (None, None))
        term = args[position] if position is not None and len(args) > position else kwargs.get(key)
        if not (isinstance(term, torch.Tensor) and term.requires_grad):
            return carrying
        factors = list(carrying)
        factors.pop(next(index for index, tensor in enumerate(factors) if tensor is term))
        if any(tensor is term for tensor in factors):
            self.canonizer.refuse(name, 'a product with a relevance-carrying tensor that is also its additive term')
        return factors

    def refuse_linear_attention(self, name: str, factors: list[torch.Tensor]) -> bool:
        """Check a product of several relevance-carrying tensors inside a sequence mixer that is not softmax
        attention (:py:meth:`mixer_product`), and refuse a product with a contraction of relevance-carrying tensors
        none of which is a softmax output (``q (k^T v)``: linear attention outside a declared recurrence). Returns
        whether the product is such a contraction itself (a matrix product or a broadcast outer product of factors
        none of which is a softmax output), which :py:meth:`product` records."""
        canonizer = self.canonizer
        if canonizer.runs:
            self.mixer_product(name, canonizer.runs[-1], factors)
        if canonizer.contractions and any(reaches(tensor, canonizer.contractions) for tensor in factors):
            canonizer.refuse(
                name,
                'a product with a contraction of relevance-carrying tensors that has no softmax (q (k^T v): linear '
                'attention, not softmax attention)',
                hint='AttnLRP (Achtibat et al. 2024) defines rules for softmax attention; zennit-attn explains '
                'linear attention where a declared recurrence computes it (zennit_attn.engine.canonizers.recurrences: '
                'its keys and queries held constant), not written inline.',
            )
        contraction = OPERATIONS[name].contraction or (
            name == 'mul' and len(factors) == 2 and is_outer_product(*factors)
        )
        return contraction and all(gate_kind(tensor) != SOFTMAX for tensor in factors)

    def mixer_product(self, name: str, run, factors: list[torch.Tensor]) -> None:
        """A product of several relevance-carrying tensors (``factors``) inside a module named like a sequence mixer
        (``run``, a :py:class:`~zennit_attn.engine.canonizers.recurrences.MixerRun`): inside a declared recurrence,
        refused unless the recurrence has gates (the product rule applies to them); in the mixer's own code, noted
        (the mixer is refused when it returns without having run a declared recurrence, unless a softmax output was
        a factor of one of its products: then it computes softmax attention, whatever its name)."""
        run.softmax = run.softmax or any(gate_kind(tensor) == SOFTMAX for tensor in factors)
        recurrence = run.current
        if recurrence is not None and not recurrence.gates:
            self.canonizer.refuse(
                name,
                f'a product of relevance-carrying tensors inside the recurrence {recurrence.name} '
                f'({recurrence.layer}), which is linear in its values once its constants are held',
            )
        if recurrence is None and run.product is None:
            run.product = (name, self.canonizer.module_path())

    def sink_shares(self, factors: list[torch.Tensor], sinks: list[torch.Tensor]) -> tuple[float, ...]:
        """``(softmax(z) @ V) * sigmoid(logsumexp(z) - s)`` is ``softmax([z, s]) @ [V; 0]`` (an attention sink): the
        product rule on that one product gives the extended softmax its share of the attention (AttnLRP 1/2, CP-LRP
        0), which the sink mass passes on, and the attention output its full gradient (its matrix product already
        shared it)."""
        others = [tensor for tensor in factors if tensor is not sinks[0]]
        rule = self.canonizer.product_rule
        share = rule.shares([SOFTMAX, None])[0]
        if (
            len(sinks) != 1
            or len(others) != 1
            or not (share == 0 or any(node is sink_scores(sinks[0]) for node in attention_scores(others[0])))
        ):
            self.canonizer.refuse(
                'sigmoid(logsumexp)',
                'an attention-sink mass that does not scale the attention output softmax(z) @ V of its own scores z',
            )
        return tuple(share if tensor is sinks[0] else 1.0 for tensor in factors)

    def solve(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """A linear solve ``A^-1 B`` (``linalg.solve_triangular(A, B)``, ``linalg.solve(A, B)``: the UT transform of a
        chunked delta rule): linear in the right-hand side ``B``, the plain gradient; a relevance-carrying matrix
        ``A`` (the inverse of a relevance-carrying tensor) is refused."""
        matrix = args[0] if args else kwargs.get('A', kwargs.get('input'))
        if isinstance(matrix, torch.Tensor) and matrix.requires_grad:
            self.canonizer.refuse(name, 'a linear solve with a relevance-carrying matrix (its inverse)')
        return func(*args, **kwargs)

    def elements(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """``prod`` of the elements of one tensor along ``dim`` (all without): N factors of one kind, the product
        rule's share for N (1/N: Prop. 3.2)."""
        dim = args[1] if len(args) > 1 else kwargs.get('dim')
        count = carrying[0].numel() if dim is None else carrying[0].shape[dim]
        share = self.canonizer.product_rule.shares(self.kinds(carrying[:1]) * max(count, 1))[0]
        return scaled_gradient(func(*args, **kwargs), share)

    def scatter(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """A scatter: the plain gradient for sums, means, maxima and minima; for a product (``reduce='prod'``,
        ``'multiply'``) each output is the product of the input's entry (unless ``include_self=False``) and the
        source entries scattered to it: a factor the product rule makes constant (CP-LRP: a gate among input and
        source) is detached, and the output's gradient is divided by the number of its other relevance-carrying
        factors (Prop. 3.2)."""
        reduce = kwargs.get('reduce', args[4] if len(args) > 4 else None)
        if reduce not in ('prod', 'multiply'):
            return func(*args, **kwargs)
        if in_place(func, kwargs):
            self.canonizer.refuse(func.__name__, 'an in-place product of relevance-carrying tensors')
        input = args[0]
        dim = args[1] if len(args) > 1 else kwargs['dim']
        index = args[2] if len(args) > 2 else kwargs['index']
        source = args[3] if len(args) > 3 else next(kwargs[key] for key in ('src', 'source', 'value') if key in kwargs)
        factors = [tensor for tensor in (input, source) if isinstance(tensor, torch.Tensor) and tensor.requires_grad]
        shares = self.canonizer.product_rule.shares(self.kinds(factors)) if len(factors) > 1 else (1.0,)
        detached = {id(tensor): tensor.detach() for tensor, share in zip(factors, shares) if share == 0}
        if detached:
            args, kwargs = replaced(args, detached), {key: replaced(value, detached) for key, value in kwargs.items()}
            input, source = (replaced(item, detached) for item in (input, source))
        output = func(*args, **kwargs)
        with torch.no_grad():
            counts = torch.zeros_like(output)
            if input.requires_grad and kwargs.get('include_self', True):
                counts += 1
            if isinstance(source, torch.Tensor) and source.requires_grad:
                if name == 'index_reduce':
                    counts = counts.index_add(dim, index, torch.ones_like(source, dtype=output.dtype))
                else:
                    counts = counts.scatter_add(
                        dim, index, torch.ones(index.shape, dtype=output.dtype, device=output.device)
                    )
        return scaled_gradient(output, 1 / counts.clamp_min(1))

    def attention(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """``scaled_dot_product_attention(q, k, v, mask)``: the product rule on ``q k^T`` and on ``softmax(.) V``,
        the softmax between them passing its share by its plain gradient (Prop. 3.1): query and key get their share
        of the scores' share (AttnLRP: 1/4 each), the values their share of the attention (AttnLRP: 1/2); a float mask
        that carries relevance is an additive term of the logits, the scores' share (CP-LRP: query, key and mask
        constant)."""
        names = ('query', 'key', 'value')
        args = list(args)
        operands = [args[index] if index < len(args) else kwargs.get(key) for index, key in enumerate(names)]
        biased = [tensor for tensor in operands if isinstance(tensor, torch.Tensor) and tensor in self.canonizer.biases]
        if biased:  # an exponential in query, key or value
            self.canonizer.refuse_bias('exp (used by scaled_dot_product_attention)', self.canonizer.biases[biased[0]])
        kinds = self.kinds([tensor for tensor in operands if isinstance(tensor, torch.Tensor)])
        rule = self.canonizer.product_rule
        scores_share, value_share = rule.shares([SOFTMAX, kinds[2]])
        query_share, key_share = rule.shares(kinds[:2])
        scales = {'query': query_share * scores_share, 'key': key_share * scores_share, 'value': value_share}
        for index, key in enumerate(names):
            if index < len(args):
                if isinstance(args[index], torch.Tensor) and args[index].requires_grad:
                    args[index] = scaled_gradient(args[index], scales[key])
            elif isinstance(kwargs.get(key), torch.Tensor) and kwargs[key].requires_grad:
                kwargs[key] = scaled_gradient(kwargs[key], scales[key])
        if len(args) > 3 and isinstance(args[3], torch.Tensor) and args[3].requires_grad:
            args[3] = scaled_gradient(args[3], scores_share)
        elif isinstance(kwargs.get('attn_mask'), torch.Tensor) and kwargs['attn_mask'].requires_grad:
            kwargs['attn_mask'] = scaled_gradient(kwargs['attn_mask'], scores_share)
        return func(*args, **kwargs)


def replaced(value, tensors: dict[int, torch.Tensor]):
    """``value`` (a tensor, or lists and tuples of them) with the tensors whose ids are keys of ``tensors`` replaced."""
    if isinstance(value, torch.Tensor):
        return tensors.get(id(value), value)
    if isinstance(value, (list, tuple)):
        return type(value)(replaced(item, tensors) for item in value)
    return value
