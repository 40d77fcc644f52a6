"""Reference samples of latent neurons: ActMax (the paper's section 3.5 and knowledge-neuron appendix: the texts
that activate a neuron most, each explained with AttnLRP) and RelMax (Concept Relevance Propagation, Achtibat et
al. 2023: the texts in which the neuron is most relevant for the model's own prediction), over a stream of texts
in bounded memory (``k`` entries per neuron)."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO

import torch
from tqdm.auto import tqdm

from ..core.devices import input_device
from ..inputs.checks import check_model
from ..inputs.task import TokenTask
from ..methods.declarations import positive
from ..methods.registry import METHODS
from ..results.render import views
from .recording import Recorder
from .sites import Neuron, SitePoint, find_sites
from .targets import LatentTarget, resolve_point

__all__ = ['Reference', 'References', 'reference_samples', 'BY']

#: Rankings: ``'activation'`` (ActMax) or ``'relevance'`` (RelMax).
BY = ('activation', 'relevance')


@dataclass
class Reference:
    """One reference sample: ``text`` (as given), its token ids (truncated to ``max_length``), the ``position`` of
    the neuron's largest score in it, the ``score`` (activation, or relevance for RelMax), the ``activation`` at that
    position, and, unless ``explain=False``, the AttnLRP :py:attr:`explanation` of that activation."""

    text: str
    input_ids: torch.Tensor
    position: int
    score: float
    activation: float
    explanation: object = None


@dataclass
class References:
    """The reference samples of one neuron, highest score first."""

    neuron: Neuron
    by: str
    entries: list[Reference]
    tokenizer: object = dataclasses.field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> Reference:
        return self.entries[index]

    def heatmaps(self) -> list:
        """One token heatmap per explained reference, captioned with its rank, score and position."""
        heatmaps = []
        for rank, entry in enumerate(self.entries):
            if entry.explanation is None:
                continue
            token = self.tokenizer.decode([int(entry.input_ids[entry.position])]) if self.tokenizer else ''
            for heatmap in entry.explanation.heatmaps(tokenizer=self.tokenizer):
                heatmaps.append(
                    dataclasses.replace(
                        heatmap,
                        title=(
                            f'#{rank + 1}: {self.by} {entry.score:.4g} at token {entry.position} {token!r} (activation '
                            f'{entry.activation:.4g})'
                        ),
                    )
                )
        return heatmaps

    def to_html(self, scale=None, standalone: bool = True) -> str:
        """The explained references as token heatmaps (HTML, a standalone page unless ``standalone=False``)."""
        if not any(entry.explanation is not None for entry in self.entries):
            raise ValueError('these references were collected with explain=False: there are no heatmaps to draw')
        title = f'{"ActMax" if self.by == "activation" else "RelMax"} references of {self.neuron}'
        return views.heatmaps_html(self.heatmaps(), scale, title=title, standalone=standalone)

    def _repr_html_(self) -> str | None:
        if self.tokenizer is None or not any(entry.explanation is not None for entry in self.entries):
            return None
        return self.to_html(standalone=False)

    def show(self, scale=None, color: bool | None = None, stream: IO | None = None) -> None:
        """Print the references: heatmaps where explained, else the texts with their scores."""
        stream = sys.stdout if stream is None else stream
        if any(entry.explanation is not None for entry in self.entries):
            views.show_heatmaps(self.heatmaps(), scale, color, stream)
            return
        for rank, entry in enumerate(self.entries):
            print(f'#{rank + 1} {self.by} {entry.score:.4g} at {entry.position}: {entry.text[:200]!r}', file=stream)


def _batches(texts: Iterable[str], size: int):
    iterator = iter(texts)
    while True:
        batch = list(itertools.islice(iterator, size))
        if not batch:
            return
        yield batch


def _encode(tokenizer, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask (the end-of-sequence token pads where the tokenizer has no pad token)."""
    encoded = [tokenizer(text, truncation=True, max_length=max_length)['input_ids'] for text in texts]
    pad = tokenizer.pad_token_id if getattr(tokenizer, 'pad_token_id', None) is not None else tokenizer.eos_token_id
    width = max(1, max(len(ids) for ids in encoded))
    ids = torch.full((len(texts), width), int(pad or 0), dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.long)
    for row, row_ids in enumerate(encoded):
        ids[row, : len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
        mask[row, : len(row_ids)] = 1
    return ids, mask


def reference_samples(
    model: torch.nn.Module,
    tokenizer,
    texts: Iterable[str],
    neurons: Sequence[Neuron],
    k: int = 10,
    by: str = 'activation',
    batch_size: int = 8,
    max_length: int = 64,
    explain: bool = True,
    progress: bool = True,
) -> dict[Neuron, References]:
    """The ``k`` reference samples of each neuron over a stream of texts.

    ``by='activation'`` (ActMax, the paper): a text's score is the neuron's largest activation over its tokens.
    ``by='relevance'`` (RelMax, CRP): a text's score is the neuron's largest relevance over its tokens (AttnLRP,
    for the model's own prediction at the text's last token). Both rankings take the largest value at one position,
    not the sum over positions: the texts of a stream differ in length, and a sum would favour long texts with many
    weakly responding tokens over a short text with one strong response; with the largest value the score is the
    value at the reported ``position``, the token whose activation is explained. Padding positions are never
    reported. The texts are read ``batch_size`` at a time (tqdm progress bar), so an iterable of any length works;
    only ``k`` entries per neuron are kept. With ``explain`` each reference's activation at its position is explained
    with AttnLRP (``explain(model, ids, target=neuron, position=position)``). The model is checked (eval mode, not
    compiled, weights loaded or offloaded by accelerate) before the first text is read.

    Parameters
    ----------
    model: torch.nn.Module
        A decoder-only or encoder-only language model of a supported family, in eval mode.
    tokenizer
        Its Hugging Face tokenizer.
    texts: iterable of str
        E.g. a generator over a corpus (the paper: Wikipedia summaries).
    neurons: sequence of Neuron
    k: int
    by: str
        ``'activation'`` or ``'relevance'``.
    batch_size, max_length: int
        Texts per forward pass; tokens per text (longer texts are truncated).
    explain: bool
    progress: bool
        Show a tqdm progress bar.

    Returns
    -------
    dict of Neuron to References

    Raises
    ------
    ValueError
        For a model in training mode (dropout would make the ranking random), bad arguments, or a neuron out of
        range.
    """
    for name, value in (('k', k), ('batch_size', batch_size), ('max_length', max_length)):
        positive(value, name)
    if by not in BY:
        raise ValueError(f'by must be "activation" (ActMax) or "relevance" (RelMax), got {by!r}')
    neurons = _neuron_list(neurons)
    if isinstance(texts, str):
        raise TypeError('texts must be an iterable of texts, not one str')
    check_model(model)
    ranking = _Ranking(model, tokenizer, _resolve(model, neurons), by, k, max_length)
    for batch in tqdm(
        _batches(texts, batch_size), desc=f'reference samples ({by})', unit='batch', disable=not progress
    ):
        ranking.add(batch)
    return {neuron: References(neuron, by, ranking.references(neuron, explain), tokenizer) for neuron in neurons}


def _neuron_list(neurons) -> list[Neuron]:
    """``neurons`` (one or a sequence) as a list without repeats; anything else than Neurons is refused."""
    if isinstance(neurons, Neuron):
        neurons = [neurons]
    neurons = list(dict.fromkeys(neurons))
    if not neurons or not all(isinstance(neuron, Neuron) for neuron in neurons):
        raise TypeError('neurons must be a non-empty sequence of zennit_attn.latent.Neuron')
    return neurons


def _resolve(model: torch.nn.Module, neurons: list[Neuron]) -> dict[Neuron, SitePoint]:
    """The site point of each neuron in ``model``; residual neurons are refused (recorded summed over the hidden
    dimensions, not per unit)."""
    points = {}
    for neuron in neurons:
        if neuron.site not in points:
            points.update(find_sites(model, (neuron.site,)))
    if any(neuron.site == 'residual' for neuron in neurons):
        raise ValueError(
            'reference samples are ranked per unit; the residual site is recorded summed over hidden '
            'dimensions: choose "mlp", "attention", "query", "key" or "value" neurons'
        )
    return {neuron: resolve_point(model, neuron, points) for neuron in neurons}


class _Ranking:
    """The ``k`` best texts of every neuron so far (one heap each; equal scores: the earlier text first), fed batch
    by batch (:py:meth:`add`), and their references (:py:meth:`references`)."""

    def __init__(self, model, tokenizer, resolved: dict[Neuron, SitePoint], by: str, k: int, max_length: int):
        self.model, self.tokenizer, self.resolved = model, tokenizer, resolved
        self.by, self.k, self.max_length = by, k, max_length
        self.used = {}
        for point in dict.fromkeys(resolved.values()):  # each point hooked once, however many of its units are asked
            self.used.setdefault(point.site, []).append(point)
        self.heaps: dict[Neuron, list] = {neuron: [] for neuron in resolved}
        self.counter = itertools.count()
        self.device = input_device(model)

    def add(self, batch: list) -> None:
        """Score the texts of ``batch`` (those that give tokens) and keep the best of each neuron."""
        bad = [text for text in batch if not isinstance(text, str)]
        if bad:
            raise TypeError(f'texts must be str, got {type(bad[0]).__name__}')
        kept = [
            text for text in batch if self.tokenizer(text, truncation=True, max_length=self.max_length)['input_ids']
        ]
        if not kept:
            return
        ids, mask = _encode(self.tokenizer, kept, self.max_length)
        ids, mask = ids.to(self.device), mask.to(self.device)
        recorder = Recorder(self.used, None, mask, tokens=ids.shape[1])
        values = self._record(recorder, ids, mask)
        for neuron, point in self.resolved.items():
            self._keep_best(neuron, point, values, recorder.activations, kept, ids, mask != 0)

    def _record(self, recorder: Recorder, ids: torch.Tensor, mask: torch.Tensor) -> dict:
        """The score of every recorded site point: its activation (ActMax), or its relevance (RelMax: AttnLRP of the
        model's own prediction at the last token; 0 where no gradient arrived)."""
        if self.by == 'activation':
            with torch.no_grad(), recorder.recording(self.model):
                self.model(input_ids=ids, attention_mask=mask, use_cache=False)
            return recorder.activations
        task = TokenTask(self.model, ids, mask)
        with recorder.recording(self.model):
            METHODS['attnlrp'](task, position=-1, target=None)
        return {
            key: recorder.relevances.get(key, torch.zeros_like(value)) for key, value in recorder.activations.items()
        }

    def _keep_best(self, neuron, point, values: dict, activations: dict, kept: list[str], ids, valid) -> None:
        """Push each text of the batch with the neuron's largest score over its tokens (padding excluded) into the
        neuron's heap of ``k``."""
        key = (point.site, point.layer)
        if neuron.index >= values[key].shape[-1]:
            raise ValueError(
                f'{neuron}: index out of range, {point.site} of layer {point.layer} has {values[key].shape[-1]} units'
            )
        unit = slice(neuron.index, neuron.index + 1)  # recorded per unit (heads summed over the head dimension)
        score = values[key][..., unit].sum(-1).masked_fill(~valid, float('-inf'))  # [batch, seq]
        activation = activations[key][..., unit].sum(-1)
        best, position = score.max(1)
        heap = self.heaps[neuron]
        for row, text in enumerate(kept):
            item = (
                float(best[row]),
                -next(self.counter),
                text,
                ids[row, : int(valid[row].sum())].cpu(),
                int(position[row]),
                float(activation[row, position[row]]),
            )
            if len(heap) < self.k:
                heapq.heappush(heap, item)
            elif item[:2] > heap[0][:2]:
                heapq.heapreplace(heap, item)

    def references(self, neuron: Neuron, explain: bool) -> list[Reference]:
        """The kept texts of ``neuron``, best first; with ``explain`` each one's activation at its position explained
        with AttnLRP."""
        entries = []
        for score, _, text, row_ids, position, activation in sorted(
            self.heaps[neuron], key=lambda item: item[:2], reverse=True
        ):
            explanation = self._explain(neuron, row_ids, position) if explain else None
            entries.append(Reference(text, row_ids, position, score, activation, explanation))
        return entries

    def _explain(self, neuron: Neuron, row_ids: torch.Tensor, position: int):
        """AttnLRP of the neuron's activation at ``position`` of one text (``explain(model, ids, target=neuron,
        position=position)``)."""
        task = TokenTask(self.model, row_ids[None].to(self.device)).with_readout(
            LatentTarget(self.resolved[neuron], index=neuron.index)
        )
        with task.capturing():
            explanation = METHODS['attnlrp'](task, position=position, target=0)
        return dataclasses.replace(
            explanation, tokenizer=self.tokenizer, target=torch.full_like(explanation.target, neuron.index)
        )
