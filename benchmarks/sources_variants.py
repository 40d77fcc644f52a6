"""What does not close the gap to ContextCite: variants of AttnLRP's context attribution scored by the LDS (issue 43).

The items, answers, prompt (chat) and the 32 held-out random ablations of the LDS are those of
``benchmarks/sources.py bench``; ContextCite-64's LDS is read from its ``bench.jsonl`` (the same ablations, so the
differences are paired). Four steps:

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

``ablated`` and ``ablated-report``: explanations at ablated contexts, combined (the issue's "relevance of the answer
explained under a few ablated contexts and combined"). Per item, AttnLRP explains the response's log-odds with every
source and at :data:`ABLATED` random ablations (keep probability 0.5, seeds from :data:`ABLATED_SEED`; each source's
score is that of its tokens in the reduced context); the report scores, by the LDS on the held-out ablations, the mean
of a source's scores over the contexts that hold it (with the full context and the first ``K - 1`` ablations: K
explanations; a source's average contribution over the random contexts of the LDS, the linear fit's weight when the
scores are the drops of removing it, a Banzhaf value), and the least-squares fit of ``log p = b + m . w`` to the K
contexts' log-probabilities (which their explanations' forward passes give) together with ``w`` near each score of a
context that holds the source (weight :data:`GRADIENT_WEIGHT`: gradient-enhanced regression). One ``.npz`` per item in
``--cache``.

Example (1 thread per shard)::

    python benchmarks/sources_variants.py collect --items 50 --cache variants/   # and at once:
    python benchmarks/sources_variants.py collect --first 50 --cache variants/
    python benchmarks/sources_variants.py report --cache variants/
    python benchmarks/sources_variants.py ablated --items 40 --cache ablated/
    python benchmarks/sources_variants.py ablated-report --cache ablated/
"""

from __future__ import annotations

import argparse
import functools
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
from zennit_attn.workflows.sources import SourcePrompt, explain_response  # noqa: E402

#: the latent sites recorded, summed over each source's tokens
SITES = ('residual', 'value')
#: the ridge penalty of the learned layer weights (on standardised features) and of the surrogate's corrections
LAYER_RIDGE, PRIOR_RIDGE = 1.0, 1.0
#: ablations the surrogate is fitted on, and the random splits of the held-out ablations per item
FITTED, SPLITS = (4, 6, 8), 4
#: the ablated contexts explained per item (besides the full one), their first seed, the explanations combined in the
#: report, and the weight of the scores in the gradient-enhanced fit
ABLATED, ABLATED_SEED, COMBINED, GRADIENT_WEIGHT = 7, 200_000, (2, 3, 4, 8), 1.0


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


def run_collect(args, collector=collect) -> None:
    """``collector(model, tokenizer, item, answer)`` of each item of the shard (with its answer in ``bench``) not in
    the cache yet, one ``.npz`` per item."""
    model, tokenizer = load_smollm2()
    answers = {row['id']: row['answer'] for row in read_rows(args.bench / 'bench.jsonl', complete=True)}
    shard, shards = (int(value) for value in args.shard.split('/'))
    items = json.loads(ITEMS.read_text())[args.first : args.items]
    items = [item for item in items if item['id'] in answers][shard::shards]
    args.cache.mkdir(parents=True, exist_ok=True)
    for item in tqdm([item for item in items if not (args.cache / f'{item["id"]}.npz').exists()], desc=args.step):
        np.savez(args.cache / f'{item["id"]}.npz', **collector(model, tokenizer, item, answers[item['id']]))


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


def explained_at(model, tokenizer, prompt: SourcePrompt, keep, answer: str) -> np.ndarray:
    """The AttnLRP scores of the sources kept by ``keep`` (NaN for the others) for the response's log-odds, explained
    in the context without the others."""
    context, spans = prompt.kept_context(keep)
    live = [index for index, span in enumerate(spans) if span is not None]
    reduced = SourcePrompt(context, [spans[index] for index in live], prompt.query, prompt.template, prompt.chat,
                           tokenizer)  # fmt: skip
    result = explain_response(model, reduced, answer, reduced.response_ids(answer), 'attnlrp', 'log_odds')
    scores = np.full(len(keep), np.nan)
    scores[live] = result.scores.numpy()
    return scores


