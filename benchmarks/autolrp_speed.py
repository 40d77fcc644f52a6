"""autoLRP 0.2.0 (the operation-level peer, AttnLRP preset) against the fair plain pass of ``benchmarks/speed.py``.

autoLRP (PyPI ``autolrp``, github Wa-lead/autoLRP; not a dependency of zennit-attn) runs LRP on the autograd graph: the
input wrapped as its tensor subclass (``autolrp.tensor``), the model run, ``.lrp(config=...)`` called on the explained
scalar, the relevance read from the input's ``.relevance``. This script times that call with its AttnLRP preset
(``LRPConfig(rule={**BASE, **ATTNLRP})``, as its documentation shows) against the fair plain pass (frozen weights,
``logits_to_keep=1``, input x gradient) in interleaved rounds on a model built as ``speed.py`` builds it, with the
same frozen weights and ``logits_to_keep=1``. Reported per length: the median time of each and the median of the
per-round ratios autoLRP / fair (``speed.py --fair`` gives zennit-attn's, ``lxt_speed.py`` LXT's, on the same models).

Usage (autoLRP importable, e.g. ``pip install --no-deps --target DIR autolrp==0.2.0`` and ``DIR`` on ``PYTHONPATH``)::

    OMP_NUM_THREADS=1 python benchmarks/autolrp_speed.py --models python-bound random-llama --seq 16 128 512
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import autolrp
import speed
import torch
from autolrp import ATTNLRP, BASE, LRPConfig
from speed import build, frozen, pick_target, time_interleaved

#: autoLRP's AttnLRP preset on its base table, as its documentation writes it
CONFIG = LRPConfig(rule={**BASE, **ATTNLRP})


def autolrp_call(model, ids, target):
    """autoLRP's AttnLRP of the explained logit at the last position: relevance per token."""
    with torch.enable_grad():
        inputs = autolrp.tensor(model.get_input_embeddings()(ids).detach())
        logits = model(inputs_embeds=inputs, use_cache=False, logits_to_keep=1).logits
        logits[0, -1, target[0]].lrp(config=CONFIG)
        return inputs.relevance.sum(-1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--models', nargs='+', default=['random-llama'])
    parser.add_argument('--seq', type=int, nargs='+', default=[16])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    speed.RUNNERS['autolrp'] = autolrp_call  # speed.py's loop looks its runners up there (the fair pass among them)
    for name in args.models:
        model, ids, _ = build(name, max(args.seq))
        for seq in args.seq:
            inputs = ids[:, :seq].contiguous()
            target = pick_target(model, inputs)
            with frozen(model):
                timed = time_interleaved(model, inputs, target, args.repeats, args.warmup, ('fair', 'autolrp'))
            base, run = timed['fair']['wall'], timed['autolrp']['wall']
            result = {
                'model': name,
                'seq': seq,
                'time_s': {'fair': statistics.median(base), 'autolrp': statistics.median(run)},
                'time_paired': statistics.median(one / other for other, one in zip(base, run)),
            }
            print(json.dumps(result), flush=True)


if __name__ == '__main__':
    sys.exit(main())
