"""Quantized models: which quantized layers explanations pass through, and the refusal of those they cannot (a
model check run for every method by :py:func:`~zennit_attn.inputs.checks.check_model`).

AttnLRP and the gradient methods need a backward pass through every linear layer. A quantized linear layer is
explained when its forward is the linear map of its dequantized weights and its backward is that map's gradient:
then the epsilon rule of :py:class:`torch.nn.Linear` (its subclass) applies unchanged, to the model the quantized
weights define. Verified here (bitsandbytes 0.50.2 on the CPU, torchao 0.18, torch 2.15):

- bitsandbytes ``Linear8bitLt`` (``load_in_8bit``) and ``Linear4bit`` (``load_in_4bit``, NF4/FP4, with its
  ``LinearNF4``/``LinearFP4`` subclasses);
- torchao weight-only quantization (``quantize_(model, Int8WeightOnlyConfig())`` or ``TorchAoConfig``): the layer
  stays a :py:class:`torch.nn.Linear` whose weight is a torchao tensor subclass;
- GGUF files loaded by transformers (``gguf_file=``) are dequantised on loading: a plain float model.

On a CPU with AVX-512 BF16, bitsandbytes packs a 4-bit layer's weights for a faster kernel in its first forward pass
without gradients (``generate()``, ``torch.no_grad()``), and that kernel passes no gradient: the relevance of every
such layer would be lost (a Llama then gave its tokens no relevance but the explained one's own, through the residual
stream). :py:func:`unpack_for_gradients` undoes the packing before a pass with gradients (bitsandbytes' own unpacking,
which it runs to save the layer; it packs them again in its next pass without gradients). Packing rounds the
weights' scales to bfloat16, so a packed model is another model than before: zennit-attn's own passes without
gradients (the checks' probes) and the engine's context hold the packing off (:py:func:`cpu_packing_held`), and a model
is changed only where its user's passes packed it.

Any other module that holds integer weights (``torch.ao`` dynamic/static quantization, GPTQ/AWQ/HQQ-style
``QuantLinear`` layers with ``qweight`` buffers, ...) is refused by :py:func:`check_quantized` with the module's
class and path: their kernels have no backward pass, or one nobody verified here, and a layer that passes no
gradient would silently drop the relevance of its branch (the residual stream still carries the rest).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator

import torch

from .errors import UnsupportedModelError

__all__ = [
    'EXPLAINED_QUANTIZED',
    'UnsupportedQuantizationError',
    'quantization_of',
    'unexplained_quantized',
    'check_quantized',
    'bitsandbytes_supports',
    'bitsandbytes_devices',
    'packed_for_cpu',
    'unpack_for_gradients',
    'four_bit_layers',
    'cpu_packing_held',
]

#: Qualified names of quantized linear classes (and their subclasses) whose forward is the linear map of their
#: dequantized weights and whose backward is its gradient (bitsandbytes' 8-bit layer also rounds its input to 8
#: bits per row: the explained model is the quantized one).
EXPLAINED_QUANTIZED: dict[str, str] = {
    'bitsandbytes.nn.modules.Linear8bitLt': 'bitsandbytes 8-bit',
    'bitsandbytes.nn.modules.Linear4bit': 'bitsandbytes 4-bit',
}

#: Module paths of torch's own quantized modules (``torch.ao.quantization``): their kernels have no backward pass.
_TORCH_QUANTIZED = ('torch.ao.nn.quantized', 'torch.nn.quantized', 'torch.ao.nn.intrinsic.quantized')


class UnsupportedQuantizationError(UnsupportedModelError):
    """A model contains quantized modules that no backward pass goes through."""


def _qualified(cls: type) -> str:
    return f'{cls.__module__}.{cls.__qualname__}'


def quantization_of(module: torch.nn.Module) -> str | None:
    """The kind of explained quantization of ``module`` (``'bitsandbytes 8-bit'``, ``'bitsandbytes 4-bit'``,
    ``'torchao'``), or None for a module that is not a quantized linear layer of :py:data:`EXPLAINED_QUANTIZED`
    or torchao."""
    kind = _class_kind(type(module))
    if kind is None and isinstance(module, torch.nn.Linear) and type(module.weight).__module__.startswith('torchao.'):
        return 'torchao'
    return kind


@functools.cache
def _class_kind(cls: type) -> str | None:
    """The kind of :py:data:`EXPLAINED_QUANTIZED` that ``cls`` is (or subclasses), else None."""
    return next(
        (EXPLAINED_QUANTIZED[name] for name in map(_qualified, cls.__mro__) if name in EXPLAINED_QUANTIZED), None
    )


#: torch dispatch keys of the device types bitsandbytes may register kernels for
_DISPATCH_KEYS = {'cpu': 'CPU', 'cuda': 'CUDA', 'xpu': 'XPU', 'mps': 'MPS', 'hpu': 'HPU', 'npu': 'PrivateUse1'}


def bitsandbytes_supports(device_type: str) -> bool:
    """Whether the installed bitsandbytes registered a 4-bit dequantisation kernel (``bitsandbytes::dequantize_4bit``,
    the op its 4-bit layers run) for ``device_type``; False where bitsandbytes registered no ops."""
    key = _DISPATCH_KEYS.get(device_type)
    if key is None or not hasattr(torch.ops, 'bitsandbytes'):
        return False
    try:
        name = torch.ops.bitsandbytes.dequantize_4bit.default.name()
    except (AttributeError, RuntimeError):
        return False
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, key))


def bitsandbytes_devices() -> list[str]:
    """The device types :py:func:`bitsandbytes_supports`."""
    return [device for device in _DISPATCH_KEYS if bitsandbytes_supports(device)]


def _why_unexplained(module: torch.nn.Module) -> str | None:
    """Why no backward pass goes through ``module`` (None if one does, or it holds no quantized weights)."""
    cls = type(module)
    if cls.__module__.startswith(_TORCH_QUANTIZED):
        return 'torch.ao quantized kernels have no backward pass'
    kind = quantization_of(module)
    if kind == 'bitsandbytes 4-bit' and getattr(module.weight, 'quant_state', None) is None:
        return (
            'its 4-bit weights are not quantized yet (bitsandbytes quantizes them when the layer moves to its '
            "device): call model.to('cpu') or model.cuda() first"
        )
    if kind == 'bitsandbytes 4-bit' and not bitsandbytes_supports(module.weight.device.type):
        return (
            f'the installed bitsandbytes has no 4-bit kernel for the {module.weight.device.type!r} device (its '
            'kernels here: ' + (', '.join(bitsandbytes_devices()) or 'none') + '): move the model to one of '
            'them, or load it in 8 bits or without quantization'
        )
    if kind is not None or isinstance(module, torch.nn.Embedding):
        return None  # relevance is read at the embeddings' output: their own quantization does not matter
    for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
        if (
            tensor is not None
            and 'weight' in name
            and (tensor.is_quantized or not (tensor.is_floating_point() or tensor.is_complex()))
        ):
            return f'its {name!r} holds {tensor.dtype} values, and no backward pass through it is known'
    return None


def unexplained_quantized(model: torch.nn.Module) -> dict[str, tuple[str, str]]:
    """Quantized modules of ``model`` that explanations cannot pass through: ``{class name: (first path, why)}``,
    one entry per class (its first path), in module order."""
    found: dict[str, tuple[str, str]] = {}
    reported: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + '.') for prefix in reported):
            continue  # the packed parameters of a reported module
        why = _why_unexplained(module)
        if why is not None:
            reported.append(name)
            found.setdefault(_qualified(type(module)), (name or '<root>', why))
    return found


def check_quantized(model: torch.nn.Module) -> None:
    """Refuse a model with quantized modules that no backward pass goes through (see the module docstring).

    Parameters
    ----------
    model: torch.nn.Module

    Raises
    ------
    UnsupportedQuantizationError
        Naming each such module class, one path of it, why, and what to do: dequantize the model, or quantize it
        with bitsandbytes or torchao weight-only int8.
    """
    found = unexplained_quantized(model)
    if not found:
        return
    lines = '\n'.join(f'  - {cls} (at {path}): {why}' for cls, (path, why) in found.items())
    raise UnsupportedQuantizationError(
        f'zennit-attn cannot explain {type(model).__name__}: its quantized layers pass no (known) gradient, so '
        f'their relevance would be lost:\n{lines}\nDequantize first (load the model in float32 or bfloat16 without '
        'quantization, e.g. from_pretrained(..., dtype=torch.float32) instead of torch.ao.quantization.'
        'quantize_dynamic), or quantize with bitsandbytes (BitsAndBytesConfig(load_in_8bit=True) / load_in_4bit) or '
        'torchao weight-only int8 (TorchAoConfig(Int8WeightOnlyConfig())), whose layers are explained.'
    )


def packed_for_cpu(module: torch.nn.Module) -> bool:
    """Whether bitsandbytes packed the 4-bit weights of ``module`` for its CPU inference kernel, which passes no
    gradient (see the module's description)."""
    state = getattr(getattr(module, 'weight', None), 'quant_state', None)
    return quantization_of(module) == 'bitsandbytes 4-bit' and bool(getattr(state, 'packing_format_for_cpu', False))


def unpack_for_gradients(modules: Iterable[torch.nn.Module]) -> None:
    """Undo bitsandbytes' packing of 4-bit weights for CPU inference in ``modules`` (:py:func:`packed_for_cpu`), so
    that a pass with gradients goes through them: bitsandbytes unpacks a layer's weights to save it
    (``state_dict()``), to the values the packed layer computes with; it packs them again in its next pass without
    gradients.

    Raises
    ------
    UnsupportedQuantizationError
        Where the weights stay packed (an installed bitsandbytes that saves them otherwise), naming the layer.
    """
    for module in modules:
        if not packed_for_cpu(module):
            continue
        module.state_dict()  # bitsandbytes' _save_to_state_dict unpacks the weights in place
        if packed_for_cpu(module):
            raise UnsupportedQuantizationError(
                f'bitsandbytes packed the 4-bit weights of a {type(module).__name__} for its CPU inference kernel, '
                'which passes no gradient, and they could not be unpacked: reload the model and explain it before '
                'running it without gradients (generate(), torch.no_grad()), or run it on a GPU'
            )


def four_bit_layers(modules: Iterable[torch.nn.Module]) -> list[torch.nn.Module]:
    """The bitsandbytes 4-bit layers among ``modules`` that may pack their weights for CPU inference."""
    return [
        module
        for module in modules
        if quantization_of(module) == 'bitsandbytes 4-bit' and 'support_avx512bf16_for_cpu' in vars(module)
    ]


@contextlib.contextmanager
def cpu_packing_held(layers: Iterable[torch.nn.Module]) -> Iterator[None]:
    """bitsandbytes' packing of 4-bit weights for CPU inference held off in ``layers`` (:py:func:`four_bit_layers`)
    for the time of the context (their ``support_avx512bf16_for_cpu`` set to False, then as it was): passes without
    gradients that zennit-attn runs do not change the model (see the module's description)."""
    layers = list(layers)
    saved = [module.support_avx512bf16_for_cpu for module in layers]
    for module in layers:
        module.support_avx512bf16_for_cpu = False
    try:
        yield
    finally:
        for module, value in zip(layers, saved):
            module.support_avx512bf16_for_cpu = value
