"""The points at which relevance and edge patching take their (modified) gradients: Eq. 3 of :py:mod:`~.scores`.

The estimate of a component's effect is ``(a' - a) . g`` with ``g`` averaged over points of a path of the input
embeddings from the clean (``alpha = 0``) to the corrupted prompt. Two kinds of path (:py:data:`PATHS`):

- ``'straight'``: one path for every component, ``x + alpha (x' - x)``, every changed token moving at once (EAP-IG's
  path, Hanna et al. 2024).
- ``'causal'`` (the default, :py:data:`DEFAULT_PATH`): one path per changed position ``c``, on which only the tokens
  up to ``c`` move, ``x + alpha m_c (x' - x)`` with ``m_c`` 1 at positions ``<= c``; a component at position ``p`` takes
  its gradient on the path of the last changed position ``c <= p``. In a causal language model the component's
  corrupted activation depends on the tokens up to ``p`` only, and activation patching leaves every other component
  clean: on the straight path the tokens after ``p`` move as well and change the context in which the component acts,
  which single-component patching never sees. Where one position changes (or where the first and the last changed
  positions come after ``p``), both paths are the same; the causal paths cost one pass per changed position and point
  (the clean point shared): three times the straight path's for IOI with all three names replaced.

:py:func:`path_points` gives the points with the positions each of them serves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch

from ...inputs.lookups import needs_ids
from ...rules.boundary import gradient_outputs
from .metrics import Metric, output_logits

__all__ = [
    'PATHS',
    'DEFAULT_PATH',
    'DEFAULT_STEPS',
    'DEFAULT_SPAN',
    'PathPoint',
    'check_path',
    'path_weights',
    'path_points',
    'changed_positions',
    'metric_forward',
    'check_embedding_runs',
]

#: The paths of :py:func:`path_points` (module docstring): name -> what moves on it.
PATHS: dict[str, str] = {
    'causal': 'one path per changed position, the tokens up to it moving',
    'straight': 'every changed token moving at once',
}
#: The default path: measured on SmolLM2 against activation patching (docs/results/patching), the causal paths equal
#: the straight one where one token differs and are closer to activation patching where several do (IOI with all three
#: names replaced: residual streams and MLP outputs).
DEFAULT_PATH = 'causal'
#: The default number of points of a path (Eq. 3 of :py:mod:`~.scores`).
DEFAULT_STEPS = 4
#: How far the points go towards the corrupted input (Eq. 3): the whole way. Half of it (0.5) is closer to activation
#: patching of the heads on the three tasks measured (of the attention outputs on two of them), and further from it
#: for the residual stream and MLP outputs (docs/results/patching/span.md).
DEFAULT_SPAN = 1.0


class PathPoint(NamedTuple):
    """One point of :py:func:`path_points`: the input embeddings ``leaf``, the ``weight`` of its gradient and the
    ``positions`` (``[seq]`` bool) at which its gradient counts."""

    leaf: torch.Tensor
    weight: float
    positions: torch.Tensor


def check_path(path: str) -> str:
    """``path`` if it is one of :py:data:`PATHS`.

    Raises
    ------
    ValueError
        For an unknown path.
    """
    if isinstance(path, str) and path in PATHS:
        return path
    meanings = '; '.join(f'"{name}": {meaning}' for name, meaning in PATHS.items())
    raise ValueError(f'unknown path {path!r}; known: {", ".join(PATHS)} ({meanings}; default "{DEFAULT_PATH}")')


def path_weights(steps: int, span: float = DEFAULT_SPAN) -> list[tuple[float, float]]:
    """``(alpha, weight)`` of the ``steps`` points of a path: ``alpha = span * k / steps`` for ``k = 0 .. steps - 1``,
    each of weight ``1 / steps`` (EAP-IG's Riemann sum for ``span=1``: the clean end of the path included, the
    corrupted end left out, whose gradient is that of a run in which every component is corrupted, not one; ``span <
    1`` stops the points short of it); one step: the clean run alone (Eq. 2 of :py:mod:`~.scores`).

    Raises
    ------
    ValueError
        For ``steps`` not a positive integer, ``span`` not in ``(0, 1]``.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f'steps must be a positive integer, got {steps!r}')
    if isinstance(span, bool) or not isinstance(span, (int, float)) or not 0 < span <= 1:
        raise ValueError(f'span must be a number in (0, 1], got {span!r}')
    return [(span * index / steps, 1.0 / steps) for index in range(steps)]


def changed_positions(clean: torch.Tensor, corrupted: torch.Tensor) -> list[int]:
    """The positions at which any clean prompt differs from its corrupted one (``[pairs, seq]`` ids), ascending."""
    return sorted(set((clean != corrupted).any(0).nonzero()[:, 0].tolist()))


