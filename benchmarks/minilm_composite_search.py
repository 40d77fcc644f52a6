"""Composite grid search on the all-MiniLM-L6-v2 encoder (issue 42).

The 24 composites of :py:data:`zennit_attn.workflows.evaluation.search.TEXT_GRID` (epsilon values and gamma on the MLP
linears and on the attention projections; all ``None`` is AttnLRP) are ranked by the flipping benchmark of
``benchmarks/minilm_perturbation.py`` (Delta A of the [CLS] state projected onto the title's sentence embedding, 16
steps, word embeddings set to 0) on ``--val-articles`` validation articles (those of the seeded sample after the
benchmark's 100); the best, AttnLRP and CP-LRP then on the benchmark's 100 articles (never used in the search):
flipping, and the leave-one-out agreement of ``benchmarks/leave_one_out.py`` (Spearman by zeroing and by deletion),
each paired against AttnLRP. Outputs in ``docs/results/variants/``: ``minilm_search.csv`` / ``minilm_search.md``
(ranked), ``minilm_search_test.md``. Run alone::

    python benchmarks/minilm_composite_search.py --val-articles 40 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.leave_one_out import minilm_samples  # noqa: E402
from benchmarks.minilm_perturbation import scores  # noqa: E402
from zennit_attn import explain  # noqa: E402
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon  # noqa: E402
from zennit_attn.pretrained import load_minilm  # noqa: E402
from zennit_attn.workflows.evaluation import mean_sem, token_drops  # noqa: E402
from zennit_attn.workflows.evaluation.search import TEXT_GRID, composite_search  # noqa: E402

STEPS = 16
TEST_ARTICLES = 100
OUT = ROOT / 'docs' / 'results' / 'variants'


def flipping_objective(samples):
    """The search's objective: the mean flipping Delta A of a composite over ``samples`` (``(title, ids, options)``:
    each article's own target function), and its standard error."""

    def objective(model, composite, inputs, targets):
        values = [
            scores(model, explain(model, ids, composite=composite, **options), STEPS)['flipping']
            for _, ids, options in samples
        ]
        mean, sem = mean_sem(values)
        return {'score': mean, 'sem': sem}

    return objective


def test_rows(model, samples, composites: dict) -> dict[str, dict[str, list[float]]]:
    """Per composite, per article of ``samples``: flipping Delta A and the leave-one-out Spearman correlations (the
    drops measured once per article)."""
    rows = {name: {'flipping': [], 'zeroed': [], 'deleted': []} for name in composites}
    for _, ids, options in tqdm(samples, desc='test articles', mininterval=10):
        explanations = {name: explain(model, ids, composite=make(), **options) for name, make in composites.items()}
        (drops,) = token_drops(model, next(iter(explanations.values())), modes=('zeroed', 'deleted'), progress=False)
        for name, explanation in explanations.items():
            agreement = drops.agreement_of(explanation)
            rows[name]['flipping'].append(scores(model, explanation, STEPS)['flipping'])
            rows[name]['zeroed'].append(agreement.spearman['zeroed'])
            rows[name]['deleted'].append(agreement.spearman['deleted'])
    return rows


def test_report(rows: dict, header: str) -> list[str]:
    reference = rows['AttnLRP (AttnLRPEpsilon())']
    lines = [
        header,
        '',
        '| composite | flipping Delta A | minus AttnLRP | LOO Spearman, zeroed | minus AttnLRP '
        '| LOO Spearman, deleted | minus AttnLRP |',
        '|---|---|---|---|---|---|---|',
    ]
    for name, values in rows.items():
        cells = []
        for column in ('flipping', 'zeroed', 'deleted'):
            mean, sem = mean_sem(values[column])
            paired = mean_sem([a - b for a, b in zip(values[column], reference[column])])
            cells += [f'{mean:+.3f} +- {sem:.3f}', f'{paired[0]:+.3f} +- {paired[1]:.3f}']
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--val-articles', type=int, default=40)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out', type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start, load = time.time(), os.getloadavg()[0]
    model, tokenizer = load_minilm()
    samples = minilm_samples(model, tokenizer, None, TEST_ARTICLES + args.val_articles, 32, 0)
    test, validation = samples[:TEST_ARTICLES], samples[TEST_ARTICLES:]
    ids = torch.cat([ids for _, ids, _ in validation])
    result = composite_search(model, ids, grid=TEXT_GRID, objective=flipping_objective(validation))
    args.out.mkdir(parents=True, exist_ok=True)
    result.write(args.out / 'minilm_search')
    searched = time.time() - start
    composites = {
        'AttnLRP (AttnLRPEpsilon())': AttnLRPEpsilon,
        f'the best of the search (`{result.best.code(result.base)}`)': result.best_composite,
        'CP-LRP (CPLRPEpsilon())': CPLRPEpsilon,
    }
    rows = test_rows(model, test, composites)
    header = (
        '# Composite search on all-MiniLM-L6-v2: the held-out articles\n\n'
        f'`python benchmarks/minilm_composite_search.py --val-articles {args.val_articles} --threads {args.threads}`: '
        f'{len(result.rows)} composites ranked by flipping '
        f"on {len(validation)} validation articles ({searched:.0f} s, `minilm_search.md`), then on the benchmark's "
        f'{len(test)} articles ({time.time() - start - searched:.0f} s); load average {load:.2f} -> '
        f'{os.getloadavg()[0]:.2f}. Mean +- standard error over the articles; "minus AttnLRP" paired on the same '
        'articles.'
    )
    lines = test_report(rows, header)
    (args.out / 'minilm_search_test.md').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
