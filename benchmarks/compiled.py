"""``explain()`` and ``torch.compile``: what works, and its time against the compiled fair plain pass (CPU, inductor).

``explain()`` refuses a compiled model (:py:func:`zennit_attn.composites.refuse_compiled`: compiled code would
bypass hooks registered after it was traced). This script measures the ways around that the library could take, on the
model and input of ``benchmarks/speed.py`` (``random-llama`` by default), without changing the library:

1. ``explain(torch.compile(model))``: the refusal's message.
2. *Compiled inside the context*: the composite registered once (``with composite.context(model) as modified``),
   ``torch.compile(modified)`` inside it, and LRP computed through the compiled module as
   :py:func:`zennit_attn.methods.lrp.attribute` computes it (the explained logit as the initial relevance, the
   gradient at the embeddings is their relevance). Checked: the relevance equals ``explain()``'s; counted: the
   graphs and graph breaks TorchDynamo makes (``torch._dynamo.explain``) and their first reasons.
3. *Compiled once, rules registered per call* (what ``explain(model)`` on a compiled model would do): the model
   compiled once, the composite's context entered anew for each call around the compiled module; the time of each of
   the first calls shows whether TorchDynamo recompiles (new hooks, new modules of the canonizers in every call).
4. Time, interleaved rounds after warm-up (``--repeats``): the fair plain pass (frozen weights, ``logits_to_keep=1``)
   eager and compiled, ``explain()``, and the explained pass of 2. eager and compiled (one context for all rounds; the
   plain passes and ``explain()`` run on a copy of the model, which holds no rules); medians, and the median of the
   per-round ratios to the compiled fair pass and to the eager one; the 1-minute load average before and after. The
   explained pass without the per-call work of ``explain()`` (checks, registering the rules) bounds what compiling the
   explained pass alone could give.

Run alone (``OMP_NUM_THREADS=1``; each compilation takes seconds to minutes on a CPU)::

    python benchmarks/compiled.py --seq 16 --repeats 15
    python benchmarks/compiled.py --seq 16 --method cplrp   # CPLRPEpsilon()
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed import build, frozen, pick_target  # noqa: E402

from zennit_attn import explain  # noqa: E402
from zennit_attn.composites import AttnLRPEpsilon, CompiledModelError, CPLRPEpsilon  # noqa: E402


def fair_pass(module, embeddings: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Input x gradient through ``module`` (run with frozen weights): the fair plain pass."""
    leaf = embeddings.clone().requires_grad_(True)
    logits = module(inputs_embeds=leaf, use_cache=False, logits_to_keep=1).logits
    logit = logits[:, -1][torch.arange(len(target)), target]
    (grad,) = torch.autograd.grad(logit, leaf, grad_outputs=torch.ones_like(logit))
    return (leaf * grad).sum(-1).detach()


