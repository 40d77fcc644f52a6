"""Relevance patching and activation patching of prompt pairs.

For a clean prompt ``x``, a corrupted prompt ``x'`` and a metric ``m`` of the logits, activation patching (Vig et al.
2020; Meng et al. 2022; Wang et al. 2023) puts one component's corrupted activation ``a'`` into the clean run and
measures

.. math:: \\Delta m = m(x \\mid a \\leftarrow a') - m(x),                                          \\qquad (1)

one forward pass per component. This is the *noising* direction (the default, :py:data:`DIRECTIONS`); *denoising*
puts the clean activation into the corrupted run, ``m(x' | a' <- a) - m(x')``, with ``x`` and ``x'`` exchanged in
(1) to (3) (the terms of Heimersheim and Nanda 2024, "How to use and interpret activation patching", arXiv
2404.15255: denoising, clean into corrupted, tests whether a component is sufficient; noising, corrupted into clean,
whether it is necessary). Attribution patching (AtP, Nanda 2023; Syed et al. 2023) takes its first-order
approximation at the clean run, and relevance patching (RelP, Rezaei Jafari et al. 2025) replaces the gradient by
LRP's propagation coefficients, the modified gradient ``g`` of the gradient x input formulation, in which the
relevance of every tensor ``a`` is ``R = a * g``:

.. math:: \\widehat{\\Delta m} = (a' - a) \\cdot g,                                                 \\qquad (2)

summed over the component's features (and positions, where patched at all of them). ``g`` of every site comes out
of one forward and one backward pass of the clean prompts in a composite's context
(:py:class:`~zennit_attn.composites.AttnLRPComposite`), read with the latent recorder
(:py:class:`~zennit_attn.latent.recording.Recorder`); the plain gradient gives AtP. Where the model is linear in the
activation between the site and the metric (the output of the last block under a logit difference), (2) equals (1)
for the plain gradient.

With ``steps > 1`` the gradient is averaged along a path of the input embeddings from the clean (``alpha = 0``) to
the corrupted prompt (``alpha = 1``), as integrated gradients and EAP-IG (Hanna et al. 2024) do, with the points and
weights of :py:func:`~.paths.path_weights`; for a component at position ``p`` the path moves the tokens up to the last
changed position ``c <= p`` only (``m_c``: 1 at the positions up to ``c``; the causal paths of :py:mod:`~.paths`):

.. math:: \\widehat{\\Delta m} = (a' - a) \\cdot \\sum_k w_k\\, g(x + \\alpha_k m_c (x' - x)).       \\qquad (3)

The points may stop short of the corrupted end (``span < 1``, ``alpha_k = span * k / steps``): at the corrupted end
every component is corrupted, while activation patching corrupts one. On SmolLM2 the first half of the path is closer
to activation patching for the heads (and the attention outputs but for one task), components that carry a small part
of the change; the whole path is closer for those that carry most of it (the residual stream, early MLP outputs at
the changed position; ``docs/results/patching/span.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from tqdm.auto import tqdm
from zennit.core import Composite

from ...composites import AttnLRPComposite, AttnLRPEpsilon, CPLRPEpsilon, MLPRules, RelPEpsilon
from ...core.devices import input_device
from ...inputs.checks import check_model, check_vocabulary
from ...latent.recording import Recorder
from ..statistics import pearson, spearman
from .components import DEFAULT_COMPONENTS, Component, block_count, component_points, site_points
from .metrics import FullLogits, Metric, make_metric, output_logits
from .paths import (
    DEFAULT_PATH,
    DEFAULT_SPAN,
    DEFAULT_STEPS,
    check_embedding_runs,
    check_path,
    metric_forward,
    path_points,
    path_weights,
)

__all__ = [
    'PATCHING_METHODS',
    'DEFAULT_METHOD',
    'PatchingScores',
    'RankedComponent',
    'DIRECTIONS',
    'DEFAULT_DIRECTION',
    'check_direction',
    'relevance_patching',
    'activation_patching',
    'patching_composite',
    'correlation',
    'check_pairs',
    'PathRun',
    'path_run',
    'last_logits',
]

#: The methods of :py:func:`relevance_patching`: name -> composite class (None: the plain gradient, AtP).
PATCHING_METHODS: dict[str, type | None] = {
    'attnlrp': AttnLRPEpsilon,
    'relp': RelPEpsilon,
    'mlp_rules': MLPRules,
    'cplrp': CPLRPEpsilon,
    'atp': None,
}

#: The default method: of the methods measured on SmolLM2 against activation patching (docs/results/patching), the
#: highest mean and the highest lowest Pearson correlation over the tasks and component types: the plain gradient
#: averaged over :py:data:`~.paths.DEFAULT_STEPS` points of the paths (AtP with EAP-IG's path, on the causal paths of
#: :py:mod:`~.paths`). At one point (one backward pass) the LRP rules lead AtP on residual streams and MLP outputs
#: ('mlp_rules', 'attnlrp'); their modified gradients are not gradients of a function, and averaging them along the path
#: does not improve them.
DEFAULT_METHOD = 'atp'

#: The directions of patching: name -> (the prompts of the patched runs, the prompts whose activations are patched
#: in). ``'noising'`` puts the corrupted activations into the clean run (Eq. 1; the default), ``'denoising'`` the clean
#: activations into the corrupted run (Heimersheim and Nanda 2024).
DIRECTIONS: dict[str, tuple[str, str]] = {'noising': ('clean', 'corrupted'), 'denoising': ('corrupted', 'clean')}
#: The default direction, what patching computed before the directions were named.
DEFAULT_DIRECTION = 'noising'


#: How :py:class:`RankedComponent` names the units of the components patched per unit.
UNIT_NAMES: dict[str, str] = {'heads': 'head', 'z': 'head', 'neurons': 'neuron'}


class RankedComponent(NamedTuple):
    """One entry of :py:meth:`PatchingScores.top`: ``component`` (a key of
    :py:data:`~.components.COMPONENTS`), ``layer``, ``unit`` (0 for whole outputs, else the head or neuron) and the
    mean ``score`` over pairs (summed over positions)."""

    component: str
    layer: int
    unit: int
    score: float

    def __str__(self) -> str:
        unit = UNIT_NAMES.get(self.component)
        unit = f' {unit} {self.unit}' if unit else ''
        return f'{self.component} layer {self.layer}{unit}: {self.score:+.4f}'


@dataclass
class PatchingScores:
    """Scores of components for prompt pairs: :py:func:`relevance_patching` (Eq. 2) or :py:func:`activation_patching`
    (Eq. 1).

    Attributes
    ----------
    scores: dict of str to torch.Tensor
        ``component -> [pairs, layers, seq, units]`` (``per_position``) or ``[pairs, layers, units]`` (patched at
        every position at once): the estimated or measured change of the metric. ``layers`` is the number of blocks
        (``+ 1`` for ``residual``), ``units`` 1 for whole outputs, the heads, the FFN neurons.
    clean: torch.Tensor
        ``[pairs]`` metric of the clean prompts.
    corrupted: torch.Tensor
        ``[pairs]`` metric of the corrupted prompts.
    method: str
        ``'activation'`` or the relevance patching method.
    per_position: bool
    seconds: float
        Wall time of the computation.
    direction: str
        ``'noising'`` (the corrupted activation into the clean run: the change from ``clean``) or ``'denoising'``
        (the clean activation into the corrupted run: the change from ``corrupted``), :py:data:`DIRECTIONS`.
    layers: dict of str to list of int, optional
        ``component -> `` the layer (block) number of each entry of its layer axis, where it is not the entry's
        index (``resid_post``, a TransformerLens hook name such as ``'blocks.3.hook_z'``; None for a module path).
    """

    scores: dict[str, torch.Tensor]
    clean: torch.Tensor
    corrupted: torch.Tensor
    method: str
    per_position: bool = True
    seconds: float = 0.0
    tokens: list[list[str]] | None = field(default=None, repr=False)
    direction: str = DEFAULT_DIRECTION
    layers: dict[str, list[int | None]] | None = field(default=None, repr=False)

    def __getitem__(self, component: str) -> torch.Tensor:
        if component not in self.scores:
            raise KeyError(f'component {component!r} was not scored; scored: {", ".join(self.scores)}')
        return self.scores[component]

    def summed(self, component: str) -> torch.Tensor:
        """``[pairs, layers, units]``: the scores of ``component`` summed over positions (unchanged if patched at
        every position at once)."""
        values = self[component]
        return values.sum(2) if self.per_position else values

    def mean(self, component: str) -> torch.Tensor:
        """``[layers, units]``: the mean over pairs of :py:meth:`summed`."""
        return self.summed(component).mean(0)

    def top(self, k: int = 10, components: Sequence[str] | None = None) -> list[RankedComponent]:
        """The ``k`` components with the largest absolute :py:meth:`mean` score, of ``components`` (default: all
        scored), largest first."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f'k must be a positive integer, got {k!r}')
        entries = []
        for component in components if components is not None else list(self.scores):
            mean = self.mean(component)
            numbers = (self.layers or {}).get(component) or list(range(mean.shape[0]))
            for layer, unit in torch.cartesian_prod(torch.arange(mean.shape[0]), torch.arange(mean.shape[1])).tolist():
                number = layer if numbers[layer] is None else numbers[layer]
                entries.append(RankedComponent(component, number, unit, float(mean[layer, unit])))
        entries.sort(key=lambda entry: -abs(entry.score))
        return entries[:k]


