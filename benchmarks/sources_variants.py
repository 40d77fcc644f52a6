"""What does not close the gap to ContextCite: variants of AttnLRP's context attribution scored by the LDS (issue 43).

The items, answers, prompt (chat) and the 32 held-out random ablations of the LDS are those of
``benchmarks/sources.py bench``; ContextCite-64's LDS is read from its ``bench.jsonl`` (the same ablations, so the
differences are paired). Two steps:

``collect``: per item, the response's per-token log-probabilities with every source and under the held-out ablations,
and one AttnLRP explanation of the response's log-odds (``explain_response``, as ``bench``) with latent relevance at
the residual stream and at the values (:py:mod:`zennit_attn.latent`), summed over each source's tokens: ``residual``
``[layers + 1, sources]`` (row 0 is the input relevance, the sources' scores of ``bench``) and ``value`` ``[layers,
sources]``. One ``.npz`` per item in ``--cache`` (an interrupted run resumes; ``--shard`` splits the items).

``report``: the LDS of each variant, mean +- standard error over the items, and minus ContextCite-64's on the same item:

- the input relevance (AttnLRP of ``bench``) and the relevance at the residual stream after block ``l`` (the
  relevance of what sits at the source's positions there), or moved by the values of every layer (summed);
- *learned layer weights* (AT2's idea with LRP instead of attention: Cohen-Wang et al. 2025, arXiv 2504.13752): a
  ridge regression of the held-out ablations' log-probability on the per-layer relevance of the kept sources, pooled
  over items (each item's masks centred and scaled), fitted on the items of one parity of the id and scored on the
  others (two folds): one explanation per item at use, the weights learned once per model;
- *relevance as the prior of a surrogate fitted on K ablations*
  (:py:func:`zennit_attn.workflows.evaluation.prior_surrogate.fit_prior_surrogate`): K of the 32 held-out ablations
  (K = 4, 6, 8; four random splits per item) and the full context fit ``log p = b + a (m . r) + m . d`` with a ridge
  penalty on ``d``;
  scored on the other ``32 - K`` ablations, beside the input relevance and ContextCite's Lasso fitted on the same K
  alone (a cost of K forward passes besides the explanation's).

Example (1 thread per shard)::

    python benchmarks/sources_variants.py collect --items 50 --cache variants/   # and at once:
    python benchmarks/sources_variants.py collect --first 50 --cache variants/
    python benchmarks/sources_variants.py report --cache variants/
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sources import HELD_OUT, HELD_OUT_SEED, ITEMS, OUT, mean_sem, prompt_of, read_rows  # noqa: E402
from zennit_attn.pretrained import load_smollm2  # noqa: E402
from zennit_attn.workflows.evaluation.context_cite import fit_lasso  # noqa: E402
from zennit_attn.workflows.evaluation.prior_surrogate import fit_prior_surrogate  # noqa: E402
from zennit_attn.workflows.evaluation.source_ablation import SourceAblation, ablation_masks, lds  # noqa: E402
from zennit_attn.workflows.sources import explain_response  # noqa: E402

#: the latent sites recorded, summed over each source's tokens
SITES = ('residual', 'value')
#: the ridge penalty of the learned layer weights (on standardised features) and of the surrogate's corrections
LAYER_RIDGE, PRIOR_RIDGE = 1.0, 1.0
#: ablations the surrogate is fitted on, and the random splits of the held-out ablations per item
FITTED, SPLITS = (4, 6, 8), 4


def collect(model, tokenizer, item: dict, answer: str) -> dict[str, np.ndarray]:
    """The held-out ablations' log-probabilities and the per-layer source relevance of one AttnLRP explanation."""
    item['answers']['chat'] = answer
    prompt = prompt_of(item, tokenizer, 'chat')
    ablation = SourceAblation(model, prompt, prompt.response_ids(answer))
    sources = ablation.sources
    held = ablation_masks(HELD_OUT, sources, 0.5, HELD_OUT_SEED)
    record = {'held': held, 'held_lp': ablation(held), 'full_lp': ablation(np.ones((1, sources), dtype=bool))[0]}
    start = time.perf_counter()
    result = explain_response(model, prompt, answer, prompt.response_ids(answer), 'attnlrp', 'log_odds', latent=SITES)
    record['seconds'] = np.float64(time.perf_counter() - start)
    owner = np.asarray(result.segments.token_segment)
    positions = np.asarray(result.segments.positions)
    for site in SITES:
        relevance = result.explanation.latent[site][0].detach().to(torch.float64)
        relevance = relevance.reshape(*relevance.shape[:2], -1).sum(-1).numpy()  # [layers, seq]
        record[site] = np.stack([relevance[:, positions[owner == index]].sum(-1) for index in range(sources)], -1)
    record['scores'] = result.scores.numpy()
    return record


def run_collect(args) -> None:
    model, tokenizer = load_smollm2()
    answers = {row['id']: row['answer'] for row in read_rows(args.bench / 'bench.jsonl', complete=True)}
    shard, shards = (int(value) for value in args.shard.split('/'))
    items = json.loads(ITEMS.read_text())[args.first : args.items]
    items = [item for item in items if item['id'] in answers][shard::shards]
    args.cache.mkdir(parents=True, exist_ok=True)
    for item in tqdm([item for item in items if not (args.cache / f'{item["id"]}.npz').exists()], desc='collect'):
        np.savez(args.cache / f'{item["id"]}.npz', **collect(model, tokenizer, item, answers[item['id']]))


