"""The registry of the attribution methods behind ``explain(..., method=NAME)``: :py:data:`METHODS`, one
:py:class:`Method` per declaration of :py:mod:`zennit_attn.methods.declarations`, each loading its implementation on
first use (:py:func:`load_implementation`); :py:func:`check_params` validates parameters without a model.

The implementations, one each for every modality: LRP (:py:mod:`~zennit_attn.methods.propagation`), the gradient
baselines (:py:mod:`~zennit_attn.methods.gradients`), the methods on attention maps
(:py:mod:`~zennit_attn.methods.rollouts`), AtMan (:py:mod:`~zennit_attn.methods.atman`), KernelSHAP
(:py:mod:`~zennit_attn.methods.kernelshap`, which needs the ``baselines`` extra) and the random baseline
(:py:mod:`~zennit_attn.methods.random_baseline`). Implementations of zennit (Integrated Gradients, SmoothGrad) and
captum (KernelSHAP) are reused where they exist.

Each implementation is a function ``(task, position, target, **params) -> explanation``. ``task`` is a
:py:class:`~zennit_attn.inputs.task.Task` (:py:class:`~zennit_attn.inputs.task.TokenTask` for language models,
:py:class:`~zennit_attn.inputs.task.ImageTask` for vision transformers), which decides what the input is (word
embeddings, pixels), what a token is, and how the result is packaged, so that every method explains exactly the same
logit. Methods that read attention probabilities (the rollouts, Grad-CAM) run the model once with eager attention
(see :py:mod:`zennit_attn.methods.attention`); token-level methods (rollout, Grad-CAM, AtMan) give an image's pixels
the value of their patch.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from zennit.core import Composite

from ..inputs.task import Task
from .declarations import DECLARATIONS, Declaration

__all__ = ['Method', 'METHODS', 'check_params', 'load_implementation']

#: the package whose modules hold the implementations (``Declaration.implementation`` is relative to it)
_PACKAGE = __name__.rpartition('.')[0]
#: the implementations loaded so far, by declaration
_LOADED: dict[Declaration, Callable] = {}


@dataclass(frozen=True)
class Method(Declaration):
    """One attribution method of :py:data:`METHODS`: its :py:class:`~zennit_attn.methods.declarations.Declaration`
    (name, flags, hyperparameters with defaults and checks), the implementation loaded on first use
    (:py:attr:`function`), and the check of a composite.

    Attributes
    ----------
    name: str
        The name ``explain(..., method=name)`` takes.
    backward: bool
        It runs a backward pass: ``checkpointing=True`` applies.
    latent: bool
        It is one forward and one backward pass whose gradient times activation is relevance at every tensor:
        ``latent=`` and ``condition=`` work with it.
    neuron: bool
        It reads the explained value through the task, so it can explain a
        :py:class:`~zennit_attn.latent.Neuron` target.
    lrp: bool
        It is LRP and takes ``composite=`` (a zennit composite; default chosen by the method for the modality).
    attention_maps: bool
        It reads the attention probabilities, which encoder-decoder models do not give it.
    params: mapping
        Hyperparameter name -> default (``composite`` not included).
    """

    @classmethod
    def of(cls, declaration: Declaration) -> Method:
        """The method of ``declaration``."""
        return cls(**{item.name: getattr(declaration, item.name) for item in fields(declaration)})

    @property
    def function(self) -> Callable:
        """``function(task, position, target, **params)``, returning the task's explanation; it trusts its
        parameters (call the method itself, ``METHODS[name](task, ...)``, to have them checked first). Imported on
        first use (:py:func:`load_implementation`)."""
        return load_implementation(self)

    def check(self, params: Mapping[str, Any]) -> dict:
        """``params`` checked and normalised (integers as int, reals as float); see :py:func:`check_params`."""
        checked = super().check(params)
        composite = checked.get('composite')
        if composite is not None and not isinstance(composite, Composite):
            raise TypeError(
                f'composite must be a zennit Composite (e.g. zennit_attn.composites.AttnLRPEpsilon()), '
                f'got {type(composite).__name__}'
            )
        return checked

    def __call__(self, task: Task, position=-1, target=None, **params):
        """Run the method on ``task`` with checked ``params``."""
        return self.function(task, position=position, target=target, **self.check(params))


#: Every method :py:func:`~zennit_attn.explain` accepts, by name, in the order of the paper's tables.
METHODS: dict[str, Method] = {name: Method.of(declaration) for name, declaration in DECLARATIONS.items()}


def check_params(name: str, params: Mapping[str, Any]) -> dict:
    """Validate the names and values of the hyperparameters ``params`` of the method ``name``, without a model.

    Parameters
    ----------
    name: str
        A key of :py:data:`METHODS`.
    params: mapping
        Parameter name -> value; ``composite`` is accepted by the LRP methods.

    Returns
    -------
    dict
        The parameters checked and normalised (integers as int, reals as float); defaults are not added.

    Raises
    ------
    ValueError
        For an unknown method, a value out of its range or of the wrong kind (the message names the parameter),
        or ``composite`` given to a method that is not LRP.
    TypeError
        For a parameter the method does not take, or a composite that is not a zennit composite.
    """
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f'Unknown method {name!r}; known: {", ".join(METHODS)}')
    return METHODS[name].check(params)


def load_implementation(declaration: Declaration) -> Callable:
    """The implementation of ``declaration``, imported on first use (the one place that imports an implementation)
    and checked against the declaration (:py:func:`check_signature`).

    Raises
    ------
    ImportError
        If a package the implementation needs is not installed, naming it and the extra that installs it.
    TypeError
        If the implementation's signature does not match the declaration.
    """
    function = _LOADED.get(declaration)
    if function is None:
        refuse_missing_packages(declaration)
        module, _, name = declaration.implementation.partition(':')
        function = getattr(importlib.import_module(f'{_PACKAGE}.{module}'), name)
        check_signature(declaration, function)
        _LOADED[declaration] = function
    return function


def refuse_missing_packages(declaration: Declaration) -> None:
    """An ImportError naming the packages of ``declaration.requires`` that are not installed, and the extra of
    ``zennit-attn`` that installs them; nothing where every one is installed."""
    missing = [
        distribution for module, distribution in declaration.requires if importlib.util.find_spec(module) is None
    ]
    if missing:
        raise ImportError(
            f'method {declaration.name!r} needs {" and ".join(missing)}, which {"is" if len(missing) == 1 else "are"} '
            'not installed: '
            f"pip install 'zennit-attn[{declaration.extra}]' (or pip install {' '.join(missing)})"
        )


def check_signature(declaration: Declaration, function: Callable) -> None:
    """A TypeError unless ``function`` takes ``(task, position, target, ...)``, then the hyperparameters of
    ``declaration`` in its order with its defaults, and ``composite`` exactly where the method is LRP."""
    parameters = list(inspect.signature(function).parameters.values())
    where = f'{declaration.implementation} (method {declaration.name!r})'
    if [parameter.name for parameter in parameters[:3]] != ['task', 'position', 'target']:
        raise TypeError(f'{where} must take (task, position, target, ...)')
    own = {parameter.name: parameter.default for parameter in parameters[3:] if parameter.name != 'composite'}
    takes_composite = any(parameter.name == 'composite' for parameter in parameters[3:])
    if takes_composite != declaration.lrp:
        raise TypeError(f'{where}: declared lrp={declaration.lrp}, but it takes composite= {"not " * declaration.lrp}')
    declared = dict(declaration.params)
    if list(own) != list(declared) or any(type(own[key]) is not type(declared[key]) for key in own) or own != declared:
        raise TypeError(f'{where}: its parameters and defaults {own} are not the declared ones {declared}')
