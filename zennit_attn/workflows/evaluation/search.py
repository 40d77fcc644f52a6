"""Composite grid search (appendix B: "LRP Composites for ViT", after Pahde et al. 2023): try every combination
of a rule per layer type and rank the composites by an objective, by default the faithfulness on held-out samples
(pixels of images, tokens of texts: language models take the same layer types, without ``conv``; see
:py:data:`TEXT_GRID`).

Layer types are those of :py:class:`~zennit_attn.composites.AttnLRPGamma`: ``conv`` (patch embedding), ``linear``
(MLP and head), ``attention_in`` (q/k/v projections), ``attention_out`` (attention output projection) and
``product`` (the product rule: AttnLRP or CP). Each grid entry is a list of options, written as Python
expressions over the rules of :py:mod:`zennit_attn.rules` (``'Gamma(0.25)'``, ``'Epsilon(1e-06)'``,
``'ZPlus()'``, ``'AlphaBeta(2.0, 1.0)'``, ``'Uniform()'``, ``'ConstantGates()'``, ``'None'``) or as rule instances,
so that the best composite can be printed as the Python that builds it::

    result = composite_search(model, val_pixels, grid={'conv': ['Gamma(0.25)', 'ZPlus()'], 'linear': [...]})
    result.write('search')               # search.csv and search.md, ranked
    print(result.best_code())            # AttnLRPGamma(conv=Gamma(0.25), linear=..., ...)
    composite = result.best_composite()
"""

from __future__ import annotations

import csv
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ... import rules
from ...composites import AttnLRPGamma, rule_repr
from ...explain import explain
from ...inputs.checks import as_integers
from ...methods.propagation import lrp_method
from .faithfulness import faithfulness

__all__ = [
    'LAYER_TYPES',
    'DEFAULT_GRID',
    'TEXT_GRID',
    'Candidate',
    'SearchResult',
    'composite_search',
    'faithfulness_objective',
]

#: Layer types of the search, in table order.
LAYER_TYPES = ('conv', 'linear', 'attention_in', 'attention_out', 'product')

#: The grid of the paper's search space (appendix B: epsilon, z+, gamma, alpha-beta with alpha 2, beta 1; CP-LRP
#: or AttnLRP as the product rule). Its product has 7 * 7 * 3 * 3 * 2 = 882 composites: pass a smaller grid for a
#: quick search.
DEFAULT_GRID: dict[str, list[str]] = {
    'conv': [
        'Epsilon(1e-06)',
        'Gamma(0.1)',
        'Gamma(0.25)',
        'Gamma(0.5)',
        'Gamma(1.0)',
        'ZPlus()',
        'AlphaBeta(2.0, 1.0)',
    ],
    'linear': [
        'Epsilon(1e-06)',
        'Gamma(0.01)',
        'Gamma(0.05)',
        'Gamma(0.1)',
        'Gamma(0.25)',
        'ZPlus()',
        'AlphaBeta(2.0, 1.0)',
    ],
    'attention_in': ['Epsilon(1e-06)', 'Gamma(0.05)', 'Gamma(0.25)'],
    'attention_out': ['Epsilon(1e-06)', 'Gamma(0.05)', 'Gamma(0.25)'],
    'product': ['Uniform()', 'ConstantGates()'],
}

#: A search space for language models (``benchmarks/composite_search.py --modality text``): epsilon values and gamma
#: on the linear layers outside attention (the MLP and the LM head) and on the attention projections; ``None`` is
#: the paper's default for language models (the epsilon rule with epsilon -> 0: all ``None`` is
#: :py:class:`~zennit_attn.composites.AttnLRPEpsilon`). 6 * 2 * 2 = 24 composites.
TEXT_GRID: dict[str, list[str]] = {
    'linear': ['None', 'Epsilon(0.01)', 'Epsilon(0.1)', 'Gamma(0.01)', 'Gamma(0.05)', 'Gamma(0.25)'],
    'attention_in': ['None', 'Gamma(0.05)'],
    'attention_out': ['None', 'Gamma(0.05)'],
}

