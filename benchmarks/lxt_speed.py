"""The authors' AttnLRP code (LXT, efficient mode) against the fair plain pass of ``benchmarks/speed.py``.

LXT's efficient mode (``lxt.efficient.monkey_patch``; github rachtibat/LRP-eXplains-Transformers, not a dependency of
zennit-attn) replaces the forward methods of transformers' Llama classes and the attention functions of transformers'
registry, process-wide (``random-qwen3-moe``: those of Qwen3-MoE, its experts run in a loop of its own); for a ViT
(``--models torchvision-vit``: torchvision's ``vit_b_16``, the model LXT's ViT example explains) it replaces the forward
methods of ``torch.nn``'s GELU, LayerNorm and MultiheadAttention and zennit's ``BasicHook``, and its example registers
zennit's ``Gamma`` on the linear layers (0.05) and the patch convolution (0.25) for each call (:py:func:`vit_patch`,
:py:func:`runners`). This script runs it in a process of its own (never beside zennit-attn) on a model built as
``speed.py`` builds it (a Llama shape of :py:data:`speed.PAPER_SHAPES`, ``random-llama``, ``python-bound``,
``random-qwen3-moe`` or ``torchvision-vit``, seeded), and times it against the fair plain pass (frozen weights,
``logits_to_keep=1``, input x gradient) in interleaved rounds: the patched and the original methods are kept side by
side and put in place before each call (:py:class:`Patched`), so that both passes run in the same process on the same
model, round after round.

LXT's call is what its documentation shows for the efficient mode: the embeddings as a leaf, the forward, the
backward of the logit, relevance ``(embeddings * gradient).sum(-1)``, here with the same frozen weights and
``logits_to_keep=1`` as the fair pass. Reported per length: the median time of each, the median of the per-round
ratios LXT / fair, and on a GPU the peak of the memory allocated during each call.

``--rss`` (CPU) also measures the peak resident memory of each call in a fresh process per call kind, as
``speed.py --rss-child`` does for ``explain()`` (:py:func:`speed.rss_child`: the increase of the peak RSS over the RSS
before the call, of the first call of the process and of ``--rss-repeats`` calls after it), so that the first call and
the steady state of LXT, of the fair pass and of zennit-attn compare (``speed.py --rss-child MODEL explain``).

Usage (LXT importable, e.g. its checkout on ``PYTHONPATH``)::

    python benchmarks/lxt_speed.py --models llama2-7b --seq 512 2048 --device cuda --dtype bfloat16 --repeats 10
    python benchmarks/lxt_speed.py --models random-llama --seq 16 512 --threads 1 --repeats 9 --rss --rss-repeats 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import speed
import torch
from lxt.efficient import monkey_patch, monkey_patch_zennit
from speed import build, frozen, pick_target, run_plain, synchronize, time_interleaved
from torchvision.models import vision_transformer
from transformers.models.llama import modeling_llama
from transformers.models.qwen3_moe import modeling_qwen3_moe
from zennit.composites import LayerMapComposite
from zennit.core import BasicHook
from zennit.rules import Gamma

#: the value of an attribute that a patch adds (``original_forward``): deleted again when the original is put back
_ABSENT = object()
#: the gammas of the paper's ViT composite (as :py:class:`zennit_attn.composites.AttnLRPGamma`): the linear layers,
#: the patch embedding's convolution
VIT_GAMMAS = {'linear': 0.05, 'conv': 0.25}


class Patched:
    """A process-wide patch of LXT, switched on and off: the attributes it replaces (``(owner, name)``) and the
    entries of a registry, kept in both states (:py:meth:`apply` puts one state in place)."""

    def __init__(self, attributes: list[tuple[object, str]], patch, registry: dict | None = None):
        self.attributes = attributes
        self.registry = registry
        self.original = self.state()
        patch()
        self.patched = self.state()
        self.apply(False)

    def state(self) -> dict:
        """What the patch changes, as it is now."""
        state = {key: vars(key[0]).get(key[1], _ABSENT) for key in self.attributes}
        state['registry'] = {} if self.registry is None else dict(self.registry.items())
        return state

    def apply(self, patched: bool) -> None:
        """Put LXT's patch (``patched``) or the original methods in place."""
        state = self.patched if patched else self.original
        for (owner, name), value in ((key, state[key]) for key in self.attributes):
            if value is _ABSENT:
                if name in vars(owner):
                    delattr(owner, name)
            else:
                setattr(owner, name, value)
        for key, value in state['registry'].items():
            self.registry[key] = value


def llama_patch() -> Patched:
    """LXT's patch of transformers' Llama module (its efficient mode's default map)."""
    attributes = [
        (modeling_llama.LlamaMLP, 'forward'),
        (modeling_llama.LlamaRMSNorm, 'forward'),
        (torch.nn.Dropout, 'forward'),
        (modeling_llama, 'eager_attention_forward'),
    ]
    return Patched(attributes, lambda: monkey_patch(modeling_llama), modeling_llama.ALL_ATTENTION_FUNCTIONS)


