"""Latent targets and conditions for :py:func:`~zennit_attn.explain`: explaining a neuron's activation instead of a
logit (``target=Neuron(...)``), recording latent relevance (``latent=``) and conditional relevance (``condition=``).

Explaining a neuron (paper section 3.5, the reference-sample heatmaps of the knowledge-neuron appendix): the task
receives a :py:class:`LatentTarget`, a :py:class:`~zennit_attn.inputs.task.Readout` of the neuron's activation
(``task.with_readout(...)``; the task's class is unchanged), so every method that reads scores through the
:py:class:`~zennit_attn.inputs.task.Task` explains it (``Method.neuron`` of
:py:class:`~zennit_attn.methods.registry.Method`); for LRP the activation is the initial relevance (the model's output
boundary, which turns the initial relevance into a gradient, is bypassed, so the target does that conversion itself).

Conditional relevance (Concept Relevance Propagation, Achtibat et al. 2023, as ``zennit-crp``'s ``CondAttribution``
with conditions such as ``{'layer': [3948]}``): the input relevance of the prediction that flows through the given
neurons only. Because every AttnLRP backward rule is linear in the incoming (modified) gradient, this is the input
relevance of the linear target ``f = sum_j x_j * stopgrad(g_j * m_j)`` at the site tensor ``x``, with ``g`` the
modified gradient the prediction sends to ``x`` (first pass) and ``m`` the condition's mask (second pass, all
conditions as one batch). Consequently the conditional heatmaps of all units of a site and layer sum to the heatmap
of the whole site, and at the residual stream (a cut through the network) to the unconditional heatmap.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import torch

from ..inputs.objectives import RelevanceToGradient
from ..inputs.task import ImageTask, Readout, Task, TokenTask
from ..methods.registry import METHODS, Method
from .recording import REDUCTIONS, Recorder, unreached
from .sites import SITES, Neuron, SitePoint, find_sites

__all__ = ['LatentTarget', 'explain_latent', 'repeat_task', 'resolve_point']


class LatentTarget(Readout):
    """The :py:class:`~zennit_attn.inputs.task.Readout` of a latent target: unit ``index`` of ``point`` (a neuron;
    scores ``[batch, seq, 1]``, one per position), or the linear target ``sum(x * weights)`` over positions and features
    (scores ``[batch, 1]``), read at the site tensor ``x`` of the model's run. A task explains it with
    ``task.with_readout(LatentTarget(...))``; a method then runs inside ``task.capturing()``.

    Parameters
    ----------
    point: SitePoint
        The site of one layer (:py:func:`resolve_point`).
    index: int, optional
        The unit (neuron) explained at each position.
    weights: torch.Tensor, optional
        ``[batch, seq, features]`` weights of the linear target (rows as the task's), instead of ``index``.
    """

    model_output = False

    def __init__(self, point: SitePoint, index: int | None = None, weights: torch.Tensor | None = None):
        if (index is None) == (weights is None):
            raise ValueError('a latent target is a unit index or the weights of a linear target, one of the two')
        self.point, self.index, self.weights = point, index, weights
        self.hooked = False
        self.captured: list[tuple[torch.Tensor, int]] = []

    def capturing(self, task: Task) -> contextlib.AbstractContextManager:
        """Hook the target's site for the time of the context, registered before a method enters a composite's
        context (so the target sees the site tensor before the composite's hooks and after any steering)."""
        return self._capturing()

    @contextlib.contextmanager
    def _capturing(self):
        handle = self.point.hook(lambda tensor: _versioned(self.captured)(tensor))
        try:
            self.hooked = True
            yield self
        finally:
            self.hooked = False
            handle.remove()

    def read(
        self,
        task: Task,
        inputs: torch.Tensor,
        rows: torch.Tensor | None = None,
        model: torch.nn.Module | None = None,
        initial_relevance: bool = False,
        **extra,
    ) -> torch.Tensor:
        """The target's value in the run of ``model`` on ``inputs``; ``initial_relevance``: LRP's backward pass starts
        with the value itself (the initial relevance), which the target turns into the gradient (the model's output
        boundary, which does that for logits, is bypassed)."""
        self.captured = captured = []
        handle = None if self.hooked else self.point.hook(_versioned(captured), prepend=True)
        try:
            task.run(inputs, rows, model, **extra)
        finally:
            if handle is not None:
                handle.remove()
        if not captured:
            raise RuntimeError(f'the forward pass did not reach {unreached(self.point)}')
        tensor, version = captured[0]
        if tensor._version != version:
            raise ValueError(
                f'{self.point.site} layer {self.point.layer}: {type(self.point.module).__name__} gave out a tensor '
                "that the model's forward pass changed in place after it, so the target would read the changed "
                'tensor, not the site: a Neuron target or condition at this site is not available for this model; '
                'use another site'
            )
        site = self.point.select(tensor)
        if self.weights is None:
            unit = self.point.unit_features(self.index, site.shape[-1])
            scores = site[..., unit].sum(-1, keepdim=True)  # [batch, seq, 1]
        else:
            weights = self.weights if rows is None else self.weights[rows]
            scores = (site * weights.to(site.dtype)).flatten(1).sum(1, keepdim=True)  # [batch, 1]
        if initial_relevance:
            scores = RelevanceToGradient.apply(scores, 1.0 if self.weights is not None else 0.0)  # linear targets: 1
        return scores


def _versioned(captured: list):
    """A site hook that appends ``(tensor, its version)`` to ``captured``: the version tells whether the forward pass
    changed the tensor in place after the site gave it out."""
    return lambda tensor: captured.append((tensor, tensor._version))


def resolve_point(model: torch.nn.Module, neuron: Neuron, points: dict | None = None) -> SitePoint:
    """The :py:class:`SitePoint` of ``neuron`` in ``model``; its layer and index checked where the module tells its
    size."""
    if not isinstance(neuron, Neuron):
        raise TypeError(f'expected a zennit_attn.latent.Neuron, got {type(neuron).__name__}')
    points = find_sites(model, (neuron.site,)) if points is None or neuron.site not in points else points
    layers = points[neuron.site]
    if not -len(layers) <= neuron.layer < len(layers):
        count = len(layers) - 1 if neuron.site == 'residual' else len(layers)
        raise ValueError(
            f'layer {neuron.layer} is out of range: {type(model).__name__} has {count} layers'
            + (' (residual: 0 to layers)' if neuron.site == 'residual' else '')
        )
    point = layers[neuron.layer]
    width = point.width()
    if neuron.site == 'residual' and hasattr(model, 'get_input_embeddings'):
        embedding = model.get_input_embeddings()
        width = getattr(embedding, 'embedding_dim', None)
    if width is not None:
        point.unit_features(neuron.index, width)  # raises for an index out of range
    return point


def repeat_task(task: Task, repeats: int) -> Task:
    """A task whose rows are those of ``task``, each repeated ``repeats`` times (row ``r * repeats + c``)."""

    def repeat(value):
        if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == task.batch:
            return value.repeat_interleave(repeats, 0)
        return value

    if isinstance(task, TokenTask):
        kwargs = {
            key: repeat(value)
            for key, value in task.model_kwargs.items()
            if key not in ('attention_mask', 'position_ids')
        }
        return TokenTask(
            task.model, repeat(task.input_ids), repeat(task.attention_mask), kwargs, repeat(task.decoder_input_ids)
        )
    if isinstance(task, ImageTask):
        kwargs = {key: repeat(value) for key, value in task.model_kwargs.items()}
        return ImageTask(task.model, repeat(task.inputs), kwargs)
    raise TypeError(f'cannot repeat a {type(task).__name__}')


def _conditions(condition, model) -> list[tuple[SitePoint, list[Neuron]]]:
    """``condition`` (a Neuron, or a sequence of conditions each a Neuron or a sequence of Neurons of one site and
    layer) -> ``[(point, neurons)]``, one per condition."""
    if isinstance(condition, Neuron):
        condition = [condition]
    if isinstance(condition, (str, bytes)) or not isinstance(condition, Sequence) or not condition:
        raise TypeError(
            'condition must be a Neuron or a non-empty list of conditions, each a Neuron or a list of '
            f'Neurons of one site and layer; got {condition!r}'
        )
    points = {}
    result = []
    for item in condition:
        neurons = [item] if isinstance(item, Neuron) else list(item) if isinstance(item, (list, tuple)) else None
        if not neurons or not all(isinstance(neuron, Neuron) for neuron in neurons):
            raise TypeError(f'each condition must be a Neuron or a non-empty list of Neurons, got {item!r}')
        for neuron in neurons:
            if neuron.site not in points:
                points.update(find_sites(model, (neuron.site,)))
        resolved = [resolve_point(model, neuron, points) for neuron in neurons]
        if any(point is not resolved[0] for point in resolved):
            raise ValueError(f'the neurons of one condition must share site and layer, got {neurons}')
        result.append((resolved[0], neurons))
    return result


def explain_latent(
    method: Method,
    task: Task,
    position,
    target,
    params: dict,
    latent=None,
    latent_reduce: str | None = None,
    condition=None,
) -> object:
    """Run ``method`` (a :py:class:`~zennit_attn.methods.registry.Method`, its ``params`` checked) on ``task`` with a
    :py:class:`Neuron` target, latent recording and/or conditions (see :py:func:`~zennit_attn.explain`).

    Raises
    ------
    ValueError
        For an unknown site or reduction, ``latent=``/``condition=`` with a method that is not one forward and one
        backward pass (``Method.latent`` of :py:class:`~zennit_attn.methods.registry.Method`), a Neuron target with a
        method that cannot explain it (``Method.neuron`` of :py:class:`~zennit_attn.methods.registry.Method`).
    NotImplementedError
        For tokens not laid out as the model's sequences (a multiple-choice head's:
        :py:meth:`~zennit_attn.inputs.task.Task.check_token_layout`): the sites hold the model's sequences.
    """
    model = task.model
    latent = _check_request(method, target, latent, latent_reduce, condition)
    task.check_token_layout('latent relevance, Neuron targets and conditions')
    neuron = target if isinstance(target, Neuron) else None
    if neuron is not None:
        task = task.with_readout(LatentTarget(resolve_point(model, neuron), index=neuron.index))
        target = 0
    conditions = _conditions(condition, model) if condition is not None else []
    points = find_sites(model, latent) if latent is not None else {}
    keep = {(point.site, point.layer) for point, _ in conditions}
    for point, _ in conditions:
        points.setdefault(point.site, find_sites(model, (point.site,))[point.site])
    mask = getattr(task, 'attention_mask', None)
    recorder = Recorder(points, latent_reduce, mask, keep, task.token_count())
    with recorder.recording(model), task.capturing():
        explanation = method.function(task, position=position, target=target, **params)
    recorded = None if latent is None else _latent_of(recorder, latent)
    if neuron is not None:
        explanation = dataclasses.replace(explanation, target=torch.full_like(explanation.target, neuron.index))
    if conditions:
        explanation = _conditional(method, task, explanation, recorder, conditions, params)
    return dataclasses.replace(explanation, latent=recorded)


def _check_request(method: Method, target, latent, latent_reduce: str | None, condition) -> tuple[str, ...] | None:
    """``latent`` as a tuple of sites (None: none asked), after refusing an unknown site or reduction, and a method
    that cannot do what is asked (see :py:func:`explain_latent`)."""
    if latent_reduce not in REDUCTIONS:
        raise ValueError(
            f'latent_reduce must be None (every position) or "sum" (sum over positions), got {latent_reduce!r}'
        )
    if isinstance(latent, str):
        latent = (latent,)
    if latent is not None:
        latent = tuple(latent)
        unknown = [site for site in latent if site not in SITES]
        if unknown or not latent:
            raise ValueError(f'unknown latent site(s) {unknown or latent}; known sites: {", ".join(SITES)}')
    if (latent is not None or condition is not None) and not method.latent:
        raise ValueError(
            f'latent= and condition= read the relevance of one backward pass, which {method.name!r} does '
            f'not have; use one of {", ".join(name for name, entry in METHODS.items() if entry.latent)}'
        )
    if isinstance(target, Neuron) and not method.neuron:
        raise ValueError(
            f'{method.name!r} cannot explain a Neuron target (it reads attention maps or output '
            'probabilities); use one of '
            f'{", ".join(name for name, entry in METHODS.items() if entry.neuron)}'
        )
    return latent


def _latent_of(recorder: Recorder, latent: tuple[str, ...]):
    """The recorded :py:class:`~zennit_attn.latent.recording.Latent` of the sites asked for (a condition's site is
    recorded as well, for the second pass, but not reported)."""
    recorded = recorder.latent()
    recorded.relevance = {site: value for site, value in recorded.relevance.items() if site in latent}
    recorded.activation = {site: value for site, value in recorded.activation.items() if site in latent}
    return recorded


def _conditional(method: Method, task: Task, explanation, recorder: Recorder, conditions, params: dict):
    """The second pass of conditional relevance: all conditions of one site point as one batch; the result has one
    row per input row and condition (row ``r * conditions + c``)."""
    weights = [(point, _condition_weights(point, neurons, recorder)) for point, neurons in conditions]
    results = _explain_conditions(method, task, weights, params)
    count = len(conditions)
    pieces = {}
    for name in (
        'relevance',
        'embedding_relevance',
        'pixel_relevance',
        'logit',
        'position_relevance',  # PA-LRP's positions: the conditions' own, not the first pass's
        'decoder_position_relevance',
        'position_pixel_relevance',
    ):
        if hasattr(explanation, name):
            pieces[name] = _interleaved(results, name, task.batch)
    for name in ('target', 'position', 'input_ids', 'attention_mask', 'pixels'):
        if hasattr(explanation, name):
            value = getattr(explanation, name)
            pieces[name] = None if value is None else value.repeat_interleave(count, 0)
    return dataclasses.replace(explanation, method=method.name, **pieces)


def _condition_weights(point: SitePoint, neurons: list[Neuron], recorder: Recorder) -> torch.Tensor:
    """The weights ``g * m`` of a condition's linear target: the modified gradient ``g`` the prediction sent to the
    site in the first pass (zeros where none arrived), masked to the condition's units ``m``."""
    key = (point.site, point.layer)
    if key not in recorder.gradients:
        gradient = torch.zeros_like(recorder.tensors[key])
        gradient = point.select(gradient)
    else:
        gradient = recorder.gradients[key]
    mask = torch.zeros(gradient.shape[-1], dtype=gradient.dtype, device=gradient.device)
    for neuron in neurons:
        mask[point.unit_features(neuron.index, gradient.shape[-1])] = 1
    return gradient * mask


def _explain_conditions(method: Method, task: Task, weights: list, params: dict) -> list[tuple]:
    """Explain the linear target of every condition (``weights``: ``[(point, g * m)]``), the conditions of one site
    point as one batch of ``task`` repeated; ``(explanation, offset, width)`` per condition: its rows are
    ``row * width + offset`` of that explanation."""
    results = [None] * len(weights)
    by_point: dict[int, list[int]] = {}
    for number, (point, _) in enumerate(weights):
        by_point.setdefault(id(point), []).append(number)
    for numbers in by_point.values():
        point = weights[numbers[0]][0]
        repeated = repeat_task(task, len(numbers))
        stacked = torch.stack([weights[number][1] for number in numbers], 1).flatten(0, 1)  # [batch * conditions, ...]
        conditional = repeated.with_readout(LatentTarget(point, weights=stacked.detach()))
        with conditional.capturing():
            result = method.function(conditional, position=None, target=0, **params)
        for offset, number in enumerate(numbers):
            results[number] = (result, offset, len(numbers))
    return results


def _interleaved(results: list[tuple], name: str, batch: int) -> torch.Tensor | None:
    """Field ``name`` of the conditions' explanations as one tensor of row ``r * conditions + c`` (None where the
    explanations have none)."""
    values = []
    for row in range(batch):
        for result, offset, width in results:
            value = getattr(result, name)
            values.append(None if value is None else value[row * width + offset])
    return None if values[0] is None else torch.stack(values)