def _path_ends(clean: torch.Tensor, corrupted: torch.Tensor, path: str) -> tuple[list[int], torch.Tensor]:
    """The last moving position of each path (``seq - 1``: all of them) and, per position, the index of the path its
    gradient is taken on (the last changed position at or before it; 0 before the first, where nothing changes)."""
    seq = clean.shape[1]
    changed = changed_positions(clean, corrupted)
    if path == 'straight' or len(changed) < 2:
        return [seq - 1], torch.zeros(seq, dtype=torch.long)
    ends = torch.tensor(changed)
    owner = (torch.searchsorted(ends, torch.arange(seq), right=True) - 1).clamp(min=0)
    return changed, owner


def path_points(
    model: torch.nn.Module,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    steps: int = DEFAULT_STEPS,
    span: float = DEFAULT_SPAN,
    path: str = DEFAULT_PATH,
) -> Iterator[PathPoint]:
    """The points of the paths from the ``clean`` to the ``corrupted`` token ids (module docstring): the clean run
    first (shared by every path, all positions), then the other points of each path with the positions it serves.
    Summing ``weight * gradient`` over the points at their positions gives, at every position, the average gradient
    over the points of its path (:py:func:`path_weights`).

    Raises
    ------
    ValueError
        For a model without input embeddings, an unknown path, ``steps`` or ``span`` out of range.
    """
    check_path(path)
    weights = path_weights(steps, span)
    embeddings = model.get_input_embeddings()
    if embeddings is None:
        raise ValueError(f'{type(model).__name__} has no input embedding: relevance patching runs on embeddings')
    with torch.no_grad():
        start, end = embeddings(clean), embeddings(corrupted)
    seq = clean.shape[1]
    every = torch.ones(seq, dtype=torch.bool, device=start.device)
    yield PathPoint(start, weights[0][1], every)
    ends, owner = _path_ends(clean, corrupted, path)
    for index, last in enumerate(ends):
        moving = (torch.arange(seq, device=start.device) <= last).to(start.dtype)[None, :, None]
        positions = (owner == index).to(start.device)
        for alpha, weight in weights[1:]:
            yield PathPoint(torch.lerp(start, end, alpha * moving), weight, positions)


@contextlib.contextmanager
def metric_forward(model, leaf: torch.Tensor, metric: Metric, composite, resolve: bool):
    """A forward pass of the input embeddings ``leaf`` (in the composite's context, if any) with gradients enabled;
    yields ``(value, start, metric)``: the metric's value (for a composite the initial relevance, see
    :py:meth:`~zennit_attn.inputs.objectives.Objective.value`), the ``grad_outputs`` its backward pass starts with (for
    a composite ``f`` itself: the backward starts with ``df/dy`` at the logits) and the metric, resolved on these
    logits if ``resolve``. Run the backward pass inside the context. The model runs on a copy of ``leaf``, as a model
    may change its embeddings in place (CTRL scales them: a leaf refuses it), as
    :py:meth:`~zennit_attn.inputs.task.TokenTask.run` does."""
    context = contextlib.nullcontext(model) if composite is None else composite.context(model)
    with torch.enable_grad(), context as modified:
        if composite is not None:
            gradient_outputs(composite)  # the metric converts its initial relevance itself
        logits = metric.logits(modified(inputs_embeds=leaf.clone()))
        metric = metric.resolve(logits.detach()) if resolve else metric
        if composite is None:
            value = metric.of(logits)
            yield value, torch.ones_like(value), metric
        else:
            value = metric.of(logits, initial_relevance=True)
            yield value, value.detach(), metric


def check_embedding_runs(model: torch.nn.Module, ids: torch.Tensor, rtol: float = 1e-5) -> None:
    """Refuse a model whose logits on the embeddings of ``ids`` are not those on ``ids``: relevance and edge patching
    run the model on the input embeddings (the points of the paths), and such a model computes another function
    there. Checked where the model may need its ids (:py:func:`~zennit_attn.inputs.lookups.needs_ids`: Gemma 3n and
    Gemma 4 look the ids up in per-layer tables, which a run on embeddings leaves out; the Gemma models' scaled
    embeddings take the ids but compute the same on embeddings), with one forward pass of each.

    Raises
    ------
    ValueError
        Naming the reason and the largest difference of the logits (or the error of the run on embeddings).
    """
    embedding = model.get_input_embeddings()
    reason = needs_ids(model, embedding)
    if reason is None:
        return
    with torch.no_grad():
        on_ids = output_logits(model(input_ids=ids))
        try:
            on_embeddings = output_logits(model(inputs_embeds=embedding(ids).clone()))
            error = None
        except Exception as failure:  # a model that refuses embeddings it cannot map back to ids (Gemma 4)
            on_embeddings, error = None, f'{type(failure).__name__}: {failure}'
    if error is None and on_embeddings.shape == on_ids.shape:
        difference = float((on_embeddings - on_ids).abs().max())
        if difference <= rtol * max(1.0, float(on_ids.abs().max())):
            return
        error = f'its logits differ by up to {difference:.3g}'
    raise ValueError(
        f'{type(model).__name__} computes other logits on the embeddings of its tokens than on its token ids '
        f'({reason}; {error[:300]}): relevance and edge patching take their gradients along the input embeddings, so '
        'they are not available for this model; activation_patching runs on the ids'
    )
