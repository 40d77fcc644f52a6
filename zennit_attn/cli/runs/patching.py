"""The run step of ``zennit-attn patching`` (:py:mod:`zennit_attn.cli.patching`): load the model, build or read the
prompt pairs, score the components by relevance patching (and activation patching with ``--reference``), print the
top components and write the circuit view."""

from __future__ import annotations

import argparse

from ...workflows.patching import (
    PromptPair,
    activation_patching,
    correlation,
    edge_patching,
    pair_ids,
    relevance_patching,
    task_pairs,
)
from ...workflows.patching.view import save_circuit, save_edges
from ..errors import CommandError
from ..loading import load
from ..patching import PAIR_FIELDS
from ..progress import status

__all__ = ['read_pairs', 'run']


def read_pairs(args: argparse.Namespace, tokenizer) -> list[PromptPair]:
    """The first ``--pairs`` pairs of ``--pairs-file`` (read and checked by
    :py:func:`zennit_attn.cli.patching.read_pairs_file` before the model was loaded) or of ``--task``."""
    if args.pair_entries is None:
        return task_pairs(tokenizer, args.task, args.pairs, seed=args.seed)
    entries = args.pair_entries[: args.pairs]
    return [PromptPair(entry.get('task', 'file'), *(entry[key] for key in PAIR_FIELDS)) for entry in entries]


def run(args: argparse.Namespace) -> int:
    """Run ``patching`` with arguments checked by :py:func:`zennit_attn.cli.patching.check`; returns the exit
    status."""
    model, tokenizer = load(args, need_tokenizer_first=False)
    try:
        ids = pair_ids(tokenizer, read_pairs(args, tokenizer))
    except ValueError as error:
        raise CommandError(str(error)) from None
    ids = {key: value.to(args.device) for key, value in ids.items()}
    options = {'method': args.method, 'steps': args.steps, 'span': args.span, 'path': args.path}
    with status(f'relevance patching ({args.method}, {args.steps} steps, span {args.span:g})', not args.quiet):
        scores = relevance_patching(model, components=args.components, direction=args.direction, **options, **ids)
    pairs = ids['clean'].shape[0]
    print(f'Model:       {args.model_spec.label}')
    source = args.task if args.pairs_file is None else args.pairs_file
    clean, corrupted = float(scores.clean.mean()), float(scores.corrupted.mean())
    print(f'Pairs:       {pairs} ({source}), {ids["clean"].shape[1]} tokens')
    print(f'Metric:      logit difference, clean {clean:+.3f}, corrupted {corrupted:+.3f}')
    method = f'{args.method}, {args.steps} steps, span {args.span:g}, {args.path} path'
    print(f'Method:      {method} ({scores.seconds:.2f} s)')
    print(f'Direction:   {args.direction}')
    print()
    print(f'Top-{args.top} components (mean over pairs of the estimated change of the metric, summed over positions):')
    for rank, entry in enumerate(scores.top(args.top), start=1):
        print(f'  {rank:>3}. {entry}')
    if args.reference:
        exact = activation_patching(
            model, components=args.components, progress=not args.quiet, direction=args.direction, **ids
        )
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
