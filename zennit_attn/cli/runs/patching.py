"""The run step of ``zennit-attn patching`` (:py:mod:`zennit_attn.cli.patching`): load the model, build or read the
prompt pairs, score the components by relevance patching (and activation patching with ``--reference``), print the
top components and write the circuit view."""

from __future__ import annotations

import argparse
import json

from ...workflows.patching import (
    PromptPair,
    activation_patching,
    agreement_pairs,
    correlation,
    edge_patching,
    ioi_pairs,
    pair_ids,
    relevance_patching,
)
from ...workflows.patching.view import save_circuit, save_edges
from ..errors import CommandError
from ..loading import load
from ..progress import status

__all__ = ['read_pairs', 'run']


def read_pairs(args: argparse.Namespace, tokenizer) -> list[PromptPair]:
    """The first ``--pairs`` pairs of ``--pairs-file`` or of ``--task``."""
    if args.pairs_file is None:
        if args.task == 'agreement':
            return agreement_pairs(tokenizer, args.pairs, seed=args.seed)
        return ioi_pairs(tokenizer, args.pairs, seed=args.seed, corruption='abc' if args.task == 'ioi_abc' else 's2')
    try:
        entries = json.loads(args.pairs_file.read_text(encoding='utf-8'))
        pairs = [
            PromptPair(
                entry.get('task', 'file'),
                **{key: entry[key] for key in PromptPair.__dataclass_fields__ if key != 'task'},
            )
            for entry in entries
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CommandError(
            f'--pairs-file {str(args.pairs_file)!r}: not a JSON list of {{"clean", "corrupted", "answer", "wrong"}} '
            f'objects ({error})'
        ) from None
    return pairs[: args.pairs]


def run(args: argparse.Namespace) -> int:
    """Run ``patching`` with arguments checked by :py:func:`zennit_attn.cli.patching.check`; returns the exit
    status."""
    model, tokenizer = load(args, need_tokenizer_first=False)
    try:
        ids = pair_ids(tokenizer, read_pairs(args, tokenizer))
    except ValueError as error:
        raise CommandError(str(error)) from None
    ids = {key: value.to(args.device) for key, value in ids.items()}
    options = {'method': args.method, 'steps': args.steps, 'span': args.span}
    with status(f'relevance patching ({args.method}, {args.steps} steps, span {args.span:g})', not args.quiet):
        scores = relevance_patching(model, components=args.components, **options, **ids)
    pairs = ids['clean'].shape[0]
    print(f'Model:       {args.model_spec.label}')
    source = args.task if args.pairs_file is None else args.pairs_file
    clean, corrupted = float(scores.clean.mean()), float(scores.corrupted.mean())
    print(f'Pairs:       {pairs} ({source}), {ids["clean"].shape[1]} tokens')
    print(f'Metric:      logit difference, clean {clean:+.3f}, corrupted {corrupted:+.3f}')
    print(f'Method:      {args.method}, {args.steps} steps, span {args.span:g} ({scores.seconds:.2f} s)')
    print()
    print(f'Top-{args.top} components (mean over pairs of the estimated change of the metric, summed over positions):')
    for rank, entry in enumerate(scores.top(args.top), start=1):
        print(f'  {rank:>3}. {entry}')
    if args.reference:
        exact = activation_patching(model, components=args.components, progress=not args.quiet, **ids)
        print()
        print(f'Against activation patching ({exact.seconds:.1f} s): Pearson / Spearman per component type')
        for component in args.components:
            pearson, spearman, count = correlation(scores, exact, component)
            print(f'  {component:<10} {pearson:+.3f} / {spearman:+.3f}  ({count} scores)')
    edges = None
    if args.edges:
        with status(f'edge patching ({args.method}, {args.steps} steps, span {args.span:g})', not args.quiet):
            edges = edge_patching(model, **options, **ids)
        print()
        print(f'Top-{args.edges} edges ({edges.seconds:.2f} s; mean over pairs, summed over positions):')
        for rank, entry in enumerate(edges.top(args.edges), start=1):
            print(f'  {rank:>3}. {entry}')
    if args.output is not None:
        save_circuit(scores, args.output, k=args.top)
        print()
        print(f'Wrote {args.output}')
        if edges is not None:
            path = save_edges(edges, args.output.with_name(f'{args.output.stem}-edges{args.output.suffix}'), args.edges)
            print(f'Wrote {path}')
    return 0
