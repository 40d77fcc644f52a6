"""The run step of ``zennit-attn explain-dataset`` (:py:mod:`zennit_attn.cli.explain_dataset`): load the model and
explain the texts into the output folder (:py:func:`zennit_attn.workflows.dataset.explain_dataset`)."""

from __future__ import annotations

import argparse
import os
import time

from ...workflows.dataset import explain_dataset
from ..loading import load, make_composite
from ..printing import method_label

__all__ = ['run']


def run(args: argparse.Namespace) -> int:
    """Run ``explain-dataset`` with arguments checked by :py:func:`zennit_attn.cli.explain_dataset.check`; returns
    the exit status."""
    model, tokenizer = load(args, need_tokenizer_first=args.target is not None)
    composite = {} if args.composite is None else {'composite': make_composite(args.composite)}
    start = time.perf_counter()
    folder = explain_dataset(
        model,
        tokenizer,
        args.texts,
        args.output,
        batch_size=args.batch_size,
        method=args.method,
        target=args.target,
        shard_size=args.shard_size,
        checkpointing=args.checkpointing,
        progress=not args.quiet,
        **composite,
        **args.params,
    )
    if int(os.environ.get('RANK', '0')) == 0:  # one line for the run, also under torchrun
        print(
            f'Explained {len(args.texts)} texts with {method_label(args)} in {time.perf_counter() - start:.1f} s; '
            f'wrote {folder.resolve()}'
        )
    return 0
