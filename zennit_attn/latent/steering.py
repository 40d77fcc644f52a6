"""Steering: set, scale or shift latent neurons in the forward pass (the paper's section 4, Q3: deactivating the
"cold" neuron and amplifying the "dryness" neuron turns " Arctic" into " desert")."""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence

import torch

from ..composites import refuse_compiled
from .sites import Neuron, SitePoint, find_sites
from .targets import resolve_point

__all__ = ['steer', 'MODES']

#: ``set``: the unit's features become the value; ``scale``: are multiplied by it; ``add``: get it added.
MODES = ('set', 'scale', 'add')


def _positions(positions) -> list[int] | None:
    """``positions`` of :py:func:`steer` as a list of integers (None: all positions)."""
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
    ValueError
        In a forward call (the error leaves the call) with ``positions``, where a site of the edits holds another
        number of positions than the call's input (``input_ids`` or ``inputs_embeds``) has tokens: the model pads its
        input (Longformer, Reformer) or adds positions of its own (prompt or image tokens in front: CPM-Ant, GIT;
        further streams: ProphetNet), so the positions would not be those of the input. Steer all positions there.
    RuntimeError
        After a forward call of ``model`` that did not run the hooked module of an edit (a block skipped for the input,
        such as Mllama's cross-attention blocks without an image): the edit would change nothing. The call's output
        is not returned.
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
    calls = _Calls(model)
    handles = []
    try:
        for point, items in _edits_by_point(model, edits):
            editor = _Editor(point, items, steps, mode, calls)
            calls.editors.append(editor)
            handles.append(point.hook(editor))
        handles += calls.hook()
        yield model
    finally:
        for handle in handles:
            handle.remove()


def _edits_by_point(model: torch.nn.Module, edits: Mapping[Neuron, float]) -> list[tuple]:
    """``[(point, [(neuron, value), ...])]``: the edits grouped by the site point of their neuron (one hook each),
    each value checked (a finite number) and each neuron resolved in ``model``."""
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
    return list(grouped.values())


class _Calls:
    """The forward calls of the steered model (hooks on the model itself): the number of tokens of the input of each
    call in progress, and the edits whose hook ran in it. After a call every edit's hook must have run: an edit of a
    block the call skipped (Mllama's cross-attention blocks without an image) would silently change nothing."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.editors: list[_Editor] = []
        self.frames: list[tuple[int | None, set[int]]] = []

    def hook(self) -> list:
        """The forward pre-hook and forward hook on the model (remove them)."""
        return [
            self.model.register_forward_pre_hook(self._enter, with_kwargs=True),
            self.model.register_forward_hook(self._leave, with_kwargs=True, always_call=True),
        ]

    def current(self) -> tuple[int | None, set[int]] | None:
        """``(tokens, ids of the editors that ran)`` of the innermost call in progress (None outside a call: a module
        run on its own, the recomputation of a checkpointed block)."""
        return self.frames[-1] if self.frames else None

    def _enter(self, module, args, kwargs) -> None:
        self.frames.append((_input_tokens(args, kwargs), set()))

    def _leave(self, module, args, kwargs, output) -> None:
        if not self.frames:
            return
        _, ran = self.frames.pop()
        if output is None:  # the forward pass raised: its own error reaches the caller
            return
        missing = [editor for editor in self.editors if id(editor) not in ran]
        if missing:
            point = missing[0].point
            neurons = ', '.join(str(neuron) for neuron, _ in missing[0].items)
            raise RuntimeError(
                f'steering {neurons}: the forward pass of {type(self.model).__name__} did not reach {point.site} '
                f'layer {point.layer} ({type(point.module).__name__} did not run in this call, as blocks skipped for '
                'the input do), so the edit would change nothing; steer a layer the forward pass runs, or give the '
                'input that runs it'
            )


def _input_tokens(args: tuple, kwargs: dict) -> int | None:
    """The number of tokens of a forward call's input: of ``input_ids`` (a keyword or the first positional argument,
    ``[batch, seq]`` integers) or ``inputs_embeds`` (``[batch, seq, hidden]``); None for other inputs (images)."""
    ids = kwargs.get('input_ids')
    if ids is None and args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
        ids = args[0]
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        return ids.shape[1]
    embeds = kwargs.get('inputs_embeds')
    if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
        return embeds.shape[1]
    return None


class _Editor:
    """The hook of one site point in :py:func:`steer`: edits the units ``items`` (``[(neuron, value)]``) at the
    positions ``steps`` (None: all) of every forward pass, on a copy of the site tensor (None where nothing is
    steered: the tensor stays); tells ``calls`` that it ran."""

    def __init__(
        self, point: SitePoint, items: list[tuple[Neuron, float]], steps: list[int] | None, mode: str, calls: _Calls
    ):
        self.point, self.items, self.steps, self.mode, self.calls = point, items, steps, mode, calls

    def __call__(self, tensor):
        frame = self.calls.current()
        if frame is not None:
            frame[1].add(id(self))
        if not isinstance(tensor, torch.Tensor):
            return None
        sequence = tensor.shape[1] if tensor.dim() >= 3 else None
        if self.steps is not None and sequence is not None and frame is not None:
            self._check_tokens(sequence, frame[0])
        where = self._where(sequence)
        if where == []:
            return None
        result = tensor.clone()
        for neuron, value in self.items:
            features = self.point.hooked_features(neuron.index, tensor.shape[-1], tensor.device)
            if isinstance(where, list):
                rows = torch.tensor(where, device=tensor.device)
                result[:, rows[:, None], features[None, :]] = _edited(result[:, where][..., features], value, self.mode)
            else:
                index = (slice(None), where, features) if sequence is not None else (..., features)
                result[index] = _edited(result[index], value, self.mode)
        return result

    def _check_tokens(self, sequence: int, tokens: int | None) -> None:
        """Refuse positions where the site holds another number of positions than the call's input has tokens
        (padding inside the model, prompt or image tokens in front, further streams after the tokens): they would
        be counted in the site tensor, not in the input."""
        if tokens is None or sequence == tokens:
            return
        point = self.point
        raise ValueError(
            f'steering with positions: {point.site} layer {point.layer} of {type(self.calls.model).__name__} holds '
            f'{sequence} positions where the input of the forward call has {tokens} tokens (the model pads its input '
            'or adds positions of its own), so positions counted in the input do not name its positions; steer all '
            'positions (positions=None), or a model whose blocks see the tokens of its input'
        )

    def _where(self, sequence: int | None) -> slice | list[int]:
        """The positions to steer in a forward pass over ``sequence`` tokens: all (a slice) without ``steps`` or a
        sequence dimension, else the steps inside the sequence (negative ones counted from its end)."""
        if self.steps is None or sequence is None:
            return slice(None)
        return [step % sequence for step in self.steps if -sequence <= step < sequence]


def _edited(values: torch.Tensor, value: float, mode: str) -> torch.Tensor:
    if mode == 'set':
        return torch.full_like(values, value)
    if mode == 'scale':
        return values * value
    return values + value
