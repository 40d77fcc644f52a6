"""The run step of ``zennit-attn demo`` (:py:mod:`zennit_attn.cli.demo`): ``explain``'s run
(:py:func:`zennit_attn.cli.runs.explain.explain_and_show`), then the conservation summary and the heatmap file."""

from __future__ import annotations

import argparse

from ...workflows.diagnostics import conservation
from ..loading import make_composite
from .explain import explain_and_show, write_heatmap

__all__ = ['run']


def run(args: argparse.Namespace) -> int:
    """Run the demo with arguments checked by :py:func:`zennit_attn.cli.demo.check`; returns the exit status."""
    model, _, explanation = explain_and_show(args)
    report = conservation(model, explanation.input_ids, composite=make_composite(args.method))
    logit = float(explanation.logit.reshape(-1)[0])
    fraction = float(report.input_fraction[0])
    reached = float(report.sums[-2:, 0].sum())
    print()
    print(f'Conservation: {fraction:.1%} of the logit ({reached:.3f} of {logit:.3f}) reaches the input tokens;')
    if abs(reached - logit) <= 1e-3 * abs(logit):
        print('  nothing is absorbed on the way (run with --report for the per-layer table).')
    else:
        print('  the rest is absorbed (or added) by biases and by the bias term of the softmax rule (Prop. 3.1);')
        print('  run with --report for the per-layer table.')
    if args.report:
        print()
        print(report)
    write_heatmap(args, explanation)
    return 0