def vit_patch() -> Patched:
    """LXT's patch of torchvision's vision transformer (GELU, LayerNorm and ``MultiheadAttention`` of ``torch.nn``,
    CP-LRP inside the attention) and of zennit's ``BasicHook`` (its rules in the gradient x input form), as its
    example ``examples/vit_torch.py`` applies them."""
    attributes = [
        (owner, name)
        for owner in (torch.nn.GELU, torch.nn.LayerNorm, torch.nn.MultiheadAttention)
        for name in ('forward', 'original_forward')
    ]
    attributes += [(BasicHook, 'forward'), (BasicHook, 'backward')]

    def patch():
        monkey_patch(vision_transformer)
        monkey_patch_zennit()

    return Patched(attributes, patch)


def qwen3_moe_patch() -> Patched:
    """LXT's patch of transformers' Qwen3-MoE module (its efficient mode's default map: the experts run in a loop of
    its own)."""
    attributes = [
        (modeling_qwen3_moe.Qwen3MoeMLP, 'forward'),
        (modeling_qwen3_moe.Qwen3MoeExperts, 'forward'),
        (modeling_qwen3_moe.Qwen3MoeRMSNorm, 'forward'),
        (torch.nn.Dropout, 'forward'),
        (modeling_qwen3_moe, 'eager_attention_forward'),
    ]
    return Patched(attributes, lambda: monkey_patch(modeling_qwen3_moe), modeling_qwen3_moe.ALL_ATTENTION_FUNCTIONS)


#: the module of a model's class -> the name of LXT's patch for it (:py:func:`runners`)
PATCHES = {
    modeling_llama.__name__: 'llama',
    modeling_qwen3_moe.__name__: 'qwen3_moe',
    vision_transformer.__name__: 'vit',
}


def runners(patches: dict[str, Patched]) -> dict:
    """The two timed calls: the fair plain pass on the original methods, LXT's on the patched ones (``patches``: by
    :py:data:`PATCHES`' names). A language model: the same code (input x gradient of the explained logit, weights
    frozen by the caller). The ViT: its example's call, zennit's ``Gamma`` on the linear layers and the patch
    convolution (:py:data:`VIT_GAMMAS`) registered for the call (``LayerMapComposite``), input x gradient at the
    pixels."""

    def fair(model, inputs, target):
        for patch in patches.values():
            patch.apply(False)
        return run_plain(model, inputs, target, keep_last=True)

    def lxt(model, inputs, target):
        name = PATCHES.get(type(model).__module__)
        if name is None:
            raise ValueError(f'LXT has no patch for {type(model).__name__} here; known: {sorted(PATCHES.values())}')
        patch = patches[name]
        patch.apply(True)
        try:
            if not isinstance(inputs, speed.Pixels):
                return run_plain(model, inputs, target, keep_last=True)
            composite = LayerMapComposite(
                [(torch.nn.Conv2d, Gamma(VIT_GAMMAS['conv'])), (torch.nn.Linear, Gamma(VIT_GAMMAS['linear']))]
            )
            with composite.context(model) as modified:
                return run_plain(modified, inputs, target, keep_last=True)
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
    parser.add_argument('--rss', action='store_true', help='also the peak RSS of each call kind (fresh processes)')
    parser.add_argument('--rss-repeats', type=int, default=3, help='calls after the first in each RSS process')
    parser.add_argument('--rss-child', nargs=2, metavar=('MODEL', 'METHOD'), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    patches = {'llama': llama_patch(), 'qwen3_moe': qwen3_moe_patch(), 'vit': vit_patch()}
    speed.RUNNERS.update(runners(patches))  # speed.py's measurement loop looks its runners up there
    speed.FROZEN = speed.FROZEN | {'lxt'}  # LXT's call runs with the weights frozen, as the fair pass does
    if args.rss_child:
        name, method = args.rss_child
        print(json.dumps(speed.rss_child(name, method, args.seq[0], args.rss_repeats, args.threads)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for name in args.models:
        model, ids, description = build(name, max(args.seq), getattr(torch, args.dtype), args.device, args.layers)
        for seq in args.seq:
            inputs = ids if isinstance(ids, speed.Pixels) else ids[:, :seq].contiguous()  # an image: one size
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
            if args.rss:
                rss = {
                    key: speed.rss_in_subprocess(name, key, seq, args.rss_repeats, args.threads, __file__)
                    for key in ('fair', 'lxt')
                }
                result['rss_first_increase_bytes'] = {key: rss[key]['first'] for key in rss}
                result['rss_increase_bytes'] = {key: statistics.median(rss[key]['increases']) for key in rss}
            results.append(result)
            print(json.dumps({key: result[key] for key in result if key != 'time_all_s'}), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({'torch': torch.__version__, 'results': results}, indent=2))


if __name__ == '__main__':
    sys.exit(main())
