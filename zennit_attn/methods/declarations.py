"""What each attribution method of ``explain(..., method=NAME)`` is, declared once and without importing it: its
name, its hyperparameters with their defaults and checks, what it does (flags) and where its implementation lives.

One :py:class:`Declaration` per method, in :py:data:`DECLARATIONS` (in the order of the paper's tables). This module
imports neither torch nor any other module of the library, so that the command line reads it for its manual and its
argument checks in a fraction of a second; the library's registry (:py:data:`zennit_attn.methods.registry.METHODS`)
is built from the same declarations and imports an implementation on its first use. The flags:

- ``backward``: the method runs a backward pass (``checkpointing=True`` applies);
- ``latent``: it is one forward and one backward pass whose gradient times activation is relevance at every tensor
  (``latent=`` and ``condition=`` work with it);
- ``neuron``: it reads the explained value through the task, so it can explain a
  :py:class:`~zennit_attn.latent.Neuron` target;
- ``lrp``: it is LRP and takes ``composite=`` (a zennit composite; default chosen by the method for the modality);
- ``attention_maps``: it reads the attention probabilities
  (:py:func:`~zennit_attn.methods.attention.attention_maps`), which encoder-decoder models do not give it.

A method whose implementation needs packages beyond the core dependencies names them (``requires``) and the extra of
``zennit-attn`` that installs them (``extra``): KernelSHAP needs captum and scikit-learn
(``pip install 'zennit-attn[baselines]'``).

Hyperparameters have the defaults of the paper's appendix A.1 (Achtibat et al., ICML 2024); each implementation's
documentation states its cost in forward and backward passes.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    'Check',
    'Parameter',
    'Declaration',
    'DECLARATIONS',
    'lrp_methods',
    'positive',
    'between',
    'one_of',
    'integer',
    'seed',
    'flag',
]

#: A parameter check: ``(value, name) -> value`` (normalised), raising a ValueError that names the parameter.
Check = Callable[[Any, str], Any]


# ----------------------------------------------------------------------------------------------------------- checks
def positive(value, name: str) -> int:
    """A positive integer parameter."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    return int(value)


def _bounds(low: float, high: float) -> str:
    """How :py:func:`between` names its interval: ``in [low, high]``, ``>= low``, ``<= high`` or nothing."""
    if math.isfinite(low) and math.isfinite(high):
        return f'in [{low}, {high}]'
    if math.isfinite(low):
        return f'>= {low}'
    if math.isfinite(high):
        return f'<= {high}'
    return ''


