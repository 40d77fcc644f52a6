"""The run step of ``zennit-attn faithfulness`` (:py:mod:`zennit_attn.cli.faithfulness`): load the explanations and the
model, score them by input perturbation, print the scores and write the ``--csv`` table."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from tqdm.auto import tqdm

from ...workflows.dataset import check_fingerprint, load_explanations
from ...workflows.evaluation import Faithfulness, token_curves
from ..loading import load

__all__ = ['write_table', 'run']


def write_table(path: Path, rows: list[dict], modes: tuple[str, ...]) -> None:
    """The ``--csv`` table: one row per text and mode with the score, both areas and both curves."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open('w', newline='') as handle:
        writer = csv.writer(handle)
        writer.writerow(['text', 'mode', 'score', 'area_morf', 'area_lerf', 'morf', 'lerf'])
        for index, row in enumerate(rows):
            for mode in modes:
                curve = row[mode]
                writer.writerow(
                    [
                        index,
                        mode,
                        curve.score,
                        curve.area_morf,
                        curve.area_lerf,
                        ' '.join(f'{v:.6g}' for v in curve.morf.tolist()),
                        ' '.join(f'{v:.6g}' for v in curve.lerf.tolist()),
                    ]
                )


def run(args: argparse.Namespace) -> int:
    """Run ``faithfulness`` with arguments checked by :py:func:`zennit_attn.cli.faithfulness.check`; returns the exit
    status."""
    explanations = load_explanations(args.explanations)
    model, _ = load(args, need_tokenizer_first=False)
    check_fingerprint(args.explanations, model)
    modes = tuple(args.mode)
    rows = []
    for explanation in tqdm(explanations, desc='perturbation', unit='text', disable=args.quiet):
        rows.append(token_curves(model, explanation, steps=args.steps, mode=modes, batch_size=args.batch_size))
    print(
        f'{len(rows)} texts explained by {explanations[0].method if explanations else "?"}, {args.steps} steps; '
        'score: flipping A_LeRF - A_MoRF, insertion A_MoRF - A_LeRF (larger is more faithful)'
    )
    print(f'{"mode":<10} {"score (mean +- s.e.)":>22} {"A_MoRF":>9} {"A_LeRF":>9}')
    for mode in modes:
        summary = Faithfulness.of([row[mode] for row in rows])
        print(
            f'{mode:<10} {f"{summary.score:.4f} +- {summary.sem:.4f}":>22} {summary.area_morf:>9.4f} '
            f'{summary.area_lerf:>9.4f}'
        )
    if args.csv is not None:
        write_table(args.csv, rows, modes)
        print(f'wrote {args.csv.resolve()}')
    return 0
