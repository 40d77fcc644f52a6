"""The authors' AttnLRP code (LXT, efficient mode) against the fair plain pass of ``benchmarks/speed.py``.

LXT's efficient mode (``lxt.efficient.monkey_patch``; github rachtibat/LRP-eXplains-Transformers, not a dependency of
zennit-attn) replaces the forward methods of transformers' Llama classes and the attention functions of
transformers' registry, process-wide. This script runs it in a process of its own (never beside zennit-attn) on a
model built as ``speed.py`` builds it (a Llama shape of :py:data:`speed.PAPER_SHAPES` or ``random-llama``, seeded),
and times it against the fair plain pass (frozen weights, ``logits_to_keep=1``, input x gradient) in interleaved
rounds: the patched and the original methods are kept side by side and put in place before each call
(:py:class:`Patched`), so that both passes run in the same process on the same model, round after round.

LXT's call is what its documentation shows for the efficient mode: the embeddings as a leaf, the forward, the
backward of the logit, relevance ``(embeddings * gradient).sum(-1)``, here with the same frozen weights and
``logits_to_keep=1`` as the fair pass. Reported per length: the median time of each, the median of the per-round
ratios LXT / fair, and on a GPU the peak of the memory allocated during each call.

Usage (LXT importable, e.g. its checkout on ``PYTHONPATH``)::

    python benchmarks/lxt_speed.py --models llama2-7b --seq 512 2048 --device cuda --dtype bfloat16 --repeats 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import speed
import torch
from lxt.efficient import monkey_patch
from speed import build, frozen, pick_target, run_plain, synchronize, time_interleaved
from transformers.models.llama import modeling_llama


class Patched:
    """LXT's patch of transformers' Llama module, switched on and off: the class attributes and registry entries it
    replaces, kept in both states (:py:meth:`apply` puts one state in place)."""

    def __init__(self):
        self.original = self.state()
        monkey_patch(modeling_llama)
        self.patched = self.state()
        self.apply(False)

    @staticmethod
    def state() -> dict:
        """What LXT's patch of Llama changes, as it is now."""
        return {
            'mlp': modeling_llama.LlamaMLP.forward,
            'norm': modeling_llama.LlamaRMSNorm.forward,
            'dropout': torch.nn.Dropout.forward,
            'eager': modeling_llama.eager_attention_forward,
            'registry': dict(modeling_llama.ALL_ATTENTION_FUNCTIONS.items()),
        }

    def apply(self, patched: bool) -> None:
        """Put LXT's patch (``patched``) or the original methods in place."""
        state = self.patched if patched else self.original
        modeling_llama.LlamaMLP.forward = state['mlp']
        modeling_llama.LlamaRMSNorm.forward = state['norm']
        torch.nn.Dropout.forward = state['dropout']
        modeling_llama.eager_attention_forward = state['eager']
        for key, value in state['registry'].items():
            modeling_llama.ALL_ATTENTION_FUNCTIONS[key] = value


def runners(patch: Patched) -> dict:
    """The two timed calls: the fair plain pass on the original methods, LXT's AttnLRP on the patched ones (the
    same code: input x gradient of the explained logit, weights frozen by the caller)."""

    def fair(model, ids, target):
        patch.apply(False)
        return run_plain(model, ids, target, keep_last=True)

    def lxt(model, ids, target):
        patch.apply(True)
        try:
            return run_plain(model, ids, target, keep_last=True)
        finally:
            patch.apply(False)

    return {'fair': fair, 'lxt': lxt}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--models', nargs='+', default=['random-llama'])
    parser.add_argument('--seq', type=int, nargs='+', default=[512])
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32')
    parser.add_argument('--layers', type=int, default=None)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument('--json', type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    speed.RUNNERS.update(runners(Patched()))  # speed.py's measurement loop looks its runners up there
    results = []
    for name in args.models:
        model, ids, description = build(name, max(args.seq), getattr(torch, args.dtype), args.device, args.layers)
        for seq in args.seq:
            inputs = ids[:, :seq].contiguous()
            target = pick_target(model, inputs)
            with frozen(model):
                timed = time_interleaved(model, inputs, target, args.repeats, args.warmup, ('fair', 'lxt'))
            synchronize(inputs)
            fair, lxt = timed['fair']['wall'], timed['lxt']['wall']
            result = {
                'model': name,
                'seq': seq,
                'input': description,
                'time_s': {'fair': statistics.median(fair), 'lxt': statistics.median(lxt)},
                'time_paired': statistics.median(run / base for base, run in zip(fair, lxt)),
                'time_all_s': {'fair': fair, 'lxt': lxt},
            }
            if timed['fair']['peak']:
                result['cuda_peak_bytes'] = {key: statistics.median(timed[key]['peak']) for key in ('fair', 'lxt')}
            results.append(result)
            print(json.dumps({key: result[key] for key in result if key != 'time_all_s'}), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({'torch': torch.__version__, 'results': results}, indent=2))


if __name__ == '__main__':
    sys.exit(main())