def patching_composite(method: str | Composite) -> tuple[str, Composite | None]:
    """``(name, composite)`` of a relevance patching ``method``: a key of :py:data:`PATCHING_METHODS` or a
    zennit-attn composite instance (its class name is the name).

    Raises
    ------
    ValueError
        For an unknown method.
    """
    if isinstance(method, AttnLRPComposite):
        return type(method).__name__, method
    if isinstance(method, str) and method in PATCHING_METHODS:
        composite = PATCHING_METHODS[method]
        return method, None if composite is None else composite()
    raise ValueError(
        f'unknown relevance patching method {method!r}; known: {", ".join(PATCHING_METHODS)}, or an '
        'AttnLRPComposite instance'
    )


def check_direction(direction: str) -> tuple[str, str]:
    """``(run, source)`` of a patching ``direction`` (:py:data:`DIRECTIONS`): ``'clean'`` or ``'corrupted'``, the
    prompts of the patched runs and those whose activations are patched in.

    Raises
    ------
    ValueError
        For an unknown direction.
    """
    if not isinstance(direction, str) or direction not in DIRECTIONS:
        raise ValueError(
            f'unknown patching direction {direction!r}; known: {", ".join(DIRECTIONS)} ("noising": the corrupted '
            'activations into the clean run, the default; "denoising": the clean activations into the corrupted run)'
        )
    return DIRECTIONS[direction]


