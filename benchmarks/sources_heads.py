"""Head weights learned once per model (AT2's idea) for context attribution, with LRP's relevance or attention weights
as the features per head: does a learned weighting of the heads beat the one-pass relevance? (issue 43).

AT2 (Cohen-Wang et al. 2025, arXiv 2504.13752) scores a source by a weighted sum over attention heads of the attention
the response pays to the source's tokens, the weights learned once per model from ablations of training examples.
Here the same with the features of one AttnLRP explanation (``explain_response``, the response's log-odds, as
``benchmarks/sources.py bench``) beside AT2's own:

- ``input``: the relevance of the source's tokens (the one-pass scores of ``bench``);
- ``value`` / ``key``: the latent relevance (:py:mod:`zennit_attn.latent`) at each key-value head's values / keys
  (SmolLM2: 30 layers x 3 heads), summed over the source's tokens;
- ``attn``: AT2's feature, the attention of each head (30 x 9) from the positions that predict the response to the
  source's tokens (eager attention, averaged over those positions).

Two steps:

``collect train``: items drawn as ``bench`` draws them with another seed (:data:`TRAIN_SEED`; items whose question
names a benchmark item's title left out), SmolLM2's own answer (chat prompt), the features and :data:`TRAIN_ABLATIONS`
random ablations (keep probability 0.5) with the response's log-probability. ``collect eval``: the benchmark's first
``--count`` items (their answers from ``bench.jsonl``), the features and the 32 held-out ablations of the LDS. One
``.npz`` per item in ``--cache`` (a run resumes; ``--shard``).

``report``: ridge weights per feature set, pooled over the training items (each item's ablations centred, its
log-probabilities divided by their deviation and its features by that of the one-pass prediction; the penalty chosen
by 5-fold cross-validation over the training items, the input relevance's weight unpenalised), and the LDS on the
evaluation items against ContextCite-64's on the same items (from ``bench.jsonl``).

Example (1 thread per process)::

    python benchmarks/sources_heads.py collect train --count 170 --shard 0/2   # and at once 1/2
    python benchmarks/sources_heads.py collect eval --count 40
    python benchmarks/sources_heads.py report
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sources import HELD_OUT, HELD_OUT_SEED, ITEMS, OUT, answer, draw_items, prompt_of, read_rows  # noqa: E402
from zennit_attn.pretrained import load_smollm2  # noqa: E402
from zennit_attn.workflows.evaluation.source_ablation import SourceAblation, ablation_masks, lds  # noqa: E402
from zennit_attn.workflows.sources import explain_response  # noqa: E402

#: the seed of the training items, their ablations per item and the seed of their masks (plus 100 per item id)
TRAIN_SEED, TRAIN_ABLATIONS, TRAIN_MASK_SEED = 4343, 12, 300_000
#: the latent sites whose relevance per key-value head is a feature
SITES = ('value', 'key')
#: the feature sets compared
FEATURE_SETS = (
    ('input',),
    ('value',),
    ('key',),
    ('attn',),
    ('input', 'value'),
    ('input', 'value', 'key'),
    ('input', 'value', 'key', 'attn'),
    ('input', 'attn'),
)
#: the ridge penalties tried (on standardised features, times the number of rows)
PENALTIES = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


def per_source(values: np.ndarray, owner: np.ndarray, positions: np.ndarray, sources: int) -> np.ndarray:
    """``[..., seq]`` values summed over each source's tokens: ``[..., sources]``."""
    return np.stack([values[..., positions[owner == source]].sum(-1) for source in range(sources)], -1)


