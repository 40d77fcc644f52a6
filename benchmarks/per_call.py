"""Where the fixed cost of one ``explain()`` call goes: wall time per phase of the call, next to the fair plain pass.

The fixed cost per call (checks of the model and the input, registering and removing the rules, reading the explained
logit, packaging the result) matters most where the arithmetic is fast: short inputs, GPUs. This script splits one
``explain(model, input_ids, target=target)`` call (``--method attnlrp``, the default composite, or ``cplrp``) into
phases and times each of them in every call, by wrapping the library's functions for the time of the measurement (the
wrappers are removed afterwards; nothing else changes):

- ``task``: :py:func:`zennit_attn.inputs.task.make_task` (checks of the model and the input, the embedding lookup,
  the model facts: :py:mod:`zennit_attn.inputs.checks`, :py:mod:`zennit_attn.inputs.lookups`);
- ``keep logits``, ``leaves``, ``resolve``, ``finish``: the task's steps in :py:func:`zennit_attn.methods.lrp.attribute`
  (the explained positions, the input leaf, the explained logit, the checks and packaging of the result);
- ``engine: register`` / ``engine: remove``: the composite's ``register`` and ``remove`` (canonizers and rules);
- ``forward``: the model's forward pass inside the composite's context (engine and model);
- ``backward``: ``torch.autograd.grad`` (the rules' backward and the model's);
- ``rest``: the call minus the phases above (argument handling in ``explain()`` and ``attribute()``, the default
  composite made and dropped, zennit's context manager).

The fair plain pass (input x gradient with frozen weights and ``logits_to_keep=1``, as in ``benchmarks/speed.py``) is
timed in the same rounds, interleaved with the explained call, split into its forward and backward pass. Medians per
phase over ``--calls`` rounds after ``--warmup`` rounds, and the paired ratio (median over the rounds of the explained
call over the plain pass of its round); the 1-minute load average before and after. ``--profile N`` also prints the
``N`` functions with the largest own time (cProfile, in separate calls) of zennit-attn and zennit.

``--forward-layers`` splits the explained forward pass (the phase ``forward`` above) into the layers of the engine
that each add their cost, by timing the same forward pass (no backward pass, no relevance: the explained model in one
composite context, entered once) in five settings in interleaved rounds (:py:data:`FORWARD_LAYERS`):

- ``plain``: the fair plain forward pass (a frozen copy of the model, no composite);
- ``empty mode``: the same under a :py:class:`torch.overrides.TorchFunctionMode` that only calls each function (the
  price of seeing every torch function call in Python at all);
- ``module hooks``: the explained model with the classifying mode's ``__torch_function__`` a pass-through: the rules
  of modules (normalisations, activations) and the engine's hooks of modules run, no operation is classified (the
  audit's refusals are off: it would refuse the unclassified operations' outputs);
- ``mode preamble``: the mode's ``__torch_function__`` as it is up to the classification (the function's entry, the
  tensors among the arguments, which of them carry relevance, the checks of the forward's state), then each
  relevance-carrying operation run and its output recorded without being classified (no marks, no audit of its
  operands, no rule): what a replayed plan of the classification would still have to do to stay sound;
- ``full``: the engine as it is.

Each setting's median over the rounds, and its difference to the one before it (wrong relevance in the middle
settings does not matter: no backward pass is run). The library's classes are patched for the time of a setting
and restored after it.

Run alone (``OMP_NUM_THREADS=1``)::

    python benchmarks/per_call.py --model random-llama --seq 16 --calls 50
    python benchmarks/per_call.py --model random-llama --seq 16 --method cplrp --profile 25
    python benchmarks/per_call.py --model python-bound --seq 16 --calls 30 --forward-layers
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import cProfile
import functools
import importlib
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import zennit.core
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from speed import build, frozen, pick_target, run_explain, run_plain  # noqa: E402

from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon  # noqa: E402
from zennit_attn.core.audit import Audit  # noqa: E402
from zennit_attn.inputs.task import TokenTask  # noqa: E402
from zennit_attn.operations.classifier import Classifier  # noqa: E402

#: the module of :py:func:`zennit_attn.explain` (the package exports the function under the same name)
EXPLAIN_MODULE = importlib.import_module('zennit_attn.explain')


def composite_classes() -> list[type]:
    """``zennit.core.Composite`` and every subclass of it imported so far (the composites of zennit-attn)."""
    found, stack = [], [zennit.core.Composite]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return found


def phases() -> list[tuple[object, str, str]]:
    """``(owner, attribute, phase)`` of every wrapped callable. A composite's ``register`` and ``remove`` are wrapped
    on every class that defines them (a subclass's calls its base's: only the outermost call is timed)."""
    wrapped = [
        (EXPLAIN_MODULE, 'make_task', 'task'),
        (TokenTask, 'keep_logits', 'keep logits'),
        (TokenTask, 'lrp_leaves', 'leaves'),
        (TokenTask, 'lrp_forward', 'forward'),
        (TokenTask, 'resolve', 'resolve'),
        (TokenTask, 'finish', 'finish'),
        (torch.autograd, 'grad', 'backward'),
    ]
    for cls in composite_classes():
        wrapped += [(cls, name, f'engine: {name}') for name in ('register', 'remove') if name in vars(cls)]
    return wrapped


#: the phases of the explained call, in the order of the report
PHASE_NAMES = (
    'task',
    'keep logits',
    'leaves',
    'engine: register',
    'forward',
    'resolve',
    'backward',
    'engine: remove',
    'finish',
)
#: phases of the plain pass
PLAIN_PHASES = ('plain forward', 'plain backward')


class PhaseClock:
    """Seconds spent in each phase during the current call (:py:meth:`take` ends the call)."""

    def __init__(self):
        self.current: dict[str, float] = collections.defaultdict(float)
        self.active = True
        self.depth: dict[str, int] = collections.defaultdict(int)

    def wrap(self, function, phase: str):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            if not self.active or self.depth[phase]:  # off, or inside a timed call of the same phase
                return function(*args, **kwargs)
            self.depth[phase] += 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.current[phase] += time.perf_counter() - start
                self.depth[phase] -= 1

        return timed

    def take(self) -> dict[str, float]:
        phases, self.current = dict(self.current), collections.defaultdict(float)
        return phases


@contextlib.contextmanager
def wrapped(clock: PhaseClock) -> Iterator[None]:
    """Wrap the callables of :py:func:`phases` with ``clock`` for the time of the context."""
    saved = []
    try:
        for owner, name, phase in phases():
            own = name in vars(owner)  # a method the class defines itself (else inherited: remove the wrapper after)
            original = getattr(owner, name)
            saved.append((owner, name, own, vars(owner).get(name)))
            setattr(owner, name, clock.wrap(original, phase))
        yield
    finally:
        for owner, name, own, original in reversed(saved):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


def plain_phases(model, input_ids, target, clock: PhaseClock) -> None:
    """The fair plain pass (frozen weights, ``logits_to_keep=1``), its forward and backward pass timed apart."""
    embeddings = model.get_input_embeddings()
    with torch.enable_grad(), frozen(model):
        start = time.perf_counter()
        leaf = embeddings(input_ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=leaf, use_cache=False, logits_to_keep=1).logits
        logit = logits[:, -1][torch.arange(len(target)), target]
        middle = time.perf_counter()
        clock.active = False  # torch.autograd.grad is wrapped: this is the plain pass's
        try:
            (grad,) = torch.autograd.grad(logit, leaf, grad_outputs=torch.ones_like(logit))
        finally:
            clock.active = True
        end = time.perf_counter()
    (leaf * grad).sum(-1)
    clock.current['plain forward'] += middle - start
    clock.current['plain backward'] += end - middle


def measure(model, input_ids, target, method: str, calls: int, warmup: int) -> dict:
    """Per-phase seconds of ``calls`` explained calls and fair plain passes, interleaved."""
    clock = PhaseClock()
    rounds = []
    with wrapped(clock):
        for index in range(warmup + calls):
            spent = one_round(model, input_ids, target, method, clock)
            if index >= warmup:
                rounds.append(spent)
    return {
        key: statistics.median(spent.get(key, 0.0) for spent in rounds)
        for key in [*PHASE_NAMES, 'rest', 'explain()', *PLAIN_PHASES, 'plain pass']
    } | {'paired ratio': statistics.median(spent['explain()'] / spent['plain pass'] for spent in rounds)}


def one_round(model, input_ids, target, method: str, clock: PhaseClock) -> dict[str, float]:
    """Seconds per phase of one explained call and one fair plain pass after it; ``rest``: the explained call
    outside its phases."""
    start = time.perf_counter()
    run_explain(model, input_ids, target, method=method)
    total = time.perf_counter() - start
    spent = clock.take()
    spent['rest'] = total - sum(spent.values())
    start = time.perf_counter()
    plain_phases(model, input_ids, target, clock)
    plain = time.perf_counter() - start
    spent.update(clock.take())
    spent['explain()'], spent['plain pass'] = total, plain
    return spent


def profile(model, input_ids, target, method: str, calls: int, top: int) -> str:
    """cProfile's table of the ``top`` functions of zennit-attn and zennit with the largest own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        run_explain(model, input_ids, target, method=method)
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats('tottime').print_stats(r'zennit', top)
    return stream.getvalue()


