"""Kinds of leaf modules (activations, linear and convolution layers, normalisations, neutral modules): which rule
a composite gives a module, and which modules the model check of the canonizers accepts without a family entry; and
the configurations a model's modules hold (:py:func:`model_configs`)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch
from transformers import activations as hf_activations

#: Element-wise activation modules of torch and transformers (single input, single output).
ACTIVATIONS: tuple[type, ...] = (
    torch.nn.ReLU,
    torch.nn.ReLU6,
    torch.nn.LeakyReLU,
    torch.nn.PReLU,
    torch.nn.ELU,
    torch.nn.SELU,
    torch.nn.CELU,
    torch.nn.GELU,
    torch.nn.SiLU,
    torch.nn.Mish,
    torch.nn.Tanh,
    torch.nn.Sigmoid,
    torch.nn.Softplus,
    torch.nn.Hardswish,
    torch.nn.Hardtanh,
) + tuple(
    getattr(hf_activations, name)
    for name in (
        'GELUTanh',
        'NewGELUActivation',
        'GELUActivation',
        'SiLUActivation',
        'FastGELUActivation',
        'QuickGELUActivation',
        'ClippedGELUActivation',
        'AccurateGELUActivation',
        'MishActivation',
        'LinearActivation',
        'LaplaceActivation',
        'ReLUSquaredActivation',
        'XIELUActivation',
    )
    if hasattr(hf_activations, name)
)

#: The forwards of :py:data:`ACTIVATIONS` (:py:func:`is_listed_activation`).
_LISTED_FORWARDS = frozenset(cls.forward for cls in ACTIVATIONS)

#: Linear modules: their rule is the epsilon rule (Eq. 8).
LINEARS: tuple[type, ...] = (torch.nn.Linear,)
try:  # GPT-2's transposed linear layer
    from transformers.pytorch_utils import Conv1D

    LINEARS += (Conv1D,)
except ImportError:  # pragma: no cover
    pass

#: Convolutions (the patch embedding of vision transformers; the transposed convolutions of segmentation decoders):
#: linear, the gradient unless a composite gives a rule.
CONVOLUTIONS: tuple[type, ...] = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.ConvTranspose1d,
    torch.nn.ConvTranspose2d,
    torch.nn.ConvTranspose3d,
)

#: Modules that pass relevance unchanged in evaluation mode or lie off the relevance path.
NEUTRAL: tuple[type, ...] = (
    torch.nn.Dropout,
    torch.nn.Identity,
    torch.nn.Embedding,
    torch.nn.ModuleList,
    torch.nn.ModuleDict,
    torch.nn.Sequential,
    torch.nn.modules.loss._Loss,  # losses run only when labels are passed
)


#: Class names (suffixes) of Hugging Face's RMSNorm-style modules; T5's "LayerNorm" is an RMSNorm.
RMS_NORM_NAMES = ('RMSNorm', 'T5LayerNorm')
#: Class name suffixes of other normalisation modules: confirmed numerically at their first call
#: (:py:class:`~zennit_attn.rules.NormIdentity`).
NORM_NAMES = ('Norm', 'LayerNorm', 'RmsNorm', 'Normalization')


#: Class name suffixes of other activation modules (leaves): confirmed element-wise at their first call
#: (:py:class:`~zennit_attn.rules.Identity`).
ACTIVATION_NAMES = (
    'Activation',
    'GELU',
    'Gelu',
    'GeLU',
    'SiLU',
    'Silu',
    'Swish',
    'ReLU',
    'Relu',
    'Tanh',
    'Sigmoid',
    'Mish',
    'Softplus',
)


def is_activation(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an element-wise non-linearity: a class of :py:data:`ACTIVATIONS`, or a leaf module whose
    class name ends like one of :py:data:`ACTIVATION_NAMES` (see :py:func:`is_listed_activation`)."""
    return is_listed_activation(module) or (type(module).__name__.endswith(ACTIVATION_NAMES) and not module._modules)


def is_listed_activation(module: torch.nn.Module) -> bool:
    """Whether ``module``'s class is one of :py:data:`ACTIVATIONS`, or a subclass of one that keeps its forward (known
    to be element-wise); a subclass with a forward of its own is not known to be (``super().forward(x) *
    x.roll(1)``)."""
    return isinstance(module, ACTIVATIONS) and type(module).forward in _LISTED_FORWARDS


def norm_kind(module: torch.nn.Module) -> str | None:
    """``'layer'`` for :py:class:`torch.nn.LayerNorm` (with its own forward), ``'rms'`` for RMSNorm-style modules,
    ``'probe'`` for other leaf modules of one input named like a normalisation and for subclasses of LayerNorm with
    a forward of their own (e.g. channels-first: confirmed, or refused, when they first run), None otherwise.

    RMSNorm-style means ``y_i = x_i * c(x) * w_i`` (no mean subtraction, no bias), which holds for
    :py:class:`torch.nn.RMSNorm`, the ``*RMSNorm`` classes of transformers (Llama, Mistral, Qwen, Gemma, ...) and
    ``T5LayerNorm``.
    """
    if isinstance(module, torch.nn.LayerNorm) and type(module).forward is torch.nn.LayerNorm.forward:
        return 'layer'
    if isinstance(module, torch.nn.RMSNorm) or type(module).__name__.endswith(RMS_NORM_NAMES):
        return 'rms'
    if (
        (type(module).__name__.endswith(NORM_NAMES) or isinstance(module, torch.nn.LayerNorm))
        and not module._modules
        and not isinstance(module, _OTHER_NORMS)
        and _one_input(module)
    ):
        return 'probe'
    return None


def _one_input(module: torch.nn.Module) -> bool:
    """Whether ``module.forward`` takes one required argument (a normalisation of one tensor, not e.g. a module that
    normalises queries and keys together, whose inside the engine then sees)."""
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return True
    required = [
        parameter
        for parameter in parameters
        if parameter.default is parameter.empty
        and parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
    ]
    return len(required) == 1


#: torch normalisations that do not normalise over the last dimension(s) of each token
_OTHER_NORMS = (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm, torch.nn.LocalResponseNorm)


def model_configs(model: torch.nn.Module, modules: Iterable[torch.nn.Module] | None = None) -> list:
    """Every Hugging Face configuration of ``model`` (one with an attention implementation): of its modules
    (``modules``: ``model.modules()`` where the caller has walked them), and their sub-configurations (text, vision,
    audio, ...), each once."""
    found = {}

    def add(config):
        if config is None or id(config) in found or not hasattr(config, '_attn_implementation'):
            return
        found[id(config)] = config
        for key in getattr(config, 'sub_configs', {}) or {}:
            add(getattr(config, key, None))

    for module in model.modules() if modules is None else modules:
        # read where it is set (a module's missing attribute costs an exception): the instance, or a class property
        add(
            module.__dict__['config']
            if 'config' in module.__dict__
            else getattr(module, 'config', None)
            if hasattr(type(module), 'config')
            else None
        )
    return list(found.values())
