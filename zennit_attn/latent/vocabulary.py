"""Vocabulary projection of a neuron's output weights (paper section 3.5, after Geva et al. 2022): what an FFN
neuron writes into the residual stream, read through the unembedding."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ..core.modules import language_model_head
from ..rules.base import loaded_weights
from .sites import Neuron
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
    the bottom tokens'.

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
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f'k must be a positive integer, got {k!r}')
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
    with torch.no_grad():
        if neuron.site == 'residual':
            vector = None
        else:
            with loaded_weights(point.module):
                weight = point.module.weight.detach()
                # Linear: weight [out, in], the neuron's column; transformers' Conv1D: weight [in, out], its row
                vector = weight[:, neuron.index] if isinstance(point.module, torch.nn.Linear) else weight[neuron.index]
                vector = vector.float().clone()
        with loaded_weights(head):
            unembedding = head.weight.detach()  # [vocab, hidden]
            if vector is None:
                scores = unembedding[:, neuron.index].float().clone()
            else:
                scores = unembedding.float() @ vector.to(unembedding.device)
    count = min(int(k), scores.numel())

    def entries(indices):
        return [
            (int(token), tokenizer.decode([int(token)]) if tokenizer is not None else None, float(scores[token]))
            for token in indices
        ]

    return VocabularyProjection(
        neuron, entries(scores.topk(count).indices), entries((-scores).topk(count).indices), scores
    )