def check_pairs(model: torch.nn.Module, clean, corrupted) -> tuple[torch.Tensor, torch.Tensor]:
    """``clean`` and ``corrupted`` token ids as ``[pairs, seq]`` tensors on the model's input device.

    Raises
    ------
    ValueError
        For no pairs or empty prompts, prompts of different shapes, ids that are not integers or outside the model's
        vocabulary.
    """
    check_model(model)
    clean, corrupted = torch.as_tensor(clean), torch.as_tensor(corrupted)
    for name, ids in (('clean', clean), ('corrupted', corrupted)):
        if ids.numel() == 0:
            raise ValueError(
                f'{name} holds no token ids (shape {tuple(ids.shape)}): patching needs at least one prompt pair of '
                'at least one token'
            )
    if clean.dim() == 1:
        clean, corrupted = clean[None], corrupted[None] if corrupted.dim() == 1 else corrupted
    if clean.dim() != 2 or clean.shape != corrupted.shape:
        raise ValueError(
            'clean and corrupted must be token ids of the same shape [pairs, seq] (prompts of one length, no '
            f'padding: the components are compared position by position), got {tuple(clean.shape)} and '
            f'{tuple(corrupted.shape)}'
        )
    if clean.is_floating_point() or corrupted.is_floating_point():
        raise ValueError('clean and corrupted must be token ids (integers)')
    embedding = model.get_input_embeddings() if hasattr(model, 'get_input_embeddings') else None
    if embedding is not None:
        check_vocabulary(clean, embedding, 'clean')
        check_vocabulary(corrupted, embedding, 'corrupted')
    device = input_device(model)
    return clean.long().to(device), corrupted.long().to(device)


