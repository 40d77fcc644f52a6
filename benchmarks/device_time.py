"""On a GPU: how much of one call is the host's work and how much the device's, for the fair plain pass and for
``explain()`` (issue 41).

A GPU computes asynchronously: the host (Python, dispatch, the kernel launches) queues the kernels and the device runs
them while the host goes on. A call whose host work takes longer than its kernels is *host-bound*: its time is the
host's, and what the host does per torch operation is what the user pays, not the arithmetic. This script measures,
for each call kind (``fair``: the fair plain pass of ``benchmarks/speed.py``; ``explain``: the default composite,
AttnLRP; ``cplrp``: ``method='cplrp'``) on a model of :py:data:`speed.PAPER_SHAPES` (random weights, seeded):

- ``host_ms``: the time until the call returns to Python, without waiting for the device (the host's work, plus any
  wait the call itself forces: a host synchronisation inside the call makes it wait for the kernels queued before it);
- ``wall_ms``: the time until the device has finished too (``torch.cuda.synchronize``); ``wall_ms`` close to
  ``host_ms`` means the device waited for the host;
- ``kernel_ms``: the sum of the device time of all kernels of one call (``torch.profiler``, CUDA activity), the time
  the call would take if the host were infinitely fast; ``kernels``: their number;
- ``syncs``: the calls of the profiled call that make the host wait for the device (``aten::item``,
  ``aten::is_nonzero``, ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``; the fair pass's own: the synchronisation
  after the call and the target's lookup).

Medians of ``--repeats`` calls of each kind after 2 warm-up calls (not interleaved: the host times are what is
compared, and those do not drift with the device's clocks); one further call under the profiler. The profiler's own
tables (largest self device time, largest self host time) are written beside the JSON with ``--tables``.

    python benchmarks/device_time.py --model llama2-7b --seq 16 512 --json docs/results/speed/h200_device_time.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from speed import PAPER_SHAPES, build, frozen, pick_target, run_explain, run_plain
from torch.profiler import ProfilerActivity, profile

#: the profiler's events that make the host wait for the device
SYNCS = ('aten::item', 'aten::is_nonzero', 'cudaStreamSynchronize', 'cudaDeviceSynchronize')


def calls(model, input_ids, target) -> dict:
    """The call kinds measured: the fair plain pass and ``explain()`` with AttnLRP and with CP-LRP."""
    return {
        'fair': lambda: run_plain(model, input_ids, target, keep_last=True),
        'explain': lambda: run_explain(model, input_ids, target),
        'cplrp': lambda: run_explain(model, input_ids, target, method='cplrp'),
    }


def host_and_wall(call, repeats: int) -> tuple[float, float]:
    """Median milliseconds until ``call`` returns (the host) and until the device has finished too (the wall)."""
    host, wall = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        returned = time.perf_counter()
        torch.cuda.synchronize()
        host.append((returned - start) * 1e3)
        wall.append((time.perf_counter() - start) * 1e3)
    return statistics.median(host), statistics.median(wall)


def profiled(call) -> tuple[dict, torch.autograd.profiler_util.EventList]:
    """The device time of all kernels of one call, their number and the synchronising calls (see the module's
    description), and the profiler's averages."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        call()
        torch.cuda.synchronize()
    averages = profiler.key_averages()
    kernels = [event for event in averages if event.device_type == torch.autograd.DeviceType.CUDA]
    return {
        'kernel_ms': sum(event.self_device_time_total for event in kernels) / 1e3,
        'kernels': sum(event.count for event in kernels),
        'syncs': {event.key: event.count for event in averages if event.key in SYNCS},
    }, averages


def measure(name: str, seq: int, repeats: int, tables: Path | None) -> dict:
    """The figures of the module's description for each call kind on ``name`` at ``seq`` tokens (bfloat16)."""
    model, input_ids, description = build(name, seq, torch.bfloat16, 'cuda')
    target = pick_target(model, input_ids)
    result = {'model': name, 'seq': seq, 'input': description}
    with frozen(model):
        for kind, call in calls(model, input_ids, target).items():
            host_and_wall(call, 2)
            host, wall = host_and_wall(call, repeats)
            figures, averages = profiled(call)
            result[kind] = {'host_ms': host, 'wall_ms': wall, **figures}
            print(f'{name} {seq} {kind}: {result[kind]}', flush=True)
            if tables is not None:
                text = averages.table(sort_by='self_device_time_total', row_limit=30)
                text += '\n\n' + averages.table(sort_by='self_cpu_time_total', row_limit=30)
                (tables / f'device_time_{name}_{seq}_{kind}.txt').write_text(text)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', choices=sorted(PAPER_SHAPES), default='llama2-7b')
    parser.add_argument('--seq', type=int, nargs='+', default=[16, 512])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--json', type=Path, default=None)
    parser.add_argument('--tables', type=Path, default=None, help="a folder for the profiler's tables")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error('this benchmark measures a CUDA GPU; none is available')
    results = [measure(args.model, seq, args.repeats, args.tables) for seq in args.seq]
    settings = {'device': torch.cuda.get_device_name(), 'torch': torch.__version__, 'repeats': args.repeats}
    if args.json is not None:
        args.json.write_text(json.dumps({'settings': settings, 'results': results}, indent=1) + '\n')


if __name__ == '__main__':
    main()