def collect_ablated(model, tokenizer, item: dict, answer: str) -> dict[str, np.ndarray]:
    """The held-out ablations' log-probabilities, and the scores of explanations with every source and at
    :data:`ABLATED` random ablations (with at least one source) with their log-probabilities."""
    item['answers']['chat'] = answer
    prompt = prompt_of(item, tokenizer, 'chat')
    ablation = SourceAblation(model, prompt, prompt.response_ids(answer))
    sources = ablation.sources
    held = ablation_masks(HELD_OUT, sources, 0.5, HELD_OUT_SEED)
    drawn = [mask for mask in ablation_masks(ABLATED + 8, sources, 0.5, ABLATED_SEED).numpy() if mask.any()]
    masks = np.concatenate([np.ones((1, sources), dtype=bool), np.stack(drawn[:ABLATED])])
    start = time.perf_counter()
    scores = np.stack([explained_at(model, tokenizer, prompt, mask, answer) for mask in masks])
    seconds = time.perf_counter() - start
    return {'held': held.numpy(), 'held_lp': ablation(held).numpy(), 'masks': masks,
            'mask_lp': ablation(masks).numpy(), 'scores': scores, 'seconds': np.float64(seconds)}  # fmt: skip


def mean_over_contexts(record, count: int) -> np.ndarray:
    """Each source's score averaged over the first ``count`` explained contexts that hold it."""
    masks, scores = record['masks'][:count], record['scores'][:count]
    return np.where(masks, scores, 0.0).sum(0) / np.maximum(masks.sum(0), 1)


def gradient_enhanced(record, count: int) -> np.ndarray:
    """``w`` of the least-squares fit of ``log p = b + m . w`` to the first ``count`` explained contexts and of
    ``w_i = a s_i`` to each score ``s_i`` of a context that holds source ``i`` (weight :data:`GRADIENT_WEIGHT`, the
    scale ``a`` fitted)."""
    masks, scores = record['masks'][:count].astype(np.float64), record['scores'][:count]
    sources = masks.shape[1]
    rows = [np.concatenate([[1.0], mask, [0.0]]) for mask in masks]
    targets = list(record['mask_lp'][:count].sum(-1))
    weight = np.sqrt(GRADIENT_WEIGHT)
    for context, source in zip(*np.nonzero(masks)):
        row = np.zeros(sources + 2)
        row[1 + source], row[-1] = weight, -weight * scores[context, source]
        rows.append(row)
        targets.append(0.0)
    return np.linalg.lstsq(np.stack(rows), np.asarray(targets), rcond=None)[0][1:-1]


def run_ablated_report(args) -> None:
    bench = {row['id']: row['methods'] for row in read_rows(args.bench / 'bench.jsonl', complete=True)}
    records = {int(path.stem): dict(np.load(path)) for path in args.cache.glob('*.npz') if int(path.stem) < args.items}
    records = dict(sorted(records.items()))
    reference = {key: bench[key]['contextcite-64']['lds'] for key in records}
    rows = {'ContextCite-64 (bench)': (reference, 0)}
    rows['the one pass (full context)'] = (
        {key: lds(r['scores'][0], r['held'], r['held_lp']) for key, r in records.items()},
        1,
    )
    for count in COMBINED:
        found = {key: lds(mean_over_contexts(r, count), r['held'], r['held_lp']) for key, r in records.items()}
        rows[f'mean over contexts, K = {count}'] = (found, count)
    for count in COMBINED:
        found = {key: lds(gradient_enhanced(r, count), r['held'], r['held_lp']) for key, r in records.items()}
        rows[f'gradient-enhanced fit, K = {count}'] = (found, count)
    seconds = np.mean([record['seconds'] / len(record['masks']) for record in records.values()])
    print(f'{len(records)} items; LDS on the 32 held-out ablations, and minus ContextCite-64 on the same item;')
    print(f'K AttnLRP explanations ({seconds:.1f} s each here)\n')
    print('| variant | LDS | minus ContextCite-64 | explanations (forward + backward) |\n|---|---|---|---|')
    for name, (values, count) in rows.items():
        difference = [values[key] - reference[key] for key in records]
        print(f'| {name} | {mean_sem(values.values())} | {mean_sem(difference)} | {count} |')


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('step', choices=tuple(STEPS))
    parser.add_argument('--items', type=int, default=100, help='the first items of the items file')
    parser.add_argument('--first', type=int, default=0, help='the first item to collect')
    parser.add_argument('--shard', default='0/1', help='i/n: collect every n-th item from the i-th')
    parser.add_argument('--bench', type=Path, default=OUT, help='the folder of bench.jsonl')
    parser.add_argument('--cache', type=Path, default=Path('sources_variants'), help='the per-item .npz files')
    return parser


def main(argv=None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', '1')))
    STEPS[args.step](args)


#: the steps of the script by name
STEPS = {
    'collect': run_collect,
    'report': run_report,
    'ablated': functools.partial(run_collect, collector=collect_ablated),
    'ablated-report': run_ablated_report,
}


if __name__ == '__main__':
    main()
