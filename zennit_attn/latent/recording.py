"""Recording latent relevance during the one backward pass of an explanation, and ranking neurons by it.

Under the gradient x input formulation the engine uses (paper section 3.5: "we obtain relevance values for each
latent neuron as a by-product"), the relevance of any tensor ``x`` on the relevance path is ``x * g``, ``g`` the
modified gradient reaching it. Recording a site is a forward hook that keeps the tensor and a
tensor hook that reads its gradient; neither changes the forward or the backward pass, so the token relevance is
bit-identical with and without recording. The relevance of the neurons of a bias-free FFN down projection sums
to the relevance of the MLP output (the epsilon rule of Eq. 8 with zero bias conserves), the heads' to the
attention output's, and the residual entries are the block-boundary sums of
:py:func:`~zennit_attn.conservation`.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..canonizers.checkpointing import recomputing
from ..methods.declarations import positive
from .sites import SitePoint

__all__ = ['Latent', 'Recorder', 'RankedNeuron', 'top_neurons', 'REDUCTIONS']

#: Values of ``latent_reduce``: None keeps every position, ``'sum'`` only the sum over positions.
REDUCTIONS = (None, 'sum')


@dataclass
class Latent(Mapping):
    """Latent relevance of an explanation, ``explanation.latent``: a mapping ``site -> relevance``.

    Attributes
    ----------
    relevance: dict of str to torch.Tensor
        ``'mlp'``: ``[batch, layers, seq, ffn]``; ``'attention'``: ``[batch, layers, seq, heads]``;
        ``'residual'``: ``[batch, layers + 1, seq]`` (summed over hidden; 0 = input of the first block, ``l + 1`` =
        output of block ``l``); ``'query'``/``'key'``/``'value'``: ``[batch, layers, seq, features]``. With
        ``reduce='sum'`` the ``seq`` dimension is summed away. 0 at padding positions.
    activation: dict of str to torch.Tensor
        The site tensors themselves, reduced the same way (heads: summed over the head dimension; residual: over
        hidden).
    reduce: str or None
        ``'sum'`` if only the sum over positions was kept.
    """

    relevance: dict[str, torch.Tensor]
    activation: dict[str, torch.Tensor] = field(default_factory=dict)
    reduce: str | None = None

    def __getitem__(self, site: str) -> torch.Tensor:
        if site not in self.relevance:
            raise KeyError(
                f'site {site!r} was not recorded; recorded: {", ".join(self.relevance) or "none"} (pass '
                f'latent=({site!r}, ...) to explain())'
            )
        return self.relevance[site]

    def __iter__(self) -> Iterator[str]:
        return iter(self.relevance)

    def __len__(self) -> int:
        return len(self.relevance)

    def __repr__(self) -> str:
        shapes = ', '.join(f'{site}: {list(value.shape)}' for site, value in self.relevance.items())
        return f'Latent({shapes}{", reduce=" + repr(self.reduce) if self.reduce else ""})'


class Recorder:
    """Record the activation and relevance (``x * g``) of site points during one forward and backward pass.

    Parameters
    ----------
    points: dict of str to list of SitePoint
        From :py:func:`~zennit_attn.latent.sites.find_sites`.
    reduce: None or 'sum'
        Keep only the sum over positions.
    mask: torch.Tensor, optional
        ``[batch, seq]`` attention mask: padding positions are set to 0.
    keep: set of (str, int), optional
        ``(site, layer)`` whose raw gradient ``[batch, seq, features]`` is kept as well (:py:attr:`gradients`, for
        conditional relevance).
    tokens: int, optional
        The number of tokens of the input: a site tensor that holds another number of positions (the model pads its
        input, or adds positions of its own: CPM-Ant's prompt in front, ProphetNet's n-gram streams after) is refused
        where its positions are kept (not for ``reduce='sum'``), as they would not be the tokens'.
    """

    def __init__(
        self,
        points: Mapping[str, list[SitePoint]],
        reduce: str | None = None,
        mask: torch.Tensor | None = None,
        keep=(),
        tokens: int | None = None,
    ):
        self.points = dict(points)
        self.reduce = reduce
        self.mask = mask
        self.keep = set(keep)
        self.tokens = tokens
        self.activations: dict[tuple[str, int], torch.Tensor] = {}
        self.relevances: dict[tuple[str, int], torch.Tensor] = {}
        self.gradients: dict[tuple[str, int], torch.Tensor] = {}
        self.tensors: dict[tuple[str, int], torch.Tensor] = {}

    def _finish(self, values: torch.Tensor) -> torch.Tensor:
        """Zero padding, sum over positions if asked; values ``[batch, seq, ...]``."""
        if torch.finfo(values.dtype).bits < 32:
            values = values.float()
        if self.mask is not None and values.dim() >= 2 and values.shape[:2] == self.mask.shape:
            mask = (self.mask != 0).to(values.device, values.dtype)
            values = values * mask.view(*mask.shape, *([1] * (values.dim() - 2)))
        return values.sum(1) if self.reduce == 'sum' else values

    @contextlib.contextmanager
    def recording(self, model: torch.nn.Module):
        """Hooks on the instance for the time of the context (removed also after an exception). A second forward
        pass in the context is refused: latent relevance is defined for one forward and one backward pass (the
        recomputation of checkpointed blocks, :py:func:`zennit_attn.canonizers.checkpointing.recomputing`, is not
        recorded: the relevance arrives at the first pass's tensors)."""
        handles = []
        try:
            for points in self.points.values():
                for point in points:
                    handles.append(point.hook(self._capture(point)))
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def _capture(self, point: SitePoint):
        """The hook of ``point``: records the activation at the site tensor and hooks its gradient; not in the
        recomputation of a checkpointed block, and a second forward pass is refused."""
        key = (point.site, point.layer)

        def function(tensor):
            if not isinstance(tensor, torch.Tensor) or recomputing():  # checkpointing runs blocks twice
                return None
            if key in self.activations:
                raise RuntimeError(
                    f'latent recording saw a second forward pass through {point.site} layer '
                    f'{point.layer}: record with a method of one forward and one backward pass'
                )
            detached = tensor.detach()
            self._check_positions(point, point.select(detached))
            self.activations[key] = self._finish(point.reduce(point.select(detached)))
            if key in self.keep:
                # a copy: the model may change the tensor in place after the hook (Falcon adds the attention output
                # to its MLP's output in place), and the kept tensor must be the site's value
                self.tensors[key] = detached.clone()
            if tensor.requires_grad:
                tensor.register_hook(self._reader(point, detached, detached._version))
            return None

        return function

    def _check_positions(self, point: SitePoint, selected: torch.Tensor) -> None:
        """Refuse a site tensor ``[batch, seq, ...]`` whose positions are kept but are not the input's
        :py:attr:`tokens` (see the class description)."""
        if self.tokens is None or selected.dim() < 2 or selected.shape[1] == self.tokens:
            return
        if self.reduce == 'sum' and (point.site, point.layer) not in self.keep:
            return
        raise ValueError(
            f'{point.site} layer {point.layer} holds {selected.shape[1]} positions where the input has {self.tokens} '
            'tokens (the model pads its input or adds positions of its own, such as a prompt in front or further '
            'streams), so its positions are not the tokens: latent relevance per position, neuron targets and '
            'conditions at this site are not available for this model; latent_reduce="sum" gives the sum over its '
            'positions'
        )

    def _reader(self, point: SitePoint, detached: torch.Tensor, version: int):
        """The gradient hook of a recorded site tensor ``x`` (``detached``, whose version counter was ``version`` when
        it was recorded): its relevance ``x * g`` and, for the sites of a condition (:py:attr:`keep`), the gradient
        ``g`` itself.

        The gradient is that of ``x`` as the site gave it out (autograd's tensor hooks see the value before any later
        in-place change); ``x`` itself is the kept copy where the model changed the tensor in place after the site,
        and refused where there is none."""
        key = (point.site, point.layer)

        def read(grad):
            value = detached
            if detached._version != version:
                value = self.tensors.get(key)
                if value is None:
                    raise RuntimeError(
                        f'{point.site} layer {point.layer}: {type(point.module).__name__} gave out a tensor that the '
                        "model's forward pass changed in place after it, so its relevance (x * g) cannot be read at "
                        'the backward pass: latent relevance of this site is not available for this model'
                    )
            self.relevances[key] = self._finish(point.reduce(point.select(value * grad)))
            if key in self.keep:
                self.gradients[key] = point.select(grad)

        return read

    def latent(self) -> Latent:
        """The recorded values as :py:class:`Latent` (relevance 0 where no gradient arrived, e.g. query and key
        under CP-LRP)."""
        relevance, activation = {}, {}
        for site, points in self.points.items():
            keys = [(point.site, point.layer) for point in points]
            missing = [point for point in points if (point.site, point.layer) not in self.activations]
            if missing:
                raise RuntimeError(f'the forward pass did not reach {unreached(missing[0])}')
            activation[site] = torch.stack([self.activations[key] for key in keys], 1)
            relevance[site] = torch.stack(
                [
                    self.relevances[key] if key in self.relevances else torch.zeros_like(self.activations[key])
                    for key in keys
                ],
                1,
            )
        return Latent(relevance=relevance, activation=activation, reduce=self.reduce)


def unreached(point: SitePoint) -> str:
    """What a forward pass that did not run ``point``'s hook did not reach, and why it may not have (for messages)."""
    return (
        f'{point.site} layer {point.layer} ({type(point.module).__name__} did not run through its module call: a '
        "block skipped for this input, as Mllama's cross-attention blocks without an image, or a module whose "
        'forward the model calls directly, which runs no hook); read the layers the input runs'
    )


class RankedNeuron(NamedTuple):
    """One entry of :py:func:`top_neurons`."""

    layer: int
    index: int
    relevance: float
    activation: float


def top_neurons(
    explanation, k: int = 10, site: str = 'mlp', row: int = 0, absolute: bool = False, layers=None
) -> list[RankedNeuron]:
    """The ``k`` units of ``site`` with the largest relevance (summed over positions) in ``row`` of an explanation
    made with ``explain(..., latent=(site, ...))`` (paper section 3.5: "Ranking this latent relevance enables us to
    identify neurons and layers that are most influential").

    Parameters
    ----------
    explanation: Explanation
        With :py:attr:`latent` recorded.
    k: int
    site: str
        A recorded site other than ``'residual'`` (whose hidden dimensions are recorded summed).
    row: int
        A row of the explanation (negative counts from the end). An explanation with ``condition=`` (``C``
        conditions) has ``C`` rows per input row, row ``r * C + c`` for input row ``r`` and condition ``c``; its
        latent relevance is recorded once per input row (the prediction's own backward pass), so the ``C`` rows of
        input row ``r`` all rank that row's neurons.
    absolute: bool
        Rank by absolute relevance (negative evidence too) instead of signed relevance.
    layers: sequence of int, optional
        Only these layers (negative counts from the end; repeats are ignored).

    Returns
    -------
    list of RankedNeuron
        ``(layer, index, relevance, activation)``, most relevant first; activation summed over positions.

    Raises
    ------
    ValueError
        Without latent relevance of ``site``, for a row or layer out of range, or ``k`` not a positive integer.
    """
    latent = getattr(explanation, 'latent', None)
    if latent is None:
        raise ValueError('the explanation has no latent relevance: explain(..., latent=("mlp", ...)) records it')
    if site == 'residual':
        raise ValueError(
            'the residual site is recorded summed over hidden dimensions: it has no neurons to rank; '
            'read explanation.latent["residual"] for the relevance per layer'
        )
    relevance = latent[site]
    positive(k, 'k')
    inputs = relevance.shape[0]
    explained = getattr(explanation, 'relevance', None)
    rows = explained.shape[0] if isinstance(explained, torch.Tensor) and explained.dim() else inputs
    if rows % inputs:
        raise ValueError(f'the explanation has {rows} rows but latent relevance of {inputs} input rows')
    if isinstance(row, bool) or not isinstance(row, numbers.Integral) or not -rows <= row < rows:
        raise ValueError(f'row {row!r} is out of range for {rows} explained rows (0 to {rows - 1})')
    source = (int(row) % rows) // (rows // inputs)  # the input row of a conditional explanation's row
    activation = latent.activation[site][source]
    relevance = relevance[source]
    if latent.reduce is None:
        relevance, activation = relevance.sum(1), activation.sum(1)  # [layers, units]
    count = relevance.shape[0]
    selected = list(range(count))
    if layers is not None:
        if isinstance(layers, numbers.Integral) and not isinstance(layers, bool):
            layers = [layers]
        layers = list(layers)
        bad = [
            layer
            for layer in layers
            if isinstance(layer, bool) or not isinstance(layer, numbers.Integral) or not -count <= layer < count
        ]
        if bad or not layers:
            raise ValueError(
                f'layers must be a non-empty list of layers of the {site} site, 0 to {count - 1} '
                f'(or -{count} to -1 from the end); got {bad or layers}'
            )
        selected = list(dict.fromkeys(int(layer) % count for layer in layers))
    selected = torch.tensor(selected, dtype=torch.long)
    scores = relevance[selected]
    activation = activation[selected]
    keys = scores.abs() if absolute else scores
    order = keys.flatten().topk(min(int(k), keys.numel())).indices
    units = scores.shape[1]
    return [
        RankedNeuron(
            int(selected[int(flat) // units]),
            int(flat) % units,
            float(scores.flatten()[flat]),
            float(activation.flatten()[flat]),
        )
        for flat in order
    ]