#: Names available to the option expressions.
NAMESPACE = {name: getattr(rules, name) for name in dir(rules) if not name.startswith('_')}


def _code(option) -> str:
    return option if isinstance(option, str) else rule_repr(option)


def _rule(option):
    if isinstance(option, str):
        return eval(option, dict(NAMESPACE))  # noqa: S307 - expressions written by the caller
    return option


@dataclass
class Candidate:
    """One composite of the grid: an option per layer type."""

    options: dict[str, object]

    def code(self, composite: str = 'AttnLRPGamma') -> str:
        """The Python expression that builds the composite."""
        arguments = ', '.join(f'{kind}={_code(option)}' for kind, option in self.options.items())
        return f'{composite}({arguments})'

    def composite(self, base: type | None = None):
        """A new composite instance (``base`` default :py:class:`~zennit_attn.composites.AttnLRPGamma`)."""
        base = AttnLRPGamma if base is None else base
        return base(**{kind: _rule(option) for kind, option in self.options.items()})

    def labels(self) -> dict[str, str]:
        return {kind: _code(option) for kind, option in self.options.items()}


def faithfulness_objective(
    steps: int = 16, mode: str = 'flipping', patch_size: int = 1, baseline: float = 0.0, batch_size: int = 512
) -> Callable:
    """The default objective: mean faithfulness score (:py:func:`~zennit_attn.workflows.evaluation.faithfulness`; pixels
    or ``patch_size`` patches of images, word embeddings of tokens) of the composite's explanations. Returns
    ``objective(model, composite, inputs, targets) -> dict`` with ``score``, ``sem``, ``area_morf``,
    ``area_lerf``."""

    def objective(model, composite, inputs, targets):
        explanation = explain(model, inputs, target=targets, method=lrp_method(composite), composite=composite)
        summary = faithfulness(
            model,
            explanation,
            steps,
            mode,
            patch_size=patch_size,
            baseline=baseline,
            batch_size=batch_size,
            progress=False,
        )
        return {
            'score': summary.score,
            'sem': summary.sem,
            'area_morf': summary.area_morf,
            'area_lerf': summary.area_lerf,
        }

    return objective