class PathRun(NamedTuple):
    """The checked arguments of a patching run along the path (Eq. 3): the method's ``name`` and ``composite``
    (None: the plain gradient), the ``clean`` and ``corrupted`` token ids and the ``metric``."""

    name: str
    composite: Composite | None
    clean: torch.Tensor
    corrupted: torch.Tensor
    metric: Metric


def path_run(
    model: torch.nn.Module, clean, corrupted, answers, wrong, metric, method, steps: int, span: float, path: str
) -> PathRun:
    """Check the arguments shared by :py:func:`relevance_patching` and
    :py:func:`~.edges.edge_patching` before anything runs.

    Raises
    ------
    ValueError
        For an unknown method, metric or path, ``steps`` or ``span`` out of range, prompts of different shapes, a
        model that computes another function on its embeddings than on its ids (:py:func:`~.paths.
        check_embedding_runs`).
    """
    name, composite = patching_composite(method)
    path_weights(steps, span)
    check_path(path)
    clean, corrupted = check_pairs(model, clean, corrupted)
    check_embedding_runs(model, clean[:1])
    return PathRun(name, composite, clean, corrupted, make_metric(metric, answers, wrong, clean.shape[0]))


def last_logits(output) -> torch.Tensor:
    """``[batch, vocab]`` logits at the last position of a causal language model's output."""
    return output_logits(output)[:, -1]


def _capture(model: torch.nn.Module, points, ids: torch.Tensor, metric: Metric) -> tuple[dict, torch.Tensor]:
    """The hooked site tensors ``(site, layer) -> [pairs, seq, features]`` and the logits the metric reads of a plain
    forward pass of ``ids``."""
    keys = {(point.site, point.layer) for layer in points.values() for point in layer}
    recorder = Recorder(points, keep=keys, tokens=ids.shape[1])
    with torch.no_grad(), recorder.recording(model):
        logits = metric.logits(model(input_ids=ids))
    missing = sorted(keys - set(recorder.tensors))
    if missing:
        raise ValueError(
            f'the forward pass did not give {missing[0][0]!r} (layer {missing[0][1]}) a tensor: a module path must '
            'name a module the forward pass runs that returns a tensor [batch, seq, features] (or a tuple starting '
            'with one)'
        )
    return recorder.tensors, logits


def _modified_gradients(model, leaf, points, metric: Metric, composite, resolve: bool) -> tuple:
    """One forward and one backward pass of the input embeddings ``leaf``: the recorder holding each site's tensor and
    its (modified) gradient of the metric, the metric's value and the metric (resolved on these logits if
    ``resolve``)."""
    keys = {(point.site, point.layer) for layer in points.values() for point in layer}
    recorder = Recorder(points, keep=keys, tokens=leaf.shape[1])
    leaf = leaf.detach().requires_grad_(True)
    with recorder.recording(model), metric_forward(model, leaf, metric, composite, resolve) as (value, start, metric):
        torch.autograd.grad(value, leaf, grad_outputs=start)
    return recorder, value.detach(), metric


def _path_gradients(
    model, run, source, points, metric: Metric, composite, steps: int, span: float, path: str, resolve: bool = True
) -> tuple:
    """The ``run``'s recorder (site tensors at its first point), the (modified) gradient at every site averaged over
    the points of the paths from the ``run`` to the ``source`` prompts (:py:func:`~.paths.path_points`; at each
    position, those of its path), the metric of the ``run`` and the metric (resolved on the run if ``resolve``)."""
    gradients, first = {}, None
    for leaf, weight, positions in path_points(model, run, source, steps, span, path):
        recorder, value, resolved = _modified_gradients(
            model, leaf, points, metric, composite, resolve=resolve and first is None
        )
        if first is None:
            first, metric = (recorder, value, resolved), resolved
        for key, gradient in recorder.gradients.items():
            share = weight * gradient * positions.to(gradient.dtype)[:, None]
            gradients[key] = gradients[key] + share if key in gradients else share
    return first[0], gradients, first[1], first[2]


