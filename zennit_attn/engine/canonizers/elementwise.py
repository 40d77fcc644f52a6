"""Element-wise functions, normalisers and normalisations in the classifying mode.

- element-wise non-linearities (tanh, SiLU, GELU, sigmoid, clamp, ``x ** 2``, sign, roundings, remainders, ...): the
  composite's activation rule (the identity rule, Eq. 9, not their zero or unit gradient), from the first input of a
  chain of them (``sigmoid(relu(x))`` keeps ``sigmoid(0)``: :py:func:`~zennit_attn.engine.rules.elementwise_identity`),
  also where the model computes them in place (``x.tanh_()``, ``F.silu(x, inplace=True)``); a bound or rounding is
  not a gate (CP-LRP) unless its input is one; ``exp`` is an attention-logit bias
  (:py:mod:`~zennit_attn.engine.canonizers.tracking`);
- normalisers ``g(x)`` (``rsqrt``, ``sqrt``, ``1 / x``, powers below 1, variances and norms): constants (Prop. 3.4)
  where they multiply the tensor they are computed from (``x * rsqrt(mean(x^2))``,
  :py:meth:`Elementwise.normaliser_use`) or divide anything (:py:meth:`Elementwise.division`); anywhere else values,
  with the activation rule (element-wise) or the rules of their decomposition (variances, norms:
  :py:data:`~.decompositions.STATISTICS`);
- ``layer_norm``, ``rms_norm`` and ``normalize``: the identity rule on ``x / g(x)`` (Prop. 3.4).
"""

from __future__ import annotations

import torch

from ..rules import elementwise_identity, layer_norm_identity
from .decompositions import DECOMPOSED, STATISTICS
from .graph import is_gate, normalises
from .products import replaced
from .registry import NORMALISER_RULES, OPERATIONS, in_place, keeps
from .tracking import ConstantTensor, tensors_of

__all__ = ['Elementwise']


