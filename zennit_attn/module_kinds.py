"""Kinds of leaf modules (activations, linear and convolution layers, normalisations, neutral modules): which rule
a composite gives a module, and which modules the model check of the canonizers accepts without a family entry."""
from __future__ import annotations

import torch
from transformers import activations as hf_activations

#: Element-wise activation modules of torch and transformers (single input, single output).
ACTIVATIONS: tuple[type, ...] = (
    torch.nn.ReLU, torch.nn.ReLU6, torch.nn.LeakyReLU, torch.nn.PReLU, torch.nn.ELU, torch.nn.SELU,
    torch.nn.CELU, torch.nn.GELU, torch.nn.SiLU, torch.nn.Mish, torch.nn.Tanh, torch.nn.Sigmoid,
    torch.nn.Softplus, torch.nn.Hardswish, torch.nn.Hardtanh,
) + tuple(
    getattr(hf_activations, name) for name in (
        'GELUTanh', 'NewGELUActivation', 'GELUActivation', 'SiLUActivation', 'FastGELUActivation',
        'QuickGELUActivation', 'ClippedGELUActivation', 'AccurateGELUActivation', 'MishActivation',
        'LinearActivation', 'LaplaceActivation', 'ReLUSquaredActivation', 'XIELUActivation',
    ) if hasattr(hf_activations, name)
)

#: Linear modules: their rule is the epsilon rule (Eq. 8).
LINEARS: tuple[type, ...] = (torch.nn.Linear,)
try:  # GPT-2's transposed linear layer
    from transformers.pytorch_utils import Conv1D
    LINEARS += (Conv1D,)
except ImportError:  # pragma: no cover
    pass

#: Convolutions (the patch embedding of vision transformers): linear, the gradient unless a composite gives a rule.
CONVOLUTIONS: tuple[type, ...] = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)

#: Modules that pass relevance unchanged in evaluation mode or lie off the relevance path.
NEUTRAL: tuple[type, ...] = (
    torch.nn.Dropout, torch.nn.Identity, torch.nn.Embedding, torch.nn.ModuleList, torch.nn.ModuleDict,
    torch.nn.Sequential, torch.nn.modules.loss._Loss,  # losses run only when labels are passed
)


#: Class names (suffixes) of Hugging Face's RMSNorm-style modules; T5's "LayerNorm" is an RMSNorm.
RMS_NORM_NAMES = ('RMSNorm', 'T5LayerNorm')


def is_activation(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a known element-wise non-linearity."""
    return isinstance(module, ACTIVATIONS)


def norm_kind(module: torch.nn.Module) -> str | None:
    """``'layer'`` for mean-subtracting LayerNorm, ``'rms'`` for RMSNorm-style modules, None otherwise.

    RMSNorm-style means ``y_i = x_i * c(x) * w_i`` (no mean subtraction, no bias), which holds for
    :py:class:`torch.nn.RMSNorm`, the ``*RMSNorm`` classes of transformers (Llama, Mistral, Qwen, Gemma, ...) and
    ``T5LayerNorm``.
    """
    if isinstance(module, torch.nn.LayerNorm):
        return 'layer'
    if isinstance(module, torch.nn.RMSNorm) or type(module).__name__.endswith(RMS_NORM_NAMES):
        return 'rms'
    return None