#: the settings of ``--forward-layers``, each adding one layer of the engine to the one before it
FORWARD_LAYERS = ('plain', 'empty mode', 'module hooks', 'mode preamble', 'full')
#: the composite of each ``--method``
COMPOSITES = {'attnlrp': AttnLRPEpsilon, 'cplrp': CPLRPEpsilon}


class EmptyMode(TorchFunctionMode):
    """A torch function mode that only calls each function."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _pass_through(mode, func, types, args=(), kwargs=None):
    """The classifying mode's ``__torch_function__`` made a pass-through (setting ``module hooks``)."""
    return func(*args, **(kwargs or {}))


def _unclassified(mode, func, name, entry, args, kwargs, carrying, fast, changes, tensors):
    """The classifying mode's ``classified`` without the classification (setting ``mode preamble``): the function
    run, its output recorded as the engine's."""
    output = func(*args, **kwargs)
    mode.state.audit.record(output)
    return output


def _unchecked(audit, *args, **kwargs) -> None:
    """The audit's refusal of operands it did not see produced, off (the operations are not classified)."""


#: setting -> the library's class attributes replaced for its time
FORWARD_PATCHES = {
    'module hooks': {
        (Classifier, '__torch_function__'): _pass_through,
        (Audit, 'refusal'): _unchecked,
    },
    'mode preamble': {(Classifier, 'classified'): _unclassified, (Audit, 'refusal'): _unchecked},
}