def relevance_patching(
    model: torch.nn.Module,
    clean,
    corrupted,
    answers=None,
    wrong=None,
    metric: str | Callable | FullLogits = 'logit_difference',
    components: Sequence[str] = DEFAULT_COMPONENTS,
    method: str | Composite = DEFAULT_METHOD,
    per_position: bool = True,
    steps: int = DEFAULT_STEPS,
    span: float = DEFAULT_SPAN,
    direction: str = DEFAULT_DIRECTION,
    path: str = DEFAULT_PATH,
) -> PatchingScores:
    """Relevance patching (Eq. 2, 3): ``(a' - a) . g`` of every component, ``g`` the (modified) gradient of the metric
    at the component averaged over ``steps`` points of the path from the clean to the corrupted input embeddings (at
    each position, of its causal path: :py:mod:`~.paths`), for all components in one forward and one backward pass per
    point (plus one forward pass of the corrupted prompts for ``a'``). ``steps=1`` is the clean run alone: AtP with the
    plain gradient, RelP with ``method='relp'``.

    Parameters
    ----------
    model: torch.nn.Module
        A causal language model (in eval mode) whose latent sites are found
        (:py:func:`~zennit_attn.latent.find_sites`).
    clean, corrupted: tensor or nested sequence of int
        ``[pairs, seq]`` token ids, each corrupted prompt as long as its clean one (no padding).
    answers, wrong: int, sequence or tensor, optional
        Token ids of the right and the wrong answer per pair (see :py:mod:`~.metrics`).
    metric: str or callable
        ``'logit_difference'`` (default), ``'log_probability'``, ``'logit'``, ``f(logits [n, vocab]) -> [n]`` of
        the last position's logits, or :py:class:`~.metrics.FullLogits` ``(f)`` with ``f(logits [n, seq, vocab]) ->
        [n]`` of the logits at every position (:py:mod:`~.metrics`).
    components: sequence of str
        Keys of :py:data:`~.components.COMPONENTS`.
    method: str or AttnLRPComposite
        ``'atp'`` (default: the plain gradient, :py:data:`DEFAULT_METHOD`), ``'attnlrp'``
        (:py:class:`~zennit_attn.composites.AttnLRPEpsilon`), ``'relp'`` (RelP's
        rules, :py:class:`~zennit_attn.composites.attnlrp.RelPEpsilon`: constant attention weights, the half
        rule on gates, identity rules on activations and normalisations), ``'mlp_rules'``
        (:py:class:`~zennit_attn.composites.attnlrp.MLPRules`: the identity rule on activations and the half
        rule on gates, the plain gradient elsewhere), ``'cplrp'`` or a composite instance.
    per_position: bool
        A score per position, or one per component patched at every position.
    steps: int
        Points of each path (:py:func:`~.paths.path_weights`): 1 the clean run alone (AtP, RelP: one backward pass), 4
        by default (:py:data:`~.paths.DEFAULT_STEPS`); each point one forward and one backward pass.
    span: float
        How far the points go towards the corrupted input, in ``(0, 1]`` (:py:func:`~.paths.path_weights`; 1 by
        default, :py:data:`~.paths.DEFAULT_SPAN`); 0.5 is closer to activation patching of the heads on SmolLM2.
    direction: str
        ``'noising'`` (default: the corrupted activations into the clean run, the gradient at the clean run) or
        ``'denoising'`` (the clean activations into the corrupted run: the gradient at the corrupted run, the path
        from the corrupted to the clean input), :py:data:`DIRECTIONS`.
    path: str
        ``'causal'`` (default, :py:data:`~.paths.DEFAULT_PATH`: one path per changed position, the tokens up to it
        moving; a component takes the gradients of the path of its position) or ``'straight'`` (every changed token
        moving at once), :py:data:`~.paths.PATHS`. The same where one position changes; the causal paths cost one
        forward and backward pass per changed position and point (the clean run shared).

    Returns
    -------
    PatchingScores

    Raises
    ------
    ValueError
        For prompts of different shapes, an unknown method, metric, component or path, a model without a site
        (e.g. ``'mlp'`` in a routed mixture of experts), ``steps`` not a positive integer, ``span`` not in ``(0, 1]``.
    """
    start = time.perf_counter()
    run, source = check_direction(direction)
    name, composite, clean, corrupted, metric = path_run(
        model, clean, corrupted, answers, wrong, metric, method, steps, span, path
    )
    prompts = {'clean': clean, 'corrupted': corrupted}
    components = component_points(model, components)
    points = site_points(components)
    patched, source_logits = _capture(model, points, prompts[source], metric)
    if source == 'clean':  # the metric is resolved on the clean logits
        metric = metric.resolve(source_logits)
    recorder, gradients, value, metric = _path_gradients(
        model, prompts[run], prompts[source], points, metric, composite, steps, span, path, resolve=run == 'clean'
    )
    scores = {}
    for kind, layers in components.items():
        per_layer = []
        for component in layers:
            gradient = gradients.get(component.site_key)
            site = component.point.select(recorder.tensors[component.site_key])
            delta = component.point.select(patched[component.site_key]) - site
            product = delta * (torch.zeros_like(delta) if gradient is None else gradient)
            per_layer.append(component.reduce(product))
        values = torch.stack(per_layer, 1)  # [pairs, layers, seq, units]
        scores[kind] = values if per_position else values.sum(2)
    with torch.no_grad():
        # the composites change the backward pass only: value is the metric of the run
        values = {run: value, source: metric.of(source_logits)}
    return PatchingScores(
        scores,
        values['clean'],
        values['corrupted'],
        name,
        per_position,
        time.perf_counter() - start,
        direction=direction,
        layers=_layer_numbers(components),
    )


