"""The result of :py:func:`~zennit_attn.workflows.similarity.explain_similarity`: the relevance of every token pair of
two inputs for their similarity."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .render.pairs import page_of, pair_figure, pair_html

__all__ = ['SimilarityExplanation']


@dataclass
class SimilarityExplanation:
    """Token-pair relevance of a similarity (BiLRP).

    Attributes
    ----------
    relevance: torch.Tensor
        ``[len(labels_a), len(labels_b)]``: ``relevance[i, j]`` of token (or patch) ``i`` of the first input and
        ``j`` of the second; it sums to :py:attr:`score` minus what biases and the softmax rule absorb (exactly for
        CP-LRP without biases).
    score: float
        The explained similarity (cosine or dot product of the two embeddings).
    labels_a, labels_b: list of str
        The tokens (or patches) of the two inputs.
    similarity: str
        ``'cosine'`` or ``'dot'``.
    """

    relevance: torch.Tensor
    score: float
    labels_a: list[str]
    labels_b: list[str]
    similarity: str = 'cosine'
    title: str = field(default='', repr=False)

    @property
    def first_a(self) -> torch.Tensor:
        """The first-order relevance of the first input's tokens for the score: the rows' sums (each token's share of
        the similarity, all its pairs together)."""
        return self.relevance.sum(1)

    @property
    def first_b(self) -> torch.Tensor:
        """The first-order relevance of the second input's tokens (the columns' sums)."""
        return self.relevance.sum(0)

    def top_pairs(self, count: int = 10) -> list[tuple[str, str, float]]:
        """The ``count`` token pairs of the largest relevance: ``(token of a, token of b, relevance)``."""
        values, indices = self.relevance.flatten().topk(min(count, self.relevance.numel()))
        width = self.relevance.shape[1]
        return [
            (self.labels_a[index // width], self.labels_b[index % width], float(value))
            for value, index in zip(values.tolist(), indices.tolist())
        ]

    def _title(self) -> str:
        return self.title or f'{self.similarity} similarity {self.score:.4f}: relevance of token pairs'

    def html(self) -> str:
        """An HTML fragment that links the two inputs' tokens (see
        :py:func:`~zennit_attn.results.render.pairs.pair_html`)."""
        return pair_html(self.relevance, self.labels_a, self.labels_b, self._title())

    def _repr_html_(self) -> str:
        return self.html()

    def figure(self, path: str | Path | None = None):
        """The matrix as a matplotlib figure, saved to ``path`` if given (PNG, SVG, PDF; ``.html``: :py:meth:`html`
        as a page)."""
        if path is not None and str(path).endswith('.html'):
            Path(path).write_text(page_of(self.html()))
            return None
        return pair_figure(self.relevance, self.labels_a, self.labels_b, self._title(), path)