def layer_design(record, site_names) -> tuple[np.ndarray, np.ndarray]:
    """One item's rows of the layer-weight regression: the kept sources' relevance per (site, layer) and the
    log-probability, centred over the item's ablations and divided by the log-probability's deviation."""
    features = np.concatenate([record[site] for site in site_names])  # [features, sources]
    design = record['held'].astype(np.float64) @ features.T
    target = record['held_lp'].sum(-1)
    design, target = design - design.mean(0), target - target.mean()
    scale = target.std() + 1e-12
    return design / scale, target / scale


def layer_weights(records, site_names) -> np.ndarray:
    """Ridge weights of the (site, layer) relevance, fitted on ``records`` pooled."""
    design, target = (np.concatenate(parts) for parts in zip(*(layer_design(record, site_names) for record in records)))
    scale = np.sqrt((design**2).mean(0)) + 1e-12
    standard = design / scale
    gram = standard.T @ standard + LAYER_RIDGE * len(target) * np.eye(design.shape[1])
    return np.linalg.solve(gram, standard.T @ target) / scale


def learned_lds(records, site_names) -> dict[int, float]:
    """The LDS of the learned layer weights on each item, fitted on the items of the other parity of the id."""
    scores = {}
    for parity in (0, 1):
        weights = layer_weights([record for key, record in records.items() if key % 2 != parity], site_names)
        for key, record in records.items():
            if key % 2 == parity:
                features = np.concatenate([record[site] for site in site_names])
                scores[key] = lds(weights @ features, record['held'], record['held_lp'])
    return scores


def split_lds(record) -> dict[str, list[float]]:
    """Per fitted count K, the LDS on the other held-out ablations of the input relevance, of the surrogate with the
    relevance as prior, and of ContextCite's Lasso on the K ablations alone."""
    relevance, held, outputs = record['residual'][0], record['held'], record['held_lp'].sum(-1)
    full = record['full_lp'].sum()
    found = {}
    for fitted in FITTED:
        for split in range(SPLITS):
            order = np.random.RandomState(split).permutation(len(held))
            fit, scored = order[:fitted], order[fitted:]
            candidates = {
                'input relevance': relevance,
                'relevance prior': fit_prior_surrogate(relevance, held[fit], outputs[fit], full, PRIOR_RIDGE)[0],
                'Lasso': fit_lasso(held[fit], outputs[fit], 1)[0],
            }
            for name, scores in candidates.items():
                value = lds(scores, held[scored], outputs[scored])
                found.setdefault(f'{name}, K = {fitted}', []).append(value if value == value else 0.0)
    return found


def run_report(args) -> None:
    bench = {row['id']: row['methods'] for row in read_rows(args.bench / 'bench.jsonl', complete=True)}
    records = {int(path.stem): dict(np.load(path)) for path in args.cache.glob('*.npz') if int(path.stem) < args.items}
    records = dict(sorted(records.items()))
    reference = {key: bench[key]['contextcite-64']['lds'] for key in records}
    layers = records[next(iter(records))]['value'].shape[0]
    rows = {
        'ContextCite-64 (bench)': reference,
        'AttnLRP, input relevance': {key: lds(r['residual'][0], r['held'], r['held_lp']) for key, r in records.items()},
    }
    for layer in (1, layers // 4, layers // 2):
        rows[f'residual after block {layer}'] = {
            key: lds(r['residual'][layer], r['held'], r['held_lp']) for key, r in records.items()
        }
    rows['values, summed over the layers'] = {
        key: lds(r['value'].sum(0), r['held'], r['held_lp']) for key, r in records.items()
    }
    rows['learned layer weights, residual'] = learned_lds(records, ('residual',))
    rows['learned layer weights, residual + value'] = learned_lds(records, SITES)
    print(f'{len(records)} items; LDS on the 32 held-out ablations, and minus ContextCite-64 on the same item\n')
    print('| variant | LDS | minus ContextCite-64 | explanations | forward passes |\n|---|---|---|---|---|')
    for name, values in rows.items():
        cost = '0 | 64' if name.startswith('ContextCite') else '1 | 0'
        difference = [values[key] - reference[key] for key in records]
        print(f'| {name} | {mean_sem(values.values())} | {mean_sem(difference)} | {cost} |')
    splits = {}
    for record in records.values():
        for name, values in split_lds(record).items():
            splits.setdefault(name, []).append(np.mean(values))
    print(f'\n{len(records)} items; LDS on the held-out ablations not fitted on (mean of {SPLITS} splits per item)\n')
    print('| variant | LDS | explanations | forward passes |\n|---|---|---|---|')
    for name, values in splits.items():
        fitted = name.rsplit('= ', 1)[1]
        cost = {'input relevance': '1 | 0', 'relevance prior': f'1 | {fitted}', 'Lasso': f'0 | {fitted}'}
        print(f'| {name} | {mean_sem(values)} | {cost[name.split(",")[0]]} |')


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('step', choices=('collect', 'report'))
    parser.add_argument('--items', type=int, default=100, help='the first items of the items file')
    parser.add_argument('--first', type=int, default=0, help='the first item to collect')
    parser.add_argument('--shard', default='0/1', help='i/n: collect every n-th item from the i-th')
    parser.add_argument('--bench', type=Path, default=OUT, help='the folder of bench.jsonl')
    parser.add_argument('--cache', type=Path, default=Path('sources_variants'), help='the per-item .npz files')
    return parser


def main(argv=None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', '1')))
    run_collect(args) if args.step == 'collect' else run_report(args)


if __name__ == '__main__':
    main()