class Elementwise:
    """The element-wise handlers of :py:class:`~zennit_attn.engine.canonizers.classifier.Classifier` (a mixin: it
    reads ``self.canonizer`` and dispatches through ``self.dispatch``)."""

    canonizer: object

    def elementwise(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """An element-wise function of one relevance-carrying tensor (rules ``elementwise``, ``bound``,
        ``normaliser``, ``power``, ``exp``): the activation rule, in place on a copy where the model computes it in
        place (the result copied back); an ``exp`` is a logit bias; normalisers and powers below 1 are marked (see
        :py:meth:`normaliser_use`)."""
        canonizer = self.canonizer
        if len(carrying) != 1 or not isinstance(args[0], torch.Tensor) or args[0] is not carrying[0]:
            what = (
                'a power with a relevance-carrying exponent'
                if name == 'pow'
                else 'an element-wise non-linearity of more than one relevance-carrying tensor'
            )
            canonizer.refuse(name, what)
        rule = OPERATIONS[name].rule
        gate = rule != 'bound' or is_gate(args[0])
        if in_place(func, kwargs):
            if name == 'exp':
                canonizer.refuse(func.__name__, 'an exponential computed in place')
            target, source = args[0], args[0].clone()  # the input's values, kept for the rule
            changed = source.clone()
            func(changed, *args[1:], **kwargs)
            output = target.copy_(canonizer.activation(source, changed, gate))
        else:
            output = canonizer.activation(args[0], func(*args, **kwargs), gate)
        if name == 'exp' and canonizer.runs:  # a decay of a sequence mixer that is not softmax attention
            canonizer.mark_term(output, (canonizer.module_path(), name, f'an exponential in {canonizer.runs[-1].name}'))
            return output
        if name == 'exp':
            return canonizer.mark_bias(output)
        if rule == 'normaliser' or (rule == 'power' and not _power_at_least_one(args, kwargs)):
            canonizer.normalisers[output] = name
        return output

    def statistic(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """A variance, standard deviation or norm (:py:data:`~.decompositions.STATISTICS`): its decomposition into
        operations with rules, marked as a normaliser (see :py:meth:`normaliser_use`)."""
        try:
            with self:
                output = STATISTICS[name](*args, **kwargs)
        except NotImplementedError as error:
            self.canonizer.refuse(name, f'{error} of relevance-carrying tensors')
        self.canonizer.normalisers[output[0] if isinstance(output, tuple) else output] = name
        return output

    def normaliser_use(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """An operation on normalisers ``g(x)`` (marked by :py:meth:`elementwise` and :py:meth:`statistic`).

        A function of normalisers alone (``rsqrt(var + eps)``: an operation of a shape or rule that keeps normalisers,
        :py:data:`~.registry.KEEPS`, :py:data:`~.registry.NORMALISER_RULES`) is a normaliser too. A product of ``x``
        with a normaliser computed from ``x`` (:py:func:`~zennit_attn.engine.canonizers.graph.normalises`) is a
        normalisation ``x / g'(x)``: the normaliser is a constant (Prop. 3.4); so is a divisor (see
        :py:meth:`division`). Anywhere else a normaliser is a value, with the rules its operations got (the identity
        rule of ``sqrt``, the decomposition of a variance): ``sqrt(softplus(h))``, ``h + var(h)``."""
        marks = self.canonizer.normalisers
        marked = [tensor for tensor in carrying if tensor in marks]
        entry = OPERATIONS.get(name)
        if len(marked) == len(carrying):
            output = self.dispatch(name, func, args, kwargs, carrying)
            if keeps('normaliser', name) or (entry is not None and entry.rule in NORMALISER_RULES):
                for tensor in tensors_of(output if isinstance(output, (list, tuple)) else [output], []):
                    if tensor.requires_grad:
                        marks[tensor] = name
            return output
        if entry is not None and entry.rule == 'product':
            others = [tensor for tensor in carrying if tensor not in marks]
            constants = {
                id(tensor): tensor.detach() for tensor in marked if any(normalises(tensor, other) for other in others)
            }
            if constants:
                args = replaced(args, constants)
                kwargs = {key: replaced(value, constants) for key, value in kwargs.items()}
                carrying = [tensor for tensor in carrying if id(tensor) not in constants]
        return self.dispatch(name, func, args, kwargs, carrying)

    @staticmethod
    def division(name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """``a / b``: a relevance-carrying divisor ``b`` is a constant (the normaliser ``g(x)`` of Prop. 3.4), except
        where both are gates (a renormalised softmax: the softmax of the selected logits, Prop. 3.1)."""
        numerator, denominator = (list(args) + [kwargs.get('other')])[:2]
        if not (isinstance(denominator, torch.Tensor) and denominator.requires_grad):
            return func(*args, **kwargs)
        if is_gate(denominator) and isinstance(numerator, torch.Tensor) and is_gate(numerator):
            return func(*args, **kwargs)
        rest = {key: value for key, value in kwargs.items() if key != 'other'}
        return func(numerator, denominator.detach(), *args[2:], **rest)

    def normalisation(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """``layer_norm``, ``rms_norm``, ``normalize``: the identity rule on ``x / g(x)`` (Prop. 3.4), the weight and
        bias (constants) linear."""
        input = args[0]
        if name == 'layer_norm':
            shape = args[1] if len(args) > 1 else kwargs['normalized_shape']
            weight = args[2] if len(args) > 2 else kwargs.get('weight')
            bias = args[3] if len(args) > 3 else kwargs.get('bias')
            eps = args[4] if len(args) > 4 else kwargs.get('eps', 1e-5)
            if any(isinstance(value, torch.Tensor) and value.requires_grad for value in (weight, bias)):
                self.canonizer.refuse(name, 'a normalisation whose weight carries relevance')
            return layer_norm_identity(input, len(shape), weight, bias, eps)
        with torch.no_grad():
            output = func(*args, **kwargs)
        if any(tensor.requires_grad for tensor in tensors_of(list(args[1:]) + list(kwargs.values()), [])):
            self.canonizer.refuse(name, 'a normalisation whose weight carries relevance')
        return elementwise_identity(input, output)

    def running_norm(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """``batch_norm(x, running_mean, running_var, weight, bias, training=False)``: with running statistics an
        affine map per channel, ``x w / sqrt(var + eps) + (b - mean w / sqrt(var + eps))``, linear in ``x`` (the
        plain gradient, Eq. 8), its shift a constant that absorbs relevance (noted); normalised by the statistics of
        the batch (``training=True``, or no running statistics; ``instance_norm``) it is a normalisation over
        positions, refused."""
        names = ('input', 'running_mean', 'running_var', 'weight', 'bias', 'training', 'momentum', 'eps')
        bound = dict(zip(names, args)) | kwargs
        mean, variance = bound.get('running_mean'), bound.get('running_var')
        if name != 'batch_norm' or bound.get('training', False) or mean is None or variance is None:
            self.canonizer.refuse(name, 'a normalisation by the statistics of the batch or of the positions')
        others = [value for key, value in bound.items() if key != 'input']
        if any(isinstance(value, torch.Tensor) and value.requires_grad for value in others):
            self.canonizer.refuse(name, 'a batch normalisation whose statistics or weight carry relevance')
        output = func(*args, **kwargs)
        with torch.no_grad():
            shift = func(torch.zeros_like(bound['input'][:1]), *list(args[1:]), **kwargs)
        if bool(shift.any()):
            constant = ConstantTensor(float(shift.abs().max()), shift.shape)
            self.canonizer.constants.append((self.canonizer.here(), constant))
        return output

    def decomposed(self, name: str, func, args, kwargs, carrying: list[torch.Tensor]):
        """A composite function (:py:data:`~.decompositions.DECOMPOSED`): its arithmetic, with the mode classifying
        each operation of it."""
        try:
            with self:
                return DECOMPOSED[name](*args, **kwargs)
        except NotImplementedError as error:
            self.canonizer.refuse(name, f'{error}, which is not softmax attention')


def _power_at_least_one(args, kwargs) -> bool:
    """Whether the exponent of ``pow`` is at least 1 (everywhere, for a tensor of exponents): below 1 a power can be a
    normaliser (``x ** -0.5``)."""
    exponent = args[1] if len(args) > 1 else kwargs.get('exponent')
    if isinstance(exponent, torch.Tensor):
        return bool((exponent >= 1).all())
    return isinstance(exponent, (int, float)) and exponent >= 1