def explained_pass(module, embeddings: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """LRP through ``module``, a model inside a composite's context (compiled or not), as ``explain()`` computes it:
    the explained logit is the initial relevance, the gradient at the embeddings their relevance (the root's
    ``RelevanceBoundary`` converts)."""
    leaf = embeddings.clone().requires_grad_(True)
    logits = module(inputs_embeds=leaf.clone(), use_cache=False, logits_to_keep=1).logits
    logit = logits[:, -1].gather(-1, target[:, None].to(logits.device))[:, 0]
    (grad,) = torch.autograd.grad(logit, leaf, grad_outputs=logit.detach())
    return grad.sum(-1).detach()


def first_call(function) -> tuple[float, object]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def graph_breaks(modified, embeddings: torch.Tensor) -> dict:
    """TorchDynamo's graphs and graph breaks of the explained forward pass (``torch._dynamo.explain``)."""
    leaf = embeddings.clone().requires_grad_(True)
    report = torch._dynamo.explain(modified)(inputs_embeds=leaf, use_cache=False, logits_to_keep=1)
    reasons = [' '.join(str(reason.reason).split())[:240] for reason in report.break_reasons]
    return {'graphs': report.graph_count, 'graph breaks': report.graph_break_count, 'first reasons': reasons[:5]}


def per_call_registration(model, composite_factory, embeddings, target, calls: int = 3) -> list[float]:
    """Seconds of each of ``calls`` calls that enter a new composite's context around a model compiled once."""
    compiled = torch.compile(model)
    seconds = []
    for _ in range(calls):
        with composite_factory().context(model):
            seconds.append(first_call(lambda: explained_pass(compiled, embeddings, target))[0])
    return seconds


def interleaved(calls: dict, repeats: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds of each of ``calls`` (name -> ``(context, call)``; the context entered before the clock starts), run
    alternately, ``repeats`` rounds after ``warmup`` rounds."""
    times = {name: [] for name in calls}
    for index in range(warmup + repeats):
        for name, (context, call) in calls.items():
            with context():
                start = time.perf_counter()
                call()
                seconds = time.perf_counter() - start
            if index >= warmup:
                times[name].append(seconds)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='random-llama', choices=('random-llama', 'random-mixtral'))
    parser.add_argument('--seq', type=int, default=16)
    parser.add_argument('--repeats', type=int, default=15)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument(
        '--method', default='attnlrp', choices=('attnlrp', 'cplrp'), help='the composite (default attnlrp)'
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, input_ids, _ = build(args.model, args.seq)
    plain = copy.deepcopy(model)  # the plain passes and explain() run on a copy: the model holds the rules
    target = pick_target(model, input_ids)
    embeddings = model.get_input_embeddings()(input_ids).detach()

    def composite():
        return CPLRPEpsilon() if args.method == 'cplrp' else AttnLRPEpsilon()

    def explained():
        return explain(plain, input_ids, target=target, method=args.method, composite=composite()).relevance

    reference = explained()
    report = {'model': args.model, 'seq': args.seq, 'method': args.method}
    try:
        explain(torch.compile(plain), input_ids, target=target)
    except CompiledModelError as error:
        report['explain(torch.compile(model))'] = f'{type(error).__name__}: {str(error)[:160]}...'
    compiled_plain = torch.compile(plain)
    with frozen(plain):
        report['compile fair pass s'] = first_call(lambda: fair_pass(compiled_plain, embeddings, target))[0]
    with composite().context(model) as modified:
        report['dynamo'] = graph_breaks(modified, embeddings)
        compiled_modified = torch.compile(modified)
        seconds, relevance = first_call(lambda: explained_pass(compiled_modified, embeddings, target))
        report['compile explained pass s'] = seconds
        report['relevance max abs difference to explain()'] = float((relevance - reference).abs().max())
        report['relevance max abs'] = float(reference.abs().max())
        load_before = os.getloadavg()[0]
        times = interleaved(
            {
                'fair pass, eager': (lambda: frozen(plain), lambda: fair_pass(plain, embeddings, target)),
                'fair pass, compiled': (lambda: frozen(plain), lambda: fair_pass(compiled_plain, embeddings, target)),
                'explain()': (contextlib.nullcontext, explained),
                'explained pass, eager': (
                    contextlib.nullcontext,
                    lambda: explained_pass(modified, embeddings, target),
                ),
                'explained pass, compiled': (
                    contextlib.nullcontext,
                    lambda: explained_pass(compiled_modified, embeddings, target),
                ),
            },
            args.repeats,
        )
    report['load average 1 min'] = [load_before, os.getloadavg()[0]]
    torch._dynamo.reset()
    report['per-call registration, seconds of the first calls'] = per_call_registration(
        model, composite, embeddings, target
    )
    print_report(report, times)


def print_report(report: dict, times: dict[str, list[float]]) -> None:
    for key, value in report.items():
        print(f'{key}: {value}')
    compiled, eager = times['fair pass, compiled'], times['fair pass, eager']
    for name, values in times.items():
        paired = ''
        if not name.startswith('fair'):
            paired = (
                f'; per round / compiled fair {statistics.median(v / c for v, c in zip(values, compiled)):.3f}x'
                f', / eager fair {statistics.median(v / e for v, e in zip(values, eager)):.3f}x'
            )
        print(f'{name:26s} median {statistics.median(values) * 1e3:8.2f} ms{paired}')


if __name__ == '__main__':
    main()
