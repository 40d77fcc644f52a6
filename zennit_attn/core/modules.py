"""Modules and module helpers of the engine: :py:class:`Logits` (a model's scores for zennit's attributors),
:py:func:`forward_parameters` (what a module's forward takes), :py:func:`is_encoder_decoder`, :py:func:`output_scores`
and :py:data:`Modules` (one walk over a model's modules, shared by what a call does with them)."""

from __future__ import annotations

import functools
import inspect

import torch

#: ``list(model.named_modules())``: one walk over a model's modules, which the functions that take it share instead of
#: walking the model again (a walk costs a generator frame per module and level: about 1 ms for 400 modules)
Modules = list[tuple[str, torch.nn.Module]]


def forward_parameters(module: torch.nn.Module) -> tuple[str, ...]:
    """The names of the parameters of ``module.forward`` (none where it has no signature), cached per class's forward
    (not for a forward set on the instance: a wrapper such as accelerate's holds its module, which a cache would keep
    alive)."""
    forward = module.forward
    function = getattr(forward, '__func__', None)
    if function is not None and getattr(type(module), 'forward', None) is function:
        return _parameters(function)[1:]  # the method's ``self``
    return _signature(forward)


def is_encoder_decoder(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an encoder-decoder model: its configuration says so (``is_encoder_decoder``) and its
    forward takes a decoder input. The configuration alone is not enough: transformers' UMT5 token classifier keeps
    ``is_encoder_decoder=True`` from the T5 configuration although it is an encoder with a classifier (a decoder input
    would be swallowed by its ``**kwargs``, and positions read from a decoder that does not exist)."""
    if not getattr(getattr(model, 'config', None), 'is_encoder_decoder', False):
        return False
    parameters = forward_parameters(model)
    return 'decoder_input_ids' in parameters or 'decoder_inputs_embeds' in parameters


def _signature(function) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()


_parameters = functools.lru_cache(maxsize=4096)(_signature)


def output_scores(output) -> torch.Tensor:
    """The scores a model output explains: the tensor itself, the ``logits`` (else ``last_hidden_state``) of a Hugging
    Face model output, or the first element of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    for field in ('logits', 'last_hidden_state'):
        value = output.get(field) if hasattr(output, 'get') else None
        if value is not None:
            return value
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if hasattr(output, 'get') and output.get('start_logits') is not None:
        raise TypeError(
            f'{type(output).__name__} holds start_logits and end_logits, two scores per position: explain one of them, '
            "explain(model, input_ids, output='start_logits', target=<the position of the answer's start>)"
        )
    fields = (
        [key for key, value in output.items() if isinstance(value, torch.Tensor)] if hasattr(output, 'items') else []
    )
    raise TypeError(
        f'Cannot find logits or last_hidden_state in the model output {type(output).__name__}'
        + (
            f': explain one of its tensors ({", ".join(fields)}) with output=, e.g. explain(model, inputs, '
            f'output={fields[0]!r})'
            if fields
            else ''
        )
    )


class Logits(torch.nn.Module):
    """Wrap a model whose output is not a tensor (a Hugging Face ``ImageClassifierOutput``) so that it returns its
    scores (:py:func:`output_scores`), as zennit's attributors need::

        with Gradient(model=Logits(hf_vit), composite=AttnLRPGamma()) as attributor:
            output, relevance = attributor(pixels, one_hot)
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return output_scores(self.model(*args, **kwargs))
