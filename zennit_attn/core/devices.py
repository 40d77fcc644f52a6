"""Where a model's inputs must go, also for models whose weights ``accelerate`` offloads (``cpu_offload``, a
``device_map`` with ``'cpu'`` or ``'disk'`` entries): their parameters sit on the ``meta`` device between forward
passes, so the device of the first parameter says nothing about where the model computes."""

from __future__ import annotations

import torch

from .modules import word_embeddings

__all__ = ['input_device', 'to_device']


def _execution_device(hook) -> torch.device | None:
    """The ``execution_device`` of an ``accelerate`` hook (also inside a ``SequentialHook``), or None."""
    device = getattr(hook, 'execution_device', None)
    if device is not None:
        return torch.device(device)  # accelerate gives an int (a GPU index), a str or a torch.device
    for inner in getattr(hook, 'hooks', ()):
        device = _execution_device(inner)
        if device is not None:
            return device
    return None


def input_device(model: torch.nn.Module) -> torch.device:
    """The device the token ids (or pixels) of ``model`` must be on.

    In order: the execution device of an ``accelerate`` hook on the input embedding or on the model (dispatched or
    offloaded models compute there, whatever device their weights rest on), the device of the input embedding's
    weight, the device of the first parameter or buffer not on the ``meta`` device, else the CPU.

    Parameters
    ----------
    model: torch.nn.Module

    Returns
    -------
    torch.device
    """
    embedding = word_embeddings(model)  # None where the model has none (CLIP's two towers)
    for module in (embedding, model):
        device = _execution_device(getattr(module, '_hf_hook', None))
        if device is not None:
            return device
    weight = getattr(embedding, 'weight', None)
    if isinstance(weight, torch.Tensor) and not weight.is_meta:
        return weight.device
    for tensor in (*model.parameters(), *model.buffers()):
        if not tensor.is_meta:
            return tensor.device
    return torch.device('cpu')


def to_device(value, device: torch.device):
    """``value`` with every tensor in it (also inside dicts, lists and tuples) on ``device``; other values as they
    are. Inputs given on the CPU (a tokenizer's output) go to the device the model computes on
    (:py:func:`input_device`).

    Parameters
    ----------
    value: tensor, dict, list, tuple or any other value
    device: torch.device

    Returns
    -------
    The same structure, its tensors moved (a tensor already on ``device`` is returned as it is).
    """
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return type(value)((key, to_device(item, device)) for key, item in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, '_fields'):
        return type(value)(to_device(item, device) for item in value)
    return value
