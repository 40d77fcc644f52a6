"""Modules and module helpers of the engine: :py:class:`Logits` (a model's scores for zennit's attributors),
:py:func:`forward_parameters` and :py:func:`takes_keywords` (what a module's forward takes), :py:func:`without_cache`
(how to run a model without a key/value cache), :py:func:`logits_to_keep` (how to compute the logits of some positions
only), :py:func:`language_model_head`, :py:func:`is_encoder_decoder`, :py:func:`output_scores`,
:py:func:`word_embeddings` and :py:func:`decoder_word_embeddings` (the tables of a model's token ids),
:py:func:`inner_text_models` (the text models inside a model of one's own) and :py:data:`Modules` (one walk over a
model's modules, shared by what a call does with them)."""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import PreTrainedModel

#: ``list(model.named_modules())``: one walk over a model's modules, which the functions that take it share instead of
#: walking the model again (a walk costs a generator frame per module and level: about 1 ms for 400 modules)
Modules = list[tuple[str, torch.nn.Module]]


def within(path: str, outer: str) -> bool:
    """Whether the module path ``path`` is ``outer`` or the path of a module inside it (``''``, the root, holds every
    module)."""
    return outer == '' or path == outer or path.startswith(f'{outer}.')


def path_of(module: torch.nn.Module, modules: Modules) -> str | None:
    """The path of ``module`` among ``modules`` (``list(model.named_modules())``), None where it is not one of them."""
    return next((path for path, found in modules if found is module), None)


def forward_parameters(module: torch.nn.Module) -> tuple[str, ...]:
    """The names of the parameters of ``module.forward`` (none where it has no signature), cached per class's forward
    (not for a forward set on the instance: a wrapper such as accelerate's holds its module, which a cache would keep
    alive)."""
    forward = module.forward
    function = getattr(forward, '__func__', None)
    if function is not None and getattr(type(module), 'forward', None) is function:
        return _parameters(function)[1:]  # the method's ``self``
    return _signature(forward)


def takes_keywords(module: torch.nn.Module) -> bool:
    """Whether ``module.forward`` takes any keyword argument (``**kwargs``)."""
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters)


def without_cache(model: torch.nn.Module) -> dict[str, bool]:
    """The keyword arguments that run ``model`` without a key/value cache: ``use_cache=False`` where its forward takes
    ``use_cache`` by name, or through ``**kwargs`` for a Hugging Face model (a ``PreTrainedModel``: Granite MoE and
    LLaVA pass it on to their inner model); none otherwise (a model of one's own may pass ``**kwargs`` to a function
    that does not take it). The one forward pass of an explanation needs no cache: it would hold memory, grow when
    checkpointing recomputes a block, and some cannot be built (a GraniteMoeHybrid whose layers are all linear
    attention)."""
    if 'use_cache' in forward_parameters(model) or (isinstance(model, PreTrainedModel) and takes_keywords(model)):
        return {'use_cache': False}
    return {}


def language_model_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The language-model head of ``model`` (``get_output_embeddings()``: the projection to the vocabulary of a
    Hugging Face ``...ForCausalLM`` or ``...ForConditionalGeneration``), None for a model without one (a classifier,
    a question-answering head, a model of one's own without the method)."""
    heads = getattr(model, 'get_output_embeddings', None)
    return heads() if callable(heads) else None


def logits_to_keep(positions: torch.Tensor, length: int) -> torch.Tensor:
    """The ``logits_to_keep`` argument of a Hugging Face language model that computes the logits of the sorted token
    ``positions`` of an input of ``length`` tokens only: the positions counted from the end (``positions - length``).

    Counted from the end, they select the rows of those tokens also where the model's hidden states hold further rows
    in front of the input's tokens: GIT puts its image tokens (17 in a tiny configuration, 197 for a ViT-B/16 tower)
    before the text, so that position 3 of a text of 4 tokens is hidden-state row 20 of 21, where the count from the
    start would take the logits of image token 3."""
    return positions - length


def is_encoder_decoder(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an encoder-decoder model: its configuration says so (``is_encoder_decoder``) and its
    forward takes a decoder input. The configuration alone is not enough: transformers' UMT5 token classifier keeps
    ``is_encoder_decoder=True`` from the T5 configuration although it is an encoder with a classifier (a decoder input
    would be swallowed by its ``**kwargs``, and positions read from a decoder that does not exist)."""
    if not getattr(getattr(model, 'config', None), 'is_encoder_decoder', False):
        return False
    parameters = forward_parameters(model)
    return 'decoder_input_ids' in parameters or 'decoder_inputs_embeds' in parameters


def word_embeddings(model: torch.nn.Module, modules: Modules | None = None) -> torch.nn.Module | None:
    """The module that embeds ``model``'s token ids: ``model.get_input_embeddings()`` (a Hugging Face model), or, for a
    model of one's own around a Hugging Face model (a classification head on an ``AutoModel``, a wrapper's forward of
    ``input_ids``), the word embedding of the outermost models inside it that have ``get_input_embeddings`` and take
    token ids (not ``pixel_values``). None where there is none (an image model; CANINE, whose table transformers
    cannot tell) or where the models inside embed with different tables (two towers: which one is explained is not for
    zennit-attn to guess). ``modules``: ``list(model.named_modules())`` if the caller has it."""
    if hasattr(model, 'get_input_embeddings'):
        return _embedding_of(model)
    found = {}
    for inner in inner_text_models(model, modules):
        embedding = _embedding_of(inner)
        if embedding is not None:
            found[id(embedding)] = embedding
    return next(iter(found.values())) if len(found) == 1 else None


def decoder_word_embeddings(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module that embeds an encoder-decoder model's decoder ids: its decoder's ``get_input_embeddings()``, or the
    decoder's ``embed_tokens`` where the decoder is no Hugging Face model (FSMT's ``FSMTDecoder``); None where the
    model has no ``get_decoder`` or the decoder tells neither."""
    decoder = model.get_decoder() if hasattr(model, 'get_decoder') else None
    if decoder is not None and hasattr(decoder, 'get_input_embeddings'):
        return decoder.get_input_embeddings()
    table = getattr(decoder, 'embed_tokens', None)
    return table if isinstance(table, torch.nn.Module) else None


def inner_text_models(model: torch.nn.Module, modules: Modules | None = None) -> list[torch.nn.Module]:
    """The outermost models inside ``model`` that have ``get_input_embeddings`` and take token ids (not
    ``pixel_values``): the Hugging Face text models of a model of one's own (none inside one of them is counted).
    ``modules``: ``list(model.named_modules())`` if the caller has it."""
    found, outer = [], []
    for name, module in modules if modules is not None else model.named_modules():
        if module is model or any(name.startswith(prefix) for prefix in outer):
            continue
        if hasattr(type(module), 'get_input_embeddings') and getattr(module, 'main_input_name', None) != 'pixel_values':
            outer.append(f'{name}.')
            found.append(module)
    return found


def _embedding_of(model: torch.nn.Module) -> torch.nn.Module | None:
    """``model.get_input_embeddings()``, None where transformers cannot tell it (``NotImplementedError``)."""
    try:
        embedding = model.get_input_embeddings()
    except NotImplementedError:
        return None
    return embedding if isinstance(embedding, torch.nn.Module) else None


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
