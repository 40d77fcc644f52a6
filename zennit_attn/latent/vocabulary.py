"""Vocabulary projection of a neuron's output weights (paper section 3.5, after Geva et al. 2022): what an FFN
neuron writes into the residual stream, read through the unembedding."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.devices import input_device
from ..core.modules import language_model_head
from ..methods.declarations import positive
from ..rules.base import loaded_weights
from .sites import Neuron, find_sites
from .targets import resolve_point

__all__ = ['VocabularyProjection', 'vocabulary_projection']


@dataclass
class VocabularyProjection:
    """The ``k`` tokens with the largest (:py:attr:`top`) and smallest (:py:attr:`bottom`) projection scores, each
    ``(token id, token text or None, score)``, and all :py:attr:`scores` (``[vocabulary]``)."""

    neuron: Neuron
    top: list[tuple[int, str | None, float]]
    bottom: list[tuple[int, str | None, float]]
    scores: torch.Tensor

    def __str__(self) -> str:
        def words(items):
            return ', '.join(repr(text) if text is not None else str(token) for token, text, _ in items)

        return f'{self.neuron}\n  top:    {words(self.top)}\n  bottom: {words(self.bottom)}'


def vocabulary_projection(model: torch.nn.Module, neuron: Neuron, k: int = 20, tokenizer=None) -> VocabularyProjection:
    """Project the output weight vector of ``neuron`` onto the vocabulary: ``E w``, with ``E`` the model's output
    embedding (unembedding) matrix and ``w`` the column of the FFN down projection that the neuron scales (an
    ``'mlp'`` neuron: "upon activation, the corresponding row of the second weight matrix is added to the residual
    stream", section 3.5) or the unit vector of a ``'residual'`` hidden dimension. The final normalisation is not
    applied (as in the paper and Geva et al.); a positive activation raises the top tokens' logits, a negative one
    the bottom tokens'. The scores are computed in the weights' precision (float32 at least: a float64 model's are
    float64).

    Parameters
    ----------
    model: torch.nn.Module
        A language model with output embeddings (``get_output_embeddings()``); weights offloaded by ``accelerate``
        are loaded for the time of the projection.
    neuron: Neuron
        An ``'mlp'`` or ``'residual'`` unit.
    k: int
    tokenizer: optional
        To decode the tokens.

    Returns
    -------
    VocabularyProjection

    Raises
    ------
    ValueError
        For a neuron of another site, a model without output embeddings, or one whose head transforms the last
        block's output with a layer of its own before the unembedding (the masked-language-model heads of BERT,
        RoBERTa, DistilBERT: dense, activation, normalisation): ``E w`` would skip that non-linear layer and read a
        vector the unembedding never receives.
    """
    positive(k, 'k')
    if not isinstance(neuron, Neuron):
        raise TypeError(f'expected a Neuron, got {type(neuron).__name__}')
    if neuron.site not in ('mlp', 'residual'):
        raise ValueError(
            f'vocabulary projection is defined for "mlp" neurons (a column of the down projection) and '
            f'"residual" dimensions; a {neuron.site!r} unit writes no single vector'
        )
    head = language_model_head(model)
    if head is None or getattr(head, 'weight', None) is None:
        raise ValueError(f'{type(model).__name__} has no output embeddings (language-model head) to project onto')
    point = resolve_point(model, neuron)
    between = _layers_before_head(model, head)
    if between:
        raise ValueError(
            f"{type(model).__name__} transforms the last block's output with {', '.join(between)} before its output "
            'embeddings: the projection onto the unembedding would skip that layer (and its activation), so it '
            'would not be what the neuron writes into the logits; vocabulary projection is defined for heads that '
            'only normalise before the unembedding (causal language models)'
        )
    with torch.no_grad():
        if neuron.site == 'residual':
            vector = None
        else:
            with loaded_weights(point.module):
                weight = point.module.weight.detach()
                # Linear: weight [out, in], the neuron's column; transformers' Conv1D: weight [in, out], its row
                vector = weight[:, neuron.index] if isinstance(point.module, torch.nn.Linear) else weight[neuron.index]
                vector = vector.to(torch.promote_types(vector.dtype, torch.float32)).clone()
        with loaded_weights(head):
            unembedding = head.weight.detach()  # [vocab, hidden]
            dtype = torch.promote_types(unembedding.dtype, torch.float32)
            if vector is None:
                scores = unembedding[:, neuron.index].to(dtype).clone()
            else:
                dtype = torch.promote_types(dtype, vector.dtype)
                scores = unembedding.to(dtype) @ vector.to(unembedding.device, dtype)
    count = min(int(k), scores.numel())

    def entries(indices):
        return [
            (int(token), tokenizer.decode([int(token)]) if tokenizer is not None else None, float(scores[token]))
            for token in indices
        ]

    return VocabularyProjection(
        neuron, entries(scores.topk(count).indices), entries((-scores).topk(count).indices), scores
    )


def _layers_before_head(model: torch.nn.Module, head: torch.nn.Module) -> list[str]:
    """The layers with a weight matrix (linear, convolution) that run after the last block and before ``head`` in a
    forward pass of one token (a transform of the head, such as BERT's ``cls.predictions.transform.dense``); a
    normalisation (a weight vector) is not one. Empty where the model has no residual site to find its last block
    by, or does not run on token ids alone."""
    try:
        last = find_sites(model, ('residual',))['residual'][-1].module
    except (ValueError, TypeError, KeyError, IndexError):
        return []
    names = {module: name for name, module in model.named_modules()}
    state = {'after_last': False, 'done': False}
    found = []

    def block_done(*_):
        state['after_last'] = True
        found.clear()

    def head_starts(*_):
        state['done'] = True

    def layer_done(module, *_):
        if state['after_last'] and not state['done']:
            found.append(names[module])

    handles = [last.register_forward_hook(block_done), head.register_forward_pre_hook(head_starts)]
    handles += [module.register_forward_hook(layer_done) for module in _weight_layers(model, head)]
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=input_device(model)))
    except (TypeError, ValueError, RuntimeError):
        return []  # a model that needs more than token ids (an image): its layers are not told apart
    finally:
        for handle in handles:
            handle.remove()
    return found


def _weight_layers(model: torch.nn.Module, head: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` with a weight matrix of their own (not embeddings, not ``head``)."""
    return [
        module
        for module in model.modules()
        if module is not head
        and not isinstance(module, torch.nn.Embedding)
        and isinstance(getattr(module, 'weight', None), torch.Tensor)
        and module.weight.dim() >= 2
    ]