@dataclass
class _Plan:
    """The variants of one component in one layer: ``rows`` (the prompt of each), ``units``, ``positions`` (-1:
    every position)."""

    rows: torch.Tensor
    units: torch.Tensor
    positions: torch.Tensor


def _plan(component: Component, clean: torch.Tensor, patched: torch.Tensor, per_position: bool) -> _Plan:
    """The variants whose activations differ between the runs; the others change nothing (Eq. 1 is exactly 0)."""
    site_clean, site_patched = component.point.select(clean), component.point.select(patched)
    differs = component.reduce((site_clean != site_patched).to(torch.float32)) != 0  # [pairs, seq, units]
    if not per_position:
        differs = differs.any(1, keepdim=True)
    rows, positions, units = differs.nonzero(as_tuple=True)
    if not per_position:
        positions = torch.full_like(positions, -1)
    return _Plan(rows, units, positions)


def _patch_hook(component: Component, source: torch.Tensor, plan: _Plan, chunk: slice):
    """The hook that puts the corrupted activation of each variant of ``chunk`` into its row of the batch."""
    rows, units, positions = plan.rows[chunk], plan.units[chunk], plan.positions[chunk]
    size = source.shape[-1]
    mask = torch.zeros((len(rows), *source.shape[1:]), dtype=torch.bool, device=source.device)
    for index, (unit, position) in enumerate(zip(units.tolist(), positions.tolist())):
        features = component.feature_mask(unit, size, source.device)
        if position < 0:
            mask[index, :, features] = True
        else:
            mask[index, position, features] = True
    values = source[rows.to(source.device)]

    def patch(tensor):
        return torch.where(mask, values.to(tensor.dtype), tensor)

    return patch


def _scores_shape(component: Component, pairs: int, seq: int, features: int, per_position: bool) -> tuple:
    units = component.units(features)
    return (pairs, seq, units) if per_position else (pairs, 1, units)