def between(low: float, high: float) -> Check:
    """The check of a finite real parameter in ``[low, high]`` (a bound may be infinite; the value may not)."""
    bounds = _bounds(low, high)

    def check(value, name: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            raise ValueError(f'{name} must be a finite number {bounds}'.rstrip() + f', got {value!r}')
        return float(value)

    return check


def one_of(*options: str) -> Check:
    """The check of a parameter that takes one of ``options``."""

    def check(value, name: str) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValueError(f'{name} must be one of {", ".join(map(repr, options))}, got {value!r}')
        return value

    return check


def integer(value, name: str) -> int:
    """An integer parameter (of any sign)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f'{name} must be an integer, got {value!r}')
    return int(value)


def seed(value, name: str) -> int | None:
    """A random seed: an integer, or None for the global random state."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ValueError(f'{name} must be an integer or None, got {value!r}')
    return None if value is None else int(value)


def flag(value, name: str) -> bool:
    """A boolean parameter."""
    if not isinstance(value, bool):
        raise ValueError(f'{name} must be True or False, got {value!r}')
    return value


# ----------------------------------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Parameter:
    """A hyperparameter of a method: its name, its default and its check.

    Attributes
    ----------
    name: str
        The keyword of ``explain(..., NAME=value)`` (``--param NAME=VALUE`` on the command line).
    default
        Its value where it is not given (the implementation's own default, checked when it is loaded).
    check: callable
        ``check(value, name) -> value``, normalising the value and raising a ValueError that names the parameter.
    """

    name: str
    default: Any
    check: Check = field(repr=False, compare=False)


@dataclass(frozen=True)
class Declaration:
    """One attribution method of :py:data:`DECLARATIONS`: what it is, without importing it.

    Attributes
    ----------
    name: str
        The name ``explain(..., method=name)`` and ``--method`` take.
    implementation: str
        Where the implementation lives: ``'module:function'``, the module in :py:mod:`zennit_attn.methods`. The
        function takes ``(task, position, target, **params)`` (and ``composite`` for the LRP methods) and returns the
        task's explanation.
    backward: bool
        It runs a backward pass (see the module's description for each flag).
    latent: bool
        It is one forward and one backward pass carrying relevance (``latent=``, ``condition=``).
    neuron: bool
        It can explain a :py:class:`~zennit_attn.latent.Neuron` target.
    lrp: bool
        It is LRP and takes ``composite=``.
    attention_maps: bool
        It reads the attention probabilities.
    parameters: tuple of Parameter
        Its hyperparameters (``composite`` not included), in the order of the implementation's signature.
    requires: tuple of (str, str)
        ``(module, distribution)`` of each package the implementation imports beyond the core dependencies.
    extra: str or None
        The extra of ``zennit-attn`` that installs them (``pip install 'zennit-attn[EXTRA]'``).
    """

    name: str
    implementation: str
    backward: bool
    latent: bool = False
    neuron: bool = False
    lrp: bool = False
    attention_maps: bool = False
    parameters: tuple[Parameter, ...] = ()
    requires: tuple[tuple[str, str], ...] = ()
    extra: str | None = None

    @property
    def params(self) -> Mapping[str, Any]:
        """Hyperparameter name -> default (``composite`` not included)."""
        return MappingProxyType({parameter.name: parameter.default for parameter in self.parameters})

    @property
    def checks(self) -> Mapping[str, Check]:
        """Hyperparameter name -> its check."""
        return MappingProxyType({parameter.name: parameter.check for parameter in self.parameters})

    def check(self, params: Mapping[str, Any]) -> dict:
        """``params`` checked by name and value (integers as int, reals as float); defaults are not added.

        ``composite`` is accepted by the LRP methods and passed on as it is (that it is a zennit composite is checked
        by :py:meth:`zennit_attn.methods.registry.Method.check`, which imports zennit).

        Raises
        ------
        TypeError
            For ``params`` that are not a mapping, or a parameter the method does not take.
        ValueError
            For a value out of its range or of the wrong kind (the message names the parameter), or ``composite``
            given to a method that is not LRP.
        """
        if not isinstance(params, Mapping):
            raise TypeError(
                f'the parameters of {self.name} must be a mapping of name to value, got {type(params).__name__}'
            )
        params = dict(params)
        composite = params.pop('composite', None)
        self._refuse_unknown(params)
        checks = self.checks
        checked = {name: checks[name](value, name) for name, value in params.items()}
        if composite is not None:
            if not self.lrp:
                raise ValueError(
                    f'composite= applies to the LRP methods ({", ".join(lrp_methods())}), not to {self.name!r}'
                )
            checked['composite'] = composite
        return checked

    def _refuse_unknown(self, params: Mapping[str, Any]) -> None:
        """A TypeError naming the parameters of ``params`` that the method does not take, and those it takes."""
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            takes = ', '.join(self.params) or 'none'
            hint = '; configure LRP through composite=' if self.lrp else ''
            raise TypeError(f'{self.name} takes no parameter(s) {unknown}; it takes {takes}{hint}')


def lrp_methods() -> tuple[str, ...]:
    """The names of the methods that take a composite (``lrp``)."""
    return tuple(name for name, declaration in DECLARATIONS.items() if declaration.lrp)


#: captum's KernelShap, which fits its surrogate with scikit-learn
_CAPTUM_AND_SKLEARN = (('captum', 'captum'), ('sklearn', 'scikit-learn'))

#: Every method :py:func:`~zennit_attn.explain` accepts, by name, in the order of the paper's tables.
DECLARATIONS: dict[str, Declaration] = {
    declaration.name: declaration
    for declaration in (
        Declaration('attnlrp', 'propagation:attnlrp', backward=True, latent=True, neuron=True, lrp=True),
        Declaration('cplrp', 'propagation:cplrp', backward=True, latent=True, neuron=True, lrp=True),
        Declaration('palrp', 'propagation:palrp', backward=True, latent=True, neuron=True, lrp=True),
        Declaration('attnlrp_late', 'propagation:attnlrp_late', backward=True, latent=True, neuron=True, lrp=True),
        Declaration('input_x_gradient', 'gradients:input_x_gradient', backward=True, latent=True, neuron=True),
        Declaration(
            'integrated_gradients',
            'gradients:integrated_gradients',
            backward=True,
            neuron=True,
            parameters=(
                Parameter('steps', 20, positive),
                Parameter('baseline', 0.0, between(-math.inf, math.inf)),
            ),
        ),
        Declaration(
            'smoothgrad',
            'gradients:smoothgrad',
            backward=True,
            neuron=True,
            parameters=(
                Parameter('sigma', 0.1, between(0.0, math.inf)),
                Parameter('samples', 20, positive),
                Parameter('seed', 0, seed),
                Parameter('multiply_input', True, flag),
            ),
        ),
        Declaration(
            'attention_rollout',
            'rollouts:attention_rollout',
            backward=False,
            attention_maps=True,
            parameters=(Parameter('dt', 1.0, between(0.0, 1.0)),),
        ),
        Declaration(
            'grad_attention_rollout',
            'rollouts:grad_attention_rollout',
            backward=True,
            attention_maps=True,
            parameters=(Parameter('dt', 1.0, between(0.0, 1.0)),),
        ),
        Declaration(
            'gradcam',
            'rollouts:gradcam',
            backward=True,
            attention_maps=True,
            parameters=(Parameter('layer', -1, integer),),
        ),
        Declaration(
            'atman',
            'atman:atman',
            backward=False,
            parameters=(
                Parameter('p', 1.0, between(0.0, 1.0)),
                Parameter('score', 'log_softmax', one_of('log_softmax', 'logit')),
                Parameter('perturbation_batch', 16, positive),
            ),
        ),
        Declaration(
            'kernelshap',
            'kernelshap:kernelshap',
            backward=False,
            neuron=True,
            parameters=(
                Parameter('samples', 2000, positive),
                Parameter('perturbation_batch', 64, positive),
                Parameter('seed', 0, seed),
            ),
            requires=_CAPTUM_AND_SKLEARN,
            extra='baselines',
        ),
        Declaration(
            'random',
            'random_baseline:random',
            backward=False,
            neuron=True,
            parameters=(Parameter('seed', 0, seed),),
        ),
    )
}