def features(model, tokenizer, item: dict, response: str, sources: int) -> dict[str, np.ndarray]:
    """The features of one item: the one-pass relevance, the latent relevance per key-value head, AT2's attention."""
    prompt = prompt_of(item, tokenizer, 'chat')
    ids = prompt.response_ids(response)
    result = explain_response(model, prompt, response, ids, 'attnlrp', 'log_odds', latent=SITES)
    owner, positions = np.asarray(result.segments.token_segment), np.asarray(result.segments.positions)
    record = {'input': result.scores.numpy()}
    heads = model.config.num_key_value_heads
    for site in SITES:
        latent = result.explanation.latent[site][0].detach().to(torch.float64)  # [layers, seq, features]
        layers, seq, width = latent.shape
        latent = latent.reshape(layers, seq, heads, width // heads).sum(-1).permute(0, 2, 1).numpy()
        record[site] = per_source(latent, owner, positions, sources)  # [layers, heads, sources]
    full = prompt.ids() + list(ids)
    start = len(full) - len(ids)
    implementation = model.config._attn_implementation
    model.config._attn_implementation = 'eager'
    try:
        with torch.no_grad():
            attentions = model(torch.tensor([full]), output_attentions=True).attentions
    finally:
        model.config._attn_implementation = implementation
    rows = torch.stack(attentions)[:, 0, :, start - 1 : len(full) - 1].to(torch.float64).mean(2).numpy()
    record['attn'] = per_source(rows, owner, positions, sources)  # [layers, heads, sources]
    return record


def items_of(kind: str, count: int) -> list[dict]:
    """The training items (drawn anew) or the benchmark's first ``count`` items with their answers."""
    if kind == 'train':
        titles = {item['title'] for item in json.loads(ITEMS.read_text())}
        items = [item for item in draw_items(count, TRAIN_SEED) if item['title'] not in titles]
        for item in items:
            item['answers'] = {}
        return items
    answers = {row['id']: row['answer'] for row in read_rows(OUT / 'bench.jsonl', complete=True)}
    items = [item for item in json.loads(ITEMS.read_text()) if item['id'] in answers][:count]
    for item in items:
        item['answers'] = {'chat': answers[item['id']]}
    return items


def run_collect(args) -> None:
    torch.set_num_threads(args.threads)
    shard, shards = (int(value) for value in args.shard.split('/'))
    model, tokenizer = load_smollm2()
    folder = args.cache / args.kind
    folder.mkdir(parents=True, exist_ok=True)
    for item in tqdm(items_of(args.kind, args.count)[shard::shards], desc=args.kind):
        path = folder / f'{item["id"]}.npz'
        if path.exists():
            continue
        start = time.perf_counter()
        response = item['answers'].get('chat') or answer(model, tokenizer, item, 'chat')
        if not response.strip():
            continue
        prompt = prompt_of(item, tokenizer, 'chat')
        ablation = SourceAblation(model, prompt, prompt.response_ids(response))
        record = features(model, tokenizer, item, response, ablation.sources)
        if args.kind == 'train':
            masks = ablation_masks(TRAIN_ABLATIONS, ablation.sources, 0.5, TRAIN_MASK_SEED + 100 * item['id'])
        else:
            masks = ablation_masks(HELD_OUT, ablation.sources, 0.5, HELD_OUT_SEED)
        record['masks'] = masks.numpy()
        record['lp'] = ablation(masks).numpy().sum(-1)
        record['seconds'] = np.float64(time.perf_counter() - start)
        np.savez(path, **record)


def flat(record: dict, names) -> np.ndarray:
    """``[features, sources]``: the feature sets ``names`` of one item."""
    return np.concatenate([record[name].reshape(-1, record[name].shape[-1]) for name in names])


def design(record: dict, names) -> tuple[np.ndarray, np.ndarray]:
    """One item's rows: the kept sources' features and the log-probability, centred over the item's ablations, the
    log-probability divided by its deviation and the features by that of the one-pass prediction."""
    masks = record['masks'].astype(np.float64)
    rows, target = masks @ flat(record, names).T, record['lp'].astype(np.float64)
    rows, target = rows - rows.mean(0), target - target.mean()
    scale = (masks @ record['input']).std() + 1e-9
    return rows / scale, target / (target.std() + 1e-9)


def weights(records: list[dict], names, penalty: float) -> np.ndarray:
    """Ridge weights of the features ``names``, pooled over ``records`` (the input relevance's weight unpenalised)."""
    rows, target = (np.concatenate(parts) for parts in zip(*(design(record, names) for record in records)))
    scale = np.sqrt((rows**2).mean(0)) + 1e-12
    standard = rows / scale
    ridge = penalty * len(target) * np.eye(rows.shape[1])
    if names[0] == 'input':
        ridge[0, 0] = 0.0
    return np.linalg.solve(standard.T @ standard + ridge, standard.T @ target) / scale


def item_lds(weight: np.ndarray, record: dict, names) -> float:
    return lds(weight @ flat(record, names), record['masks'], record['lp'])


def cross_validated(records: list[dict], names, penalty: float, folds: int = 5) -> float:
    """The mean LDS on held-out training items (``folds`` folds by the items' order)."""
    found = []
    for fold in range(folds):
        fitted = [record for index, record in enumerate(records) if index % folds != fold]
        weight = weights(fitted, names, penalty)
        found += [item_lds(weight, record, names) for index, record in enumerate(records) if index % folds == fold]
    return float(np.nanmean(found))


def mean_se(values) -> str:
    values = np.asarray(values, dtype=np.float64)
    return f'{values.mean():.3f} ± {values.std(ddof=1) / np.sqrt(len(values)):.3f}'


def load(folder: Path) -> dict[int, dict]:
    """The collected items of ``folder`` by id."""
    return {int(path.stem): dict(np.load(path)) for path in sorted(folder.glob('*.npz'))}


def run_report(args) -> None:
    train = list(load(args.cache / 'train').values())
    by_id = load(args.cache / 'eval')
    evaluation = list(by_id.values())
    bench = {row['id']: row['methods'] for row in read_rows(OUT / 'bench.jsonl', complete=True)}
    reference = np.array([bench[key]['contextcite-64']['lds'] for key in by_id])
    print(f'{len(train)} training items ({TRAIN_ABLATIONS} ablations each), {len(evaluation)} benchmark items')
    print('\n| features | penalty | LDS (cross-validated, training) | LDS | minus ContextCite-64 |')
    print('|---|---|---|---|---|')
    print(f'| ContextCite-64 (bench) | | | {mean_se(reference)} | |')
    for names in FEATURE_SETS:
        score, penalty = max((cross_validated(train, names, penalty), penalty) for penalty in PENALTIES)
        weight = weights(train, names, penalty)
        found = np.array([item_lds(weight, record, names) for record in evaluation])
        print(f'| {" + ".join(names)} | {penalty:g} | {score:.3f} | {mean_se(found)} | {mean_se(found - reference)} |')


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    commands = parser.add_subparsers(dest='command', required=True)
    collect = commands.add_parser('collect')
    collect.add_argument('kind', choices=('train', 'eval'))
    collect.add_argument('--count', type=int, default=40)
    collect.add_argument('--shard', default='0/1')
    collect.add_argument('--threads', type=int, default=1)
    for command in (collect, commands.add_parser('report')):
        command.add_argument('--cache', type=Path, default=Path('sources_heads'), help='the per-item .npz files')
    args = parser.parse_args(argv)
    run_collect(args) if args.command == 'collect' else run_report(args)


if __name__ == '__main__':
    main()
