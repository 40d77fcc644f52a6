"""The input of a multiple-choice head (transformers' ``...ForMultipleChoice``): ``[batch, choices, seq]`` token ids,
one sequence per choice (the question or context paired with that choice's answer), scored ``[batch, choices]``.

The head flattens the choices to ``[batch * choices, seq]`` rows, encodes each sequence alone and scores it, so the
score of choice ``c`` depends on that choice's tokens only. zennit-attn explains the choices of a row as one sequence
of ``choices * seq`` tokens (:py:class:`Choices`): the task's ids, mask, embeddings and relevance are
``[batch, choices * seq]`` (the choices one after another), and every run of the model gets them back as
``[batch, choices, seq]``. So each method that perturbs or attributes tokens explains a choice as it explains a
sequence classifier's class (``target`` the choice); a contrast of two choices gives relevance to both choices'
tokens. Methods that read the model's own sequences (attention maps, AtMan's suppressed keys, PA-LRP's positions) see
``batch * choices`` sequences of ``seq`` tokens instead, and are refused
(:py:meth:`~zennit_attn.inputs.task.Task.check_token_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ['takes_choices', 'Choices']


def takes_choices(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a multiple-choice head: transformers names every one ``...ForMultipleChoice`` (35
    architectures: BERT, RoBERTa, DeBERTa, ELECTRA, XLM-R, ModernBERT, ...)."""
    return type(model).__name__.endswith('ForMultipleChoice')


@dataclass(frozen=True)
class Choices:
    """The layout of a multiple-choice input: ``count`` choices of ``length`` tokens per row.

    :py:meth:`flatten` turns the model's ``[batch, choices, seq, ...]`` layout into the explained
    ``[batch, choices * seq, ...]``, :py:meth:`unflatten` turns it back for a run of the model, :py:meth:`sequences`
    gives the model's own ``[batch * choices, seq, ...]`` sequences (for the padding checks)."""

    count: int
    length: int

    @classmethod
    def of(cls, model: torch.nn.Module, input_ids) -> Choices | None:
        """The layout of ``input_ids`` for a multiple-choice ``model`` (:py:func:`takes_choices`), None for other
        models.

        Raises
        ------
        ValueError
            For a multiple-choice model whose ids are not ``[batch, choices, seq]``.
        """
        if not takes_choices(model):
            return None
        shape = tuple(torch.as_tensor(input_ids).shape)
        if len(shape) != 3:
            raise ValueError(
                f'{type(model).__name__} scores choices: input_ids must be [batch, choices, seq], one sequence per '
                f"choice (e.g. tokenizer([context] * n, choices, padding=True, return_tensors='pt') with "
                f'.unsqueeze(0)), got shape {shape}'
            )
        return cls(shape[1], shape[2])

    def flatten(self, value):
        """A ``[batch, choices, seq, ...]`` tensor as ``[batch, choices * seq, ...]``; other values unchanged."""
        if (
            isinstance(value, torch.Tensor)
            and value.dim() >= 3
            and tuple(value.shape[1:3]) == (self.count, self.length)
        ):
            return value.flatten(1, 2)
        return value

    def unflatten(self, value):
        """A ``[batch, choices * seq, ...]`` tensor as the model's ``[batch, choices, seq, ...]``; other values
        unchanged."""
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == self.count * self.length:
            return value.unflatten(1, (self.count, self.length))
        return value

    def sequences(self, value: torch.Tensor) -> torch.Tensor:
        """A ``[batch, choices * seq, ...]`` tensor as the model's own sequences, ``[batch * choices, seq, ...]``."""
        return value.reshape(-1, self.length, *value.shape[2:])