@contextlib.contextmanager
def patched(setting: str) -> Iterator[None]:
    """The class attributes of :py:data:`FORWARD_PATCHES` of ``setting`` replaced for the time of the context."""
    replaced = FORWARD_PATCHES.get(setting, {})
    saved = {key: vars(key[0])[key[1]] for key in replaced}
    try:
        for (owner, name), value in replaced.items():
            setattr(owner, name, value)
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)


def forward_layers(model, input_ids, method: str, calls: int, warmup: int) -> dict[str, float]:
    """Median seconds of the explained forward pass in each setting of :py:data:`FORWARD_LAYERS` over ``calls``
    interleaved rounds after ``warmup`` (see the module's description)."""
    plain = copy.deepcopy(model)
    plain.requires_grad_(False)
    embeddings = model.get_input_embeddings()(input_ids).detach()

    def forward(module, mode) -> None:
        leaf = embeddings.clone().requires_grad_(True)
        with mode:
            module(inputs_embeds=leaf, use_cache=False, logits_to_keep=1)

    spent: dict[str, list[float]] = {setting: [] for setting in FORWARD_LAYERS}
    with torch.enable_grad(), COMPOSITES[method]().context(model) as explained:
        for index in range(warmup + calls):
            for setting in FORWARD_LAYERS:
                module = plain if setting in ('plain', 'empty mode') else explained
                mode = EmptyMode() if setting == 'empty mode' else contextlib.nullcontext()
                with patched(setting):
                    start = time.perf_counter()
                    forward(module, mode)
                    took = time.perf_counter() - start
                if index >= warmup:
                    spent[setting].append(took)
    return {setting: statistics.median(times) for setting, times in spent.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--model',
        default='random-llama',
        choices=('random-llama', 'python-bound', 'random-mixtral', 'random-hybrid', 'smollm2'),
    )
    parser.add_argument('--seq', type=int, default=16)
    parser.add_argument('--method', default='attnlrp', choices=('attnlrp', 'cplrp'), help='default attnlrp')
    parser.add_argument('--calls', type=int, default=50, help='timed rounds (default 50)')
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--threads', type=int, default=1, help='torch.set_num_threads (default 1)')
    parser.add_argument('--profile', type=int, default=0, metavar='N', help='also print cProfile top N (own time)')
    parser.add_argument(
        '--forward-layers', action='store_true', help="also split the explained forward pass into the engine's layers"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, input_ids, _ = build(args.model, args.seq)
    target = pick_target(model, input_ids)
    run_plain(model, input_ids, target, keep_last=True)
    load_before = os.getloadavg()
    medians = measure(model, input_ids, target, args.method, args.calls, args.warmup)
    load_after = os.getloadavg()
    print(
        f'{args.model}, {args.seq} tokens, method {args.method}, {torch.get_num_threads()} thread(s), '
        f'median of {args.calls} interleaved rounds; load average (1, 5, 15 min) '
        f'{", ".join(f"{value:.2f}" for value in load_before)} -> {", ".join(f"{value:.2f}" for value in load_after)}'
    )
    for key, value in medians.items():
        print(f'  {key:18s} {value:.3f}x' if key == 'paired ratio' else f'  {key:18s} {value * 1e3:8.3f} ms')
    if args.forward_layers:
        load_before = os.getloadavg()
        layers = forward_layers(model, input_ids, args.method, args.calls, args.warmup)
        load_after = os.getloadavg()
        print(
            f'the explained forward pass in layers ({args.calls} interleaved rounds; load average '
            f'{load_before[0]:.2f} -> {load_after[0]:.2f}): median, and its difference to the setting before it'
        )
        previous = None
        for setting, value in layers.items():
            added = '' if previous is None else f'  {(value - previous) * 1e3:+8.3f} ms'
            print(f'  {setting:18s} {value * 1e3:8.3f} ms{added}')
            previous = value
    if args.profile:
        print(profile(model, input_ids, target, args.method, max(args.calls // 2, 5), args.profile))


if __name__ == '__main__':
    main()
