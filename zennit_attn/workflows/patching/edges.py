"""Edge patching: the effect of one component's output on a later component's input through the residual stream,
for every pair of a sender and a receiver (edge attribution patching, Syed et al. 2023; RelP's edges).

*Senders* write into the residual stream: the embeddings (the residual stream before the first block), each head
(its part of the attention output projection, ``W_O (z'_h - z_h)``) and each MLP output (the down projection of the
change of its input). *Receivers* read it: each head's query, key and value (under grouped-query attention one key
and one value per key-value head), and the logits (the residual stream after the last block). For a sender ``u``
and a receiver ``v``

.. math:: \\widehat{\\Delta m}_{u \\to v} = \\Delta_u \\cdot J_v^\\top g_v,                                \\qquad (4)

``Delta_u`` the change the corrupted prompt makes to what ``u`` writes, ``g_v`` the (modified) gradient of the metric
at the receiver's projection output restricted to its features, and ``J_v^T g_v`` its vector-Jacobian product back to
the residual stream at the input of the receiver's block (through the block's normalisation and the projection, with
the composite's rules): the gradient the receiver alone passes to the residual stream, as if it read its own copy of
it. Summed over positions and features; edges go forward, from the embeddings or a block to a later block or the
logits. Sums over receivers give node scores of the direct paths only: a sender's effect through later components
is the sum over paths, which edges split.

Not covered: MLPs as receivers (their input is read in the middle of a block, after its attention, where no site
is), heads as receivers of senders of the same block, and attention patterns other than through queries and keys
(position encodings); the edge reference of activation patching (path patching, one forward pass per edge) is not
implemented.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from zennit.core import Composite

from ...latent.sites import SitePoint, find_sites
from .metrics import FullLogits, Metric
from .paths import DEFAULT_PATH, DEFAULT_SPAN, DEFAULT_STEPS, metric_forward, path_points
from .scores import DEFAULT_METHOD, path_run

__all__ = ['RECEIVERS', 'Node', 'RankedEdge', 'EdgeScores', 'edge_patching']

#: the receivers of a block: the heads' queries, keys and values
RECEIVERS: tuple[str, ...] = ('query', 'key', 'value')
#: the sites edge patching reads
READ_SITES: tuple[str, ...] = ('residual', 'attention', 'mlp', *RECEIVERS)


class Node(NamedTuple):
    """A sender (``kind`` ``'embedding'``, ``'head'``, ``'mlp'``) or a receiver (``'query'``, ``'key'``, ``'value'``,
    ``'logits'``) in block ``layer`` (the embeddings: 0, the logits: the number of blocks), ``unit`` its head."""

    kind: str
    layer: int
    unit: int = 0

    def __str__(self) -> str:
        if self.kind in ('embedding', 'logits'):
            return self.kind
        if self.kind == 'mlp':
            return f'mlp {self.layer}'
        return f'{self.kind} {self.layer}.{self.unit}'


class RankedEdge(NamedTuple):
    """One entry of :py:meth:`EdgeScores.top`: the mean score over pairs of the edge ``sender -> receiver``."""

    sender: Node
    receiver: Node
    score: float

    def __str__(self) -> str:
        return f'{self.sender} -> {self.receiver}: {self.score:+.4f}'


@dataclass
class EdgeScores:
    """What :py:func:`edge_patching` returns.

    Attributes
    ----------
    scores: torch.Tensor
        ``[pairs, senders, receivers]``: Eq. 4, 0 where the edge does not exist (:py:attr:`valid`).
    senders, receivers: list of Node
    valid: torch.Tensor
        ``[senders, receivers]`` boolean: the sender writes before the receiver reads.
    clean, corrupted: torch.Tensor
        ``[pairs]`` metric of the clean and the corrupted prompts.
    method: str
    steps: int
    seconds: float
    span: float
        How far the path's points went towards the corrupted input (:py:func:`~.paths.path_weights`).
    path_kind: str
        The paths of the points, :py:data:`~.paths.PATHS`.
    """

    scores: torch.Tensor
    senders: list[Node]
    receivers: list[Node]
    valid: torch.Tensor
    clean: torch.Tensor
    corrupted: torch.Tensor
    method: str
    steps: int
    seconds: float = 0.0
    span: float = DEFAULT_SPAN
    path_kind: str = DEFAULT_PATH

    @property
    def path(self) -> str:
        """The path's points in words: ``'4 steps'``, ``'4 steps, span 0.5'``, ``'4 steps, straight path'`` (the
        default path unnamed)."""
        words = f'{self.steps} step{"s" * (self.steps != 1)}' + (f', span {self.span:g}' if self.span != 1 else '')
        return words + (f', {self.path_kind} path' if self.path_kind != DEFAULT_PATH else '')

    def mean(self) -> torch.Tensor:
        """``[senders, receivers]``: the mean score over pairs."""
        return self.scores.mean(0)

    def top(self, k: int = 20) -> list[RankedEdge]:
        """The ``k`` edges with the largest absolute mean score, largest first."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f'k must be a positive integer, got {k!r}')
        mean = self.mean().masked_fill(~self.valid, 0)
        order = mean.abs().flatten().argsort(descending=True)[: min(k, int(self.valid.sum()))]
        columns = mean.shape[1]
        return [
            RankedEdge(self.senders[index // columns], self.receivers[index % columns], float(mean.flatten()[index]))
            for index in order.tolist()
        ]


@dataclass
class _Layout:
    """The sites of a model and the head geometry: ``heads`` query heads of ``head_dim`` features."""

    points: dict[str, list[SitePoint]]
    heads: int
    head_dim: int

    @property
    def layers(self) -> int:
        return len(self.points['attention'])

    def units(self, features: int) -> int:
        """Heads of a receiver site tensor of ``features`` (selected) features."""
        return features // self.head_dim

    def senders(self) -> list[Node]:
        heads = [Node('head', layer, head) for layer in range(self.layers) for head in range(self.heads)]
        return [Node('embedding', 0), *heads, *(Node('mlp', layer) for layer in range(self.layers))]


def _layout(model: torch.nn.Module) -> _Layout:
    points = find_sites(model, READ_SITES)
    first = points['attention'][0]
    width = first.width()
    if width is None:
        raise ValueError(
            f'edge patching needs the width of the attention output projection of {type(model).__name__} '
            f'({type(first.module).__name__} tells none)'
        )
    return _Layout(points, first.heads, width // first.heads)


class _Kept(dict):
    """``(site, layer) -> tensor``: the site tensors :py:func:`_kept` keeps, and the version of each tensor kept with
    its graph when it was read."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.versions: dict = {}
        self.modules: dict = {}

    def check(self) -> None:
        """Refuse a tensor kept with its graph that the forward pass changed in place after the site gave it out:
        its gradients and vector-Jacobian products would be those of the changed tensor (the site's value plus what
        was added to it), not the site's.

        Raises
        ------
        ValueError
            Naming the site, its layer and module.
        """
        for key, version in self.versions.items():
            if self[key]._version != version:
                site, layer = key
                raise ValueError(
                    f'edge patching: {site} layer {layer} of {type(self.model).__name__} '
                    f'({type(self.modules[key]).__name__}) gave out a tensor that its forward pass changed in place '
                    'after it, so the gradients at the site would be those of the changed tensor: edge patching is '
                    'not available for this model; use activation_patching or relevance_patching'
                )


@contextlib.contextmanager
def _kept(model: torch.nn.Module, layout: _Layout, keep_graph: bool):
    """Hooks on ``model`` for the time of the context that keep every site tensor (with its graph and its version
    if ``keep_graph``, whose :py:meth:`_Kept.check` refuses one changed in place after the site; else a copy, the
    site's value even where the model changes the tensor in place after it, as Falcon adds the attention output to
    its MLP's output); yields the :py:class:`_Kept` dictionary ``(site, layer) -> tensor`` they fill."""
    tensors = _Kept(model)

    def keeper(point: SitePoint):
        key = (point.site, point.layer)

        def keep(tensor):
            if keep_graph:
                tensors[key], tensors.versions[key], tensors.modules[key] = tensor, tensor._version, point.module
            else:
                tensors[key] = tensor.detach().clone()

        return keep

    handles = [point.hook(keeper(point)) for points in layout.points.values() for point in points]
    try:
        yield tensors
    finally:
        for handle in handles:
            handle.remove()


def _head_features(point: SitePoint, size: int, unit: int, head_dim: int, device) -> torch.Tensor:
    """Indices into the hooked tensor of ``point`` (``size`` features) of head ``unit``."""
    mask = point.feature_mask(size, device)
    positions = torch.arange(size, device=device) if mask is None else mask.nonzero()[:, 0]
    return positions[unit * head_dim : (unit + 1) * head_dim]


def _receiver_products(tensors: dict, gradients: dict, layout: _Layout) -> tuple[list[Node], list[torch.Tensor]]:
    """Eq. 4's ``J_v^T g_v`` of every receiver: one vector-Jacobian product per head and site back to the input of its
    block, on the graph of the forward pass."""
    receivers, products = [], []
    for layer in range(layout.layers):
        block_input = tensors[('residual', layer)]
        for site in RECEIVERS:
            point = layout.points[site][layer]
            output, gradient = tensors[(site, layer)], gradients.get((site, layer))
            size = output.shape[-1]
            selected = size if point.features is None else int(point.features.sum())
            for unit in range(layout.units(selected)):
                receivers.append(Node(site, layer, unit))
                if gradient is None:  # no gradient reaches the receiver (queries and keys under CP-LRP)
                    products.append(torch.zeros_like(block_input))
                    continue
                masked = torch.zeros_like(gradient)
                features = _head_features(point, size, unit, layout.head_dim, gradient.device)
                masked[..., features] = gradient[..., features]
                (product,) = torch.autograd.grad(output, block_input, masked, retain_graph=True, allow_unused=True)
                products.append(torch.zeros_like(block_input) if product is None else product)
    receivers.append(Node('logits', layout.layers))
    final = gradients.get(('residual', layout.layers))
    products.append(torch.zeros_like(tensors[('residual', layout.layers)]) if final is None else final)
    return receivers, products


def _products_at(model, leaf, layout, metric: Metric, composite, resolve: bool) -> tuple:
    """One forward and backward pass at the input embeddings ``leaf``: the receivers, their products (Eq. 4), the
    metric's value and the (resolved) metric."""
    leaf = leaf.detach().requires_grad_(True)
    keys = [(site, layer) for site in RECEIVERS for layer in range(layout.layers)] + [('residual', layout.layers)]
    with (
        _kept(model, layout, keep_graph=True) as tensors,
        metric_forward(model, leaf, metric, composite, resolve) as (value, start, metric),
    ):
        tensors.check()
        found = torch.autograd.grad(value, [tensors[key] for key in keys], start, retain_graph=True, allow_unused=True)
        gradients = {key: gradient for key, gradient in zip(keys, found) if gradient is not None}
        receivers, products = _receiver_products(tensors, gradients, layout)
    return receivers, [product.detach() for product in products], value.detach(), metric


def _sender_writes(model, layout: _Layout, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric) -> tuple:
    """``[senders, pairs, seq, hidden]``: what each sender's corrupted value changes in the residual stream; and the
    corrupted prompts' logits the metric reads."""
    with torch.no_grad():
        with _kept(model, layout, keep_graph=False) as base:
            model(input_ids=clean)
        with _kept(model, layout, keep_graph=False) as patched:
            corrupted_logits = metric.logits(model(input_ids=corrupted))
        writes = [patched[('residual', 0)] - base[('residual', 0)]]
        mlps = []
        for layer in range(layout.layers):
            point = layout.points['attention'][layer]
            delta = patched[('attention', layer)] - base[('attention', layer)]
            per_head = delta.unflatten(-1, (layout.heads, -1))
            masks = torch.eye(layout.heads, dtype=delta.dtype, device=delta.device)[:, None, None, :, None]
            split = (per_head[None] * masks).flatten(-2)  # [heads, pairs, seq, features]
            writes.extend(point.module(split) - point.module(torch.zeros_like(split)))
            down = layout.points['mlp'][layer].module
            change = patched[('mlp', layer)] - base[('mlp', layer)]
            mlps.append(down(change) - down(torch.zeros_like(change)))
    return torch.stack([*writes, *mlps]), corrupted_logits


def _valid(senders: list[Node], receivers: list[Node]) -> torch.Tensor:
    """``[senders, receivers]``: the sender's block comes before the receiver's (the embeddings before all)."""
    written = torch.tensor([-1 if node.kind == 'embedding' else node.layer for node in senders])
    read = torch.tensor([node.layer for node in receivers])
    return written[:, None] < read[None, :]


def edge_patching(
    model: torch.nn.Module,
    clean,
    corrupted,
    answers=None,
    wrong=None,
    metric: str | Callable | FullLogits = 'logit_difference',
    method: str | Composite = DEFAULT_METHOD,
    steps: int = DEFAULT_STEPS,
    span: float = DEFAULT_SPAN,
    path: str = DEFAULT_PATH,
) -> EdgeScores:
    """Edge patching (Eq. 4) of every sender and receiver for prompt pairs: the receivers' products averaged over the
    ``steps`` points of the paths from the clean to the corrupted input embeddings (as
    :py:func:`~.scores.relevance_patching`; at each position, of its path: :py:mod:`~.paths`), each one forward and
    one backward pass plus one vector-Jacobian product per receiver through its block's normalisation and
    projection; two forward passes give the senders' changes.

    Parameters
    ----------
    model, clean, corrupted, answers, wrong, metric, method, steps, span, path
        As for :py:func:`~.scores.relevance_patching`.

    Returns
    -------
    EdgeScores

    Raises
    ------
    ValueError
        As :py:func:`~.scores.relevance_patching`, and for a model without query, key or value sites (projections
        that are not one linear layer each) or without an MLP site.
    """
    start = time.perf_counter()
    name, composite, clean, corrupted, metric = path_run(
        model, clean, corrupted, answers, wrong, metric, method, steps, span, path
    )
    layout = _layout(model)
    writes, corrupted_logits = _sender_writes(model, layout, clean, corrupted, metric)
    products, value = None, None
    for leaf, weight, positions in path_points(model, clean, corrupted, steps, span, path):
        receivers, found, at, resolved = _products_at(model, leaf, layout, metric, composite, resolve=value is None)
        if value is None:
            value, metric = at, resolved
        # [receivers, pairs, seq, hidden]: the products at the positions of this point's path
        stacked = torch.stack(found) * (weight * positions.to(found[0].dtype)[:, None])
        products = stacked if products is None else products + stacked
    scores = torch.einsum('spnd,rpnd->psr', writes.to(products.dtype), products)
    senders = layout.senders()
    valid = _valid(senders, receivers)
    with torch.no_grad():
        corrupted_value = metric.of(corrupted_logits)
    scores = scores * valid.to(scores.dtype)
    return EdgeScores(
        scores, senders, receivers, valid, value, corrupted_value, name, steps, time.perf_counter() - start, span, path
    )