def activation_patching(
    model: torch.nn.Module,
    clean,
    corrupted,
    answers=None,
    wrong=None,
    metric: str | Callable | FullLogits = 'logit_difference',
    components: Sequence[str] = DEFAULT_COMPONENTS,
    per_position: bool = True,
    batch_size: int = 32,
    progress: bool = True,
    layers: Sequence[int] | None = None,
    direction: str = DEFAULT_DIRECTION,
) -> PatchingScores:
    """Activation patching (Eq. 1), the exact reference of :py:func:`relevance_patching` over the same components:
    one patched forward pass of the clean prompt (noising; of the corrupted prompt for denoising) per component, unit
    and position, ``batch_size`` of them at a time
    (variants of several pairs and units in one batch). A variant whose corrupted activation equals the clean one
    is not run: its effect is exactly 0.

    Parameters are those of :py:func:`relevance_patching`, and

    batch_size: int
        Patched prompts per forward pass.
    progress: bool
        A tqdm bar over the components and layers.
    layers: sequence of int, optional
        Patch only the components of these layers (the others score 0), e.g. to check the top components of
        :py:meth:`PatchingScores.top`; default all. One numbering for every component, that of the scores' layer axis
        and of :py:attr:`RankedComponent.layer`: layer ``l`` is block ``l`` (its attention, heads, MLP, neurons; for
        ``'residual'`` the residual stream entering it), negative layers count blocks from the end (-1: the last
        block); the residual stream has one more layer, ``L`` for ``L`` blocks (leaving the last block). A layer that
        one of ``components`` does not have is refused.
    direction: str
        ``'noising'`` (default: the corrupted activations into the clean run, the change from the clean metric) or
        ``'denoising'`` (the clean activations into the corrupted run, the change from the corrupted metric),
        :py:data:`DIRECTIONS`.

    Returns
    -------
    PatchingScores
        ``method='activation'``.
    """
    start = time.perf_counter()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f'batch_size must be a positive integer, got {batch_size!r}')
    run, source = check_direction(direction)
    clean, corrupted = check_pairs(model, clean, corrupted)
    metric = make_metric(metric, answers, wrong, clean.shape[0])
    components = component_points(model, components)
    points = site_points(components)
    captured = {
        name: _capture(model, points, ids, metric) for name, ids in (('clean', clean), ('corrupted', corrupted))
    }
    metric = metric.resolve(captured['clean'][1])
    with torch.no_grad():
        values = {name: metric.of(logits) for name, (_, logits) in captured.items()}
    prompts, base, patched = {'clean': clean, 'corrupted': corrupted}[run], captured[run][0], captured[source][0]
    work = [(kind, component) for kind, points in components.items() for component in points]
    chosen = None if layers is None else _chosen_layers(layers, components, block_count(model))
    scores = {kind: [] for kind in components}
    for kind, component in tqdm(work, desc='activation patching', disable=not progress):
        scores[kind].append(
            _patch_component(
                model,
                prompts,
                component,
                base,
                patched,
                metric,
                values[run],
                per_position,
                batch_size,
                skip=chosen is not None and component.layer not in chosen,
            )
        )
    scores = {kind: torch.stack(values, 1) for kind, values in scores.items()}
    if not per_position:
        scores = {kind: values[:, :, 0] for kind, values in scores.items()}
    return PatchingScores(
        scores,
        values['clean'],
        values['corrupted'],
        'activation',
        per_position,
        time.perf_counter() - start,
        direction=direction,
        layers=_layer_numbers(components),
    )


def _chosen_layers(layers, components: Mapping[str, list[Component]], blocks: int) -> set[int] | None:
    """The layers of ``layers`` in the numbering of :py:func:`activation_patching` (negative: blocks from the end, of
    ``blocks``), None for all.

    Raises
    ------
    ValueError
        For no layers, a layer that is not an integer, or one that a component does not have (a module path has
        none).
    """
    if layers is None:
        return None
    layers = [layers] if isinstance(layers, int) else list(layers)
    if not layers or any(isinstance(layer, bool) or not isinstance(layer, int) for layer in layers):
        raise ValueError(f'layers must be a non-empty list of integers (layer l: block l), got {layers!r}')
    resolved = {layer: layer + blocks if layer < 0 else layer for layer in layers}
    for kind, points in components.items():
        own = [component.layer for component in points]
        outside = [layer for layer, index in resolved.items() if index not in own]
        if outside:
            numbers = 'none (a module path)' if None in own else f'{own[0]} to {own[-1]}'
            meaning = 'block l'
            if kind == 'residual':
                meaning = 'the residual stream entering block l, and leaving the last block'
            raise ValueError(
                f'layers={layers!r}: {kind!r} has no layer {outside[0]} (of {blocks} blocks); its layers are '
                f'{numbers} (layer l: {meaning}; negative layers count blocks from the end): give layers that every '
                'component of components= has'
            )
    return set(resolved.values())