@dataclass
class SearchResult:
    """Ranked results: ``rows`` sorted by ``score`` (best first), each with the options' code per layer type."""

    rows: list[dict]
    candidates: list[Candidate]
    layer_types: tuple[str, ...]
    base: str = 'AttnLRPGamma'
    meta: dict = field(default_factory=dict)

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def best_composite(self, base: type | None = None):
        return self.best.composite(base)

    def best_method(self) -> str:
        """The LRP method the best composite computes (its product rule's: ``'attnlrp'`` or ``'cplrp'``), the
        ``method=`` of :py:func:`~zennit_attn.explain` with :py:meth:`best_composite`."""
        return lrp_method(self.best_composite())

    def best_code(self) -> str:
        """The Python that builds the best composite."""
        names = sorted(
            {name for option in self.best.labels().values() for name in NAMESPACE if re.search(rf'\b{name}\(', option)}
        )
        return (
            f'from zennit_attn.composites import {self.base}\n'
            f'from zennit_attn.rules import {", ".join(names)}\n\n'
            f'composite = {self.best.code(self.base)}'
            if names
            else f'composite = {self.best.code(self.base)}'
        )

    def columns(self) -> list[str]:
        return ['rank', *self.layer_types, 'score', 'sem', 'area_morf', 'area_lerf']

    def to_csv(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open('w', newline='') as handle:
            writer = csv.DictWriter(handle, fieldnames=self.columns(), extrasaction='ignore')
            writer.writeheader()
            writer.writerows(self.rows)
        return path

    def to_markdown(self, limit: int | None = None) -> str:
        columns = self.columns()
        lines = ['| ' + ' | '.join(columns) + ' |', '|' + '|'.join('---' for _ in columns) + '|']
        for row in self.rows[:limit]:
            lines.append('| ' + ' | '.join(_format(row.get(column)) for column in columns) + ' |')
        return '\n'.join(lines) + '\n'

    def write(self, prefix) -> tuple[Path, Path]:
        """Write ``<prefix>.csv`` and ``<prefix>.md`` (the Markdown table ends with the best composite's code)."""
        prefix = Path(prefix)
        csv_path = self.to_csv(prefix.with_suffix('.csv'))
        md_path = prefix.with_suffix('.md')
        md_path.write_text(self.to_markdown() + '\nBest composite:\n\n```python\n' + self.best_code() + '\n```\n')
        return csv_path, md_path


def _format(value) -> str:
    if isinstance(value, float):
        return 'nan' if math.isnan(value) else f'{value:.4f}'
    return str(value)


def composite_search(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets=None,
    grid: Mapping[str, Sequence] | None = None,
    objective: Callable | None = None,
    base: type | None = None,
    progress: bool = True,
) -> SearchResult:
    """Evaluate every composite of ``grid`` and rank them by ``objective`` (larger is better).

    Parameters
    ----------
    model: torch.nn.Module
        A vision transformer or a language model, in eval mode.
    inputs: torch.Tensor
        Held-out samples (a validation split: the search tunes on them): ``[batch, C, H, W]`` images, or
        ``[batch, seq]`` token ids of equal length (the last position is explained).
    targets: tensor, optional
        ``[batch]`` classes or tokens to explain (integers: floats are refused, not truncated); default (None): the
        model's predictions, chosen by :py:func:`~zennit_attn.explain` (the same for every composite).
    grid: mapping, optional
        Layer type -> options (see the module documentation); missing layer types keep the composite's default.
        Default :py:data:`DEFAULT_GRID` (vision transformers).
    objective: callable, optional
        ``(model, composite, inputs, targets) -> float or dict with 'score'``; default
        :py:func:`faithfulness_objective` ``()`` (16 flipping steps on single pixels or tokens).
    base: type, optional
        The composite class (default :py:class:`~zennit_attn.composites.AttnLRPGamma`); its constructor takes the
        layer types as keyword arguments.
    progress: bool
        tqdm progress bar over the composites.
    """
    grid = DEFAULT_GRID if grid is None else dict(grid)
    unknown = set(grid) - set(LAYER_TYPES)
    if unknown:
        raise ValueError(f'Unknown layer types {sorted(unknown)}; known: {LAYER_TYPES}')
    layer_types = tuple(kind for kind in LAYER_TYPES if kind in grid)
    if not layer_types or any(len(grid[kind]) == 0 for kind in layer_types):
        raise ValueError('The grid needs at least one option per listed layer type')
    base = AttnLRPGamma if base is None else base
    objective = faithfulness_objective() if objective is None else objective
    targets = as_integers(targets, 'targets')  # floats refused, not truncated (0.7 is no class)
    candidates = [
        Candidate(dict(zip(layer_types, options)))
        for options in itertools.product(*(grid[kind] for kind in layer_types))
    ]
    rows = []
    for index, candidate in enumerate(tqdm(candidates, disable=not progress, desc='composite search')):
        value = objective(model, candidate.composite(base), inputs, targets)
        value = dict(value) if isinstance(value, Mapping) else {'score': float(value)}
        score = float(value['score'])
        rows.append(
            {**candidate.labels(), **value, 'score': score if math.isfinite(score) else -math.inf, '_index': index}
        )
    order = sorted(range(len(rows)), key=lambda i: (-rows[i]['score'], rows[i]['_index']))
    ranked = []
    for rank, i in enumerate(order, 1):
        row = {key: value for key, value in rows[i].items() if key != '_index'}
        ranked.append({'rank': rank, **row})
    return SearchResult(
        rows=ranked,
        candidates=[candidates[i] for i in order],
        layer_types=layer_types,
        base=base.__name__,
        meta={'samples': int(inputs.shape[0]), 'composites': len(candidates)},
    )
