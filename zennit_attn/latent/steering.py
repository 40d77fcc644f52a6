"""Steering: set, scale or shift latent neurons in the forward pass (the paper's section 4, Q3: deactivating the
"cold" neuron and amplifying the "dryness" neuron turns " Arctic" into " desert")."""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence

import torch

from ..engine.composites import refuse_compiled
from .sites import Neuron, find_sites
from .targets import resolve_point

__all__ = ['steer', 'MODES']

#: ``set``: the unit's features become the value; ``scale``: are multiplied by it; ``add``: get it added.
MODES = ('set', 'scale', 'add')


def _positions(positions) -> list[int] | None:
    if positions is None:
        return None
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        return [int(positions)]
    if isinstance(positions, torch.Tensor):
        positions = positions.flatten().tolist()
    if (
        not isinstance(positions, Sequence)
        or not positions
        or not all(isinstance(item, numbers.Integral) and not isinstance(item, bool) for item in positions)
    ):
        raise TypeError(f'positions must be None, an integer or a non-empty sequence of integers, got {positions!r}')
    return [int(item) for item in positions]


@contextlib.contextmanager
def steer(
    model: torch.nn.Module,
    edits: Mapping[Neuron, float],
    mode: str = 'set',
    positions: int | Sequence[int] | None = None,
) -> Iterator[torch.nn.Module]:
    """Change latent units in every forward pass of ``model`` inside the context; undone exactly on exit (also after
    an exception): only forward hooks on the instance are added, parameters are not touched.

    Parameters
    ----------
    model: torch.nn.Module
    edits: mapping of Neuron to float
        The value per unit. An ``'mlp'`` neuron is the input of the FFN down projection (its activation), an
        ``'attention'`` unit a whole head (all its features), a ``'residual'`` unit one hidden dimension of the
        residual stream at a block boundary, ``'query'``/``'key'``/``'value'`` units projection features.
    mode: str
        ``'set'`` (activation := value; 0 switches a neuron off), ``'scale'`` (activation ``*=`` value) or ``'add'``
        (activation += value).
    positions: int, sequence of int or None
        Sequence positions of each forward call to steer (negative counts from the end); None: all. A position
        outside a forward call's sequence is not steered in that call (as in ``generate``'s cached passes, which see
        one token each): check that the positions exist in the inputs you run. In
        ``model.generate`` with a key/value cache (the default) ``-1`` steers the position that predicts each next
        token: the prompt's last token in the first forward pass (so the first generated token already follows the
        steering), then each generated token in its own pass; the earlier prompt tokens are not steered. Their keys
        and values stay in the cache as computed, so this equals steering positions ``P - 1`` to the end (``P``
        prompt tokens) in every pass without a cache, not ``-1`` without a cache (which recomputes the earlier
        generated tokens unsteered).

    Yields
    ------
    torch.nn.Module
        ``model``, steered.

    Raises
    ------
    CompiledModelError
        For a compiled model (``torch.compile(model)`` or ``model.compile()``), whose traced code bypasses the
        steering hooks: steer the uncompiled model.

    Examples
    --------
    >>> with steer(model, {Neuron('mlp', 17, 3948): 0.0, Neuron('mlp', 17, 4104): 8.0}):  # doctest: +SKIP
    ...     model.generate(**inputs, max_new_tokens=5)
    """
    refuse_compiled(model, use='steer')
    if mode not in MODES:
        raise ValueError(f'mode must be one of {", ".join(MODES)}, got {mode!r}')
    if not isinstance(edits, Mapping) or not edits:
        raise TypeError('edits must be a non-empty mapping {Neuron: value}')
    steps = _positions(positions)
    points: dict = {}
    grouped: dict[int, tuple] = {}
    for neuron, value in edits.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f'the value for {neuron} must be a number, got {value!r}')
        if not math.isfinite(value):
            raise ValueError(f'the value for {neuron} must be finite, got {value!r}: it would make every output NaN')
        if isinstance(neuron, Neuron) and neuron.site not in points:
            points.update(find_sites(model, (neuron.site,)))
        point = resolve_point(model, neuron, points)
        grouped.setdefault(id(point), (point, []))[1].append((neuron, float(value)))

    def editor(point, items):
        def edit(tensor):
            if not isinstance(tensor, torch.Tensor):
                return None
            result = tensor.clone()
            sequence = tensor.shape[1] if tensor.dim() >= 3 else None
            where = (
                slice(None)
                if steps is None or sequence is None
                else [
                    position
                    for position in (step % sequence if -sequence <= step < sequence else None for step in steps)
                    if position is not None
                ]
            )
            if where == []:
                return None
            for neuron, value in items:
                features = point.hooked_features(neuron.index, tensor.shape[-1], tensor.device)
                index = (slice(None), where, features) if sequence is not None else (..., features)
                if isinstance(where, list):
                    selected = result[:, where][..., features]
                    new = _edited(selected, value, mode)
                    rows = torch.tensor(where, device=tensor.device)
                    result[:, rows[:, None], features[None, :]] = new
                else:
                    result[index] = _edited(result[index], value, mode)
            return result

        return edit

    handles = []
    try:
        for point, items in grouped.values():
            handles.append(point.hook(editor(point, items)))
        yield model
    finally:
        for handle in handles:
            handle.remove()


def _edited(values: torch.Tensor, value: float, mode: str) -> torch.Tensor:
    if mode == 'set':
        return torch.full_like(values, value)
    if mode == 'scale':
        return values * value
    return values + value
