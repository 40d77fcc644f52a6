"""Composite grid search: it finds the known-best composite on a tiny problem whose answer is fixed, ranks,
writes its tables and prints the best composite as Python that builds it."""

from __future__ import annotations

import csv

import pytest
import torch

from tests.models import pixels, tiny_timm_vit
from zennit_attn.composites import AttnLRPGamma, CPLRPGamma
from zennit_attn.rules import Gamma, GradientRule
from zennit_attn.workflows.evaluation.search import (
    DEFAULT_GRID,
    LAYER_TYPES,
    TEXT_GRID,
    composite_search,
    faithfulness_objective,
)


class Negate(GradientRule):
    """Flips the sign of the gradient: on the patch embedding (which every path passes once) the pixel relevance
    becomes exactly the negative of that without a rule (``None``), so MoRF and LeRF swap and the faithfulness
    score changes sign."""

    def forward(self, module, input, output):
        result = output.view_as(output)
        result.register_hook(lambda grad: -grad)
        return result

    def __repr__(self):
        return 'Negate()'


class Scramble(GradientRule):
    """Replaces the gradient by seeded noise: relevance unrelated to the model."""

    def forward(self, module, input, output):
        result = output.view_as(output)
        generator = torch.Generator().manual_seed(0)
        result.register_hook(lambda grad: torch.randn(grad.shape, generator=generator, dtype=grad.dtype))
        return result

    def __repr__(self):
        return 'Scramble()'


@pytest.fixture(scope='module')
def problem():
    model = tiny_timm_vit(dtype=torch.float64)
    return model, pixels(6)


def test_finds_the_known_best_composite(problem, tmp_path):
    model, x = problem
    grid = {'conv': [Negate(), 'None', Scramble()], 'linear': ['Gamma(0.05)'], 'product': ['Uniform()']}
    result = composite_search(model, x, grid=grid, objective=faithfulness_objective(steps=8), progress=False)
    scores = {row['conv']: row['score'] for row in result.rows}
    assert [row['conv'] for row in result.rows] == ['None', 'Scramble()', 'Negate()']
    assert scores['None'] > 0
    assert scores['Negate()'] == pytest.approx(-scores['None'], rel=1e-9)
    assert [row['rank'] for row in result.rows] == [1, 2, 3]
    assert result.best.labels() == {'conv': 'None', 'linear': 'Gamma(0.05)', 'product': 'Uniform()'}

    # the printed Python builds the best composite, which reproduces the best score
    code = result.best_code()
    assert 'composite = AttnLRPGamma(conv=None, linear=Gamma(0.05), product=Uniform())' in code
    namespace = {}
    exec(code, namespace)
    composite = namespace['composite']
    assert isinstance(composite, AttnLRPGamma)
    targets = model(x).argmax(-1)
    value = faithfulness_objective(steps=8)(model, composite, x, targets)
    assert value['score'] == pytest.approx(scores['None'], rel=1e-12)

    csv_path, md_path = result.write(tmp_path / 'search')
    with csv_path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row['conv'] for row in rows] == ['None', 'Scramble()', 'Negate()']
    assert list(rows[0]) == ['rank', 'conv', 'linear', 'product', 'score', 'sem', 'area_morf', 'area_lerf']
    markdown = md_path.read_text()
    assert markdown.startswith('| rank | conv |') and 'composite = AttnLRPGamma(' in markdown


def test_grid_product_and_custom_objective(problem):
    """A synthetic objective with a fixed optimum: every combination is tried once, the best is found."""
    model, x = problem
    seen = []

    def objective(model, composite, pixels, targets):
        seen.append(composite)
        gamma = composite.rules['linear'].gamma
        return -abs(gamma - 0.1) - (0.5 if type(composite.product).__name__ == 'ConstantGates' else 0)

    grid = {
        'linear': [f'Gamma({g})' for g in (0.01, 0.05, 0.1, 0.25)],
        'product': ['Uniform()', 'ConstantGates()'],
    }
    result = composite_search(model, x, grid=grid, objective=objective, progress=False)
    assert len(seen) == len(result.rows) == 8
    assert result.best.labels() == {'linear': 'Gamma(0.1)', 'product': 'Uniform()'}
    assert (
        result.rows[-1]['linear'] in ('Gamma(0.25)', 'Gamma(0.01)') and result.rows[-1]['product'] == 'ConstantGates()'
    )
    assert isinstance(result.best_composite(CPLRPGamma), CPLRPGamma)
    assert isinstance(result.best_composite().rules['linear'], Gamma)


def test_grid_validation(problem):
    model, x = problem
    assert set(DEFAULT_GRID) == set(LAYER_TYPES)
    with pytest.raises(ValueError, match='Unknown layer types'):
        composite_search(model, x, grid={'mlp': ['Gamma(0.1)']}, progress=False)
    with pytest.raises(ValueError, match='at least one option'):
        composite_search(model, x, grid={'conv': []}, progress=False)


def test_language_model_search_contains_the_paper_default():
    """On a language model the grid's all-``None`` candidate is AttnLRPEpsilon() (epsilon -> 0 everywhere): its
    search score equals the token faithfulness of AttnLRPEpsilon's explanations (two independent paths), targets
    default to the model's predictions, and gamma on the linear layers changes the score."""
    from tests.models import tiny_model
    from zennit_attn import explain
    from zennit_attn.composites import AttnLRPEpsilon
    from zennit_attn.workflows.evaluation import faithfulness

    model = tiny_model('llama')
    ids = torch.randint(3, model.config.vocab_size, (4, 10), generator=torch.Generator().manual_seed(0))
    grid = {'linear': ['None', 'Gamma(0.25)'], 'attention_in': ['None'], 'attention_out': ['None']}
    result = composite_search(model, ids, grid=grid, objective=faithfulness_objective(steps=5), progress=False)
    scores = {row['linear']: row['score'] for row in result.rows}
    reference = faithfulness(model, explain(model, ids, composite=AttnLRPEpsilon()), steps=5, progress=False)
    assert scores['None'] == pytest.approx(reference.score, rel=1e-9, abs=1e-12)
    assert abs(scores['Gamma(0.25)'] - scores['None']) > 1e-6
    assert result.meta == {'samples': 4, 'composites': 2}
    assert set(TEXT_GRID) <= set(LAYER_TYPES) and 'conv' not in TEXT_GRID and 'None' in TEXT_GRID['linear']


def test_float_targets_are_refused_not_truncated(problem):
    """``targets=[0.7] * 6`` was cast to class 0 (``.long()``) and searched as if class 0 had been asked;
    :py:func:`~zennit_attn.explain` refuses such targets, and so does the search now."""
    model, x = problem
    grid = {'conv': ['Gamma(0.25)']}
    with pytest.raises(ValueError, match='targets must hold integers'):
        composite_search(model, x, targets=[0.7] * len(x), grid=grid, progress=False)
    with pytest.raises(ValueError, match='targets must hold integers'):
        composite_search(model, x, targets=torch.ones(len(x)), grid=grid, progress=False)
    scores = [
        composite_search(
            model, x, targets=targets, grid=grid, objective=faithfulness_objective(steps=4), progress=False
        ).rows[0]['score']
        for targets in ([0] * len(x), torch.zeros(len(x), dtype=torch.int32))
    ]
    assert scores[0] == scores[1]