def _patch_component(
    model,
    clean,
    component: Component,
    base: Mapping,
    patched: Mapping,
    metric,
    clean_value,
    per_position,
    batch_size,
    skip: bool = False,
) -> torch.Tensor:
    """``[pairs, seq or 1, units]`` effects (Eq. 1) of patching ``component``'s units, position by position (zeros
    with ``skip``)."""
    source, reference = patched[component.site_key], base[component.site_key]
    plan = _plan(component, reference, source, per_position)
    if skip:
        plan = _Plan(plan.rows[:0], plan.units[:0], plan.positions[:0])
    pairs, seq = clean.shape
    features = component.point.select(reference).shape[-1]
    result = torch.zeros(_scores_shape(component, pairs, seq, features, per_position), dtype=clean_value.dtype)
    for begin in range(0, len(plan.rows), batch_size):
        chunk = slice(begin, begin + batch_size)
        rows = plan.rows[chunk]
        handle = component.point.hook(_patch_hook(component, source, plan, chunk))
        try:
            with torch.no_grad():
                effect = metric.of(metric.logits(model(input_ids=clean[rows])), rows) - clean_value[rows]
        finally:
            handle.remove()
        positions = plan.positions[chunk].clamp(min=0)
        result[rows.cpu(), positions.cpu(), plan.units[chunk].cpu()] = effect.detach().cpu().to(result.dtype)
    return result


def _layer_numbers(components: Mapping[str, list[Component]]) -> dict[str, list[int | None]]:
    """``component -> `` the layer number of each entry of its layer axis."""
    return {kind: [component.layer for component in points] for kind, points in components.items()}


def correlation(
    estimate: PatchingScores | Sequence[PatchingScores],
    reference: PatchingScores | Sequence[PatchingScores],
    component: str,
) -> tuple[float, float, int]:
    """``(pearson, spearman, count)`` of the scores of ``component`` in ``estimate`` (relevance patching) and
    ``reference`` (activation patching) over every pair, layer, position and unit where either is not 0 (a
    component whose corrupted activation equals its clean one scores exactly 0 in both). Prompt pairs of several
    lengths are scored in groups of one length each: ``estimate`` and ``reference`` may be sequences of scores, one
    per group in the same order, pooled into one correlation.

    Raises
    ------
    ValueError
        Where the two were computed at different granularities, shapes or directions, or for sequences of different
        lengths.
    """
    estimates = [estimate] if isinstance(estimate, PatchingScores) else list(estimate)
    references = [reference] if isinstance(reference, PatchingScores) else list(reference)
    if len(estimates) != len(references) or not estimates:
        raise ValueError(
            f'correlation needs one reference per estimate, got {len(estimates)} estimates and {len(references)} '
            'references'
        )
    pooled = [_used_scores(*scores, component) for scores in zip(estimates, references)]
    a, b = torch.cat([a for a, _ in pooled]), torch.cat([b for _, b in pooled])
    if len(a) < 2:
        return float('nan'), float('nan'), int(len(a))
    return pearson(a, b), spearman(a, b), int(len(a))


def _used_scores(
    estimate: PatchingScores, reference: PatchingScores, component: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores of ``component`` of one group where either is not 0, flat, in float64 on the CPU."""
    if estimate.direction != reference.direction:
        raise ValueError(
            f'the scores were computed in different directions ({estimate.direction!r} and {reference.direction!r}): '
            'compare scores of one direction'
        )
    a, b = estimate[component].double().cpu(), reference[component].double().cpu()
    if a.shape != b.shape:
        raise ValueError(
            f'{component}: the scores have shapes {tuple(a.shape)} and {tuple(b.shape)}; compare scores of the same '
            'prompt pairs and per_position'
        )
    used = (a != 0) | (b != 0)
    return a[used], b[used]
