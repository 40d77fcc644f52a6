"""Faithfulness of explanations (appendix B.2): the perturbation curves of every row of an
:py:class:`~zennit_attn.results.explanation.Explanation` (tokens: whole word-embedding vectors set to the baseline) or
:py:class:`~zennit_attn.results.explanation.ImageExplanation` (pixels or ``p x p`` patches), by the one engine
:py:func:`~zennit_attn.workflows.evaluation.perturbation.batched_curves`, with the explained logit of each row as the
score.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...inputs.task import ImageTask, TokenTask
from ...results.explanation import Explanation, ImageExplanation
from .perturbation import Curves, Faithfulness, Sample, batched_curves
from .pixels import features_to_images, image_features

__all__ = ['explained_task', 'explanation_curves', 'faithfulness', 'token_curves', 'image_curves', 'image_faithfulness']


def explained_task(
    model: torch.nn.Module, explanation: Explanation, model_kwargs: dict | None = None
) -> tuple[TokenTask, dict]:
    """The :py:class:`~zennit_attn.inputs.task.TokenTask` of a language model's ``explanation``, resolved to what it
    explains (its positions, targets and objective), so that ``task.select(task.forward(inputs, rows, **extra), rows)``
    is the explained value of (perturbed) word embeddings ``inputs`` that are variants of the rows ``rows``.

    Parameters
    ----------
    model: torch.nn.Module
        The explained model, in eval mode.
    explanation: Explanation
        What :py:func:`~zennit_attn.explain` returned for ``model``.
    model_kwargs: dict, optional
        Further arguments of the model's forward, as given to ``explain``.

    Returns
    -------
    tuple
        ``(task, extra)``: the task and the keyword arguments of its forward that restrict the model's output to the
        explained positions (:py:meth:`~zennit_attn.inputs.task.TokenTask.keep_logits`; empty where it has none).
    """
    if not isinstance(explanation, Explanation):
        raise TypeError(f'explanation must be an Explanation of a language model, got {type(explanation).__name__}')
    ids, mask = explanation.input_ids, explanation.attention_mask
    if explanation.choices is not None:  # a multiple-choice head's [batch, choices, seq] layout
        ids, mask = (
            ids.unflatten(1, (explanation.choices, -1)),
            None if mask is None else mask.unflatten(1, (explanation.choices, -1)),
        )
    task = TokenTask(model, ids, mask, model_kwargs, explanation.decoder_input_ids)
    extra = {} if explanation.position is None else task.keep_logits(explanation.position)
    task.positions = None if explanation.position is None else explanation.position.to(task.inputs.device)
    task.targets = explanation.target.to(task.inputs.device)
    if explanation.objective is not None:  # a contrast or a function of the scores
        task.objective = explanation.objective
    return task, extra


def explanation_curves(
    model: torch.nn.Module,
    explanation,
    steps: int = 16,
    mode: str | Sequence[str] = 'flipping',
    baseline: float = 0.0,
    patch_size: int = 1,
    batch_size: int | None = None,
    progress: bool = True,
    model_kwargs: dict | None = None,
    rows: list[int] | None = None,
) -> list[Curves] | list[dict[str, Curves]]:
    """MoRF and LeRF curves of the rows of ``explanation`` (default all), each scored by its explained logit.

    Parameters
    ----------
    model: torch.nn.Module
        The explained model, in eval mode.
    explanation: Explanation or ImageExplanation
        What :py:func:`~zennit_attn.explain` returned.
    steps, mode, baseline
        As for :py:func:`~zennit_attn.workflows.evaluation.perturbation.batched_curves` (several modes: one
        ``{mode: Curves}`` per row, from shared forward passes).
    patch_size: int
        Images: 1 perturbs single pixels, ``p`` perturbs ``p x p`` patches.
    batch_size: int, optional
        Perturbed inputs per forward pass (those of several rows are batched); default one row's.
    progress: bool
        A tqdm progress bar over the rows.
    model_kwargs: dict, optional
        Language models: further arguments of the model's forward, as given to ``explain``.
    rows: list of int, optional
        The rows to evaluate.

    Tokens: padding never takes part, nor tokens after the explained position of a causal model (they cannot
    change the explained logit).
    """
    if isinstance(explanation, ImageExplanation):
        task = ImageTask(model, explanation.pixels, model_kwargs)
        if task.video:
            raise TypeError(
                f'the perturbation curves flip the pixels of images; {type(model).__name__} was explained on videos, '
                'which they do not perturb'
            )
        height, width = task.inputs.shape[2:]
        extra = {}
        task.targets = explanation.target.to(task.inputs.device)
        task.positions = None if explanation.position is None else explanation.position.to(task.inputs.device)
        if explanation.objective is not None:  # a contrast or a function of the scores
            task.objective = explanation.objective

        def sample(row):
            features, values = image_features(task.inputs[row], explanation.relevance[row], patch_size)
            return Sample(features, values)

        def inputs(batch):
            return features_to_images(batch, height, width)
    else:
        task, extra = explained_task(model, explanation, model_kwargs)
        valid = task.attributable_tokens()

        def sample(row):
            return Sample(task.inputs[row], explanation.relevance[row], valid[row])

        def inputs(batch):
            return batch

    rows = list(range(task.batch)) if rows is None else list(rows)
    owner_rows = torch.tensor(rows, dtype=torch.long, device=task.inputs.device)

    def forward(batch, owners):
        index = owner_rows[owners.to(owner_rows.device)]
        return task.select(task.forward(inputs(batch), index, **extra), index)

    return batched_curves(
        forward, (sample(row) for row in rows), steps, mode, baseline, batch_size, progress, total=len(rows)
    )


def faithfulness(
    model: torch.nn.Module, explanation, steps: int = 16, mode: str = 'flipping', **options
) -> Faithfulness:
    """:py:func:`explanation_curves` of all rows, summarised (mean score, its standard error, mean areas)."""
    if not isinstance(mode, str):
        raise ValueError(
            f'faithfulness() summarises one mode, got {mode!r}: call it once per mode, or use '
            'explanation_curves(mode=(...)) for the curves of several modes from shared forward passes'
        )
    return Faithfulness.of(explanation_curves(model, explanation, steps, mode, **options))


#: The faithfulness of an :py:class:`~zennit_attn.results.explanation.ImageExplanation` (the same function as
#: for tokens).
image_faithfulness = faithfulness


def token_curves(
    model: torch.nn.Module,
    explanation,
    steps: int = 16,
    mode: str | Sequence[str] = 'flipping',
    row: int = 0,
    batch_size: int | None = None,
    model_kwargs: dict | None = None,
) -> Curves | dict[str, Curves]:
    """The curves of row ``row`` of a language model's :py:class:`~zennit_attn.results.explanation.Explanation` (several
    modes: ``{mode: Curves}``)."""
    return explanation_curves(
        model, explanation, steps, mode, batch_size=batch_size, progress=False, model_kwargs=model_kwargs, rows=[row]
    )[0]


def image_curves(
    model: torch.nn.Module,
    pixels: torch.Tensor,
    relevance: torch.Tensor,
    target: torch.Tensor,
    steps: int = 16,
    mode: str = 'flipping',
    patch_size: int = 1,
    baseline: float = 0.0,
    batch_size: int | None = 256,
    progress: bool = True,
) -> list[Curves]:
    """The curves of ``[batch, C, H, W]`` images with ``[batch, H, W]`` (or ``[batch, C, H, W]``) relevance, each
    scored by the logit of its ``target`` class (:py:func:`explanation_curves` of the images)."""
    pixels = torch.as_tensor(pixels)
    if pixels.dim() != 4:
        raise ValueError(f'pixels must be [batch, C, H, W], got {tuple(pixels.shape)}')
    target = torch.as_tensor(target, device=pixels.device).long().flatten().expand(pixels.shape[0])
    relevance = torch.as_tensor(relevance)
    explanation = ImageExplanation(
        relevance=relevance,
        pixel_relevance=relevance,
        target=target,
        logit=torch.full(target.shape, float('nan')),
        pixels=pixels,
    )
    return explanation_curves(model, explanation, steps, mode, baseline, patch_size, batch_size, progress)
