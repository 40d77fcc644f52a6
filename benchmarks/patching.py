"""Relevance patching against activation patching on SmolLM2-135M-Instruct (issues 32 and 43).

For IOI (one name replaced, ``ioi``; all three, ``ioi_abc``) and subject-verb agreement (the subject's number flipped,
``agreement``; the subject's and the attractor's, ``agreement_both``), on the prompt pairs of
``benchmarks/patching_tasks.json`` (written by ``--write-tasks`` from :py:mod:`zennit_attn.workflows.patching.tasks`:
8 templates per task, the first ``--pairs`` pairs of each), activation patching of every residual stream, attention
output and MLP output per position and of every head at all positions is the reference (cached per task and template
in ``--cache``); relevance patching with each method (and each rule choice of ``--explore``) is scored by its Pearson
and Spearman correlation with it per component type, pooled over the templates of ``--split`` (``choose``: templates 0,
2, 4, 6, on which the defaults were chosen; ``held-out``: 1, 3, 5, 7, on which they are reported), and timed.
``--steps``: the points of each path (1: the clean run alone, AtP and RelP); ``--span``: how far along the path they
go; ``--paths``: the causal paths or the straight one (:py:mod:`zennit_attn.workflows.patching.paths`).

    OMP_NUM_THREADS=1 python benchmarks/patching.py --references-only --split all --shard 0/2   (and --shard 1/2)
    OMP_NUM_THREADS=1 python benchmarks/patching.py --split choose --methods atp attnlrp mlp_rules relp cplrp \
        --steps 4 1 --paths causal straight --span 1 0.5 --out docs/results/patching --stem choose
    OMP_NUM_THREADS=1 python benchmarks/patching.py --split held-out --methods atp attnlrp mlp_rules relp cplrp \
        --steps 4 1 --paths causal straight --out docs/results/patching --stem held_out
    OMP_NUM_THREADS=1 python benchmarks/patching.py --explore --steps 1
    python benchmarks/patching.py --summary docs/results/patching/held_out.json
    OMP_NUM_THREADS=1 python benchmarks/patching.py --write-tasks
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from zennit_attn.composites import AttnLRPComposite, CPLRPEpsilon, RelPEpsilon
from zennit_attn.pretrained import load_smollm2
from zennit_attn.rules import Identity, ProductRule, Uniform
from zennit_attn.rules.base import GradientRule
from zennit_attn.rules.products import ACTIVATION, SOFTMAX
from zennit_attn.workflows.patching import (
    PATHS,
    PatchingScores,
    activation_patching,
    by_template,
    correlation,
    load_pairs,
    pair_ids,
    relevance_patching,
    save_pairs,
    task_pairs,
)
from zennit_attn.workflows.patching.tasks import (
    AGREEMENT_OTHER_TEMPLATES,
    AGREEMENT_TEMPLATES,
    IOI_OTHER_TEMPLATES,
    IOI_TEMPLATES,
)

HERE = Path(__file__).parent
TASKS = HERE / 'patching_tasks.json'
#: the templates of each task: the one-length set first, then the other wordings (tasks.py)
TEMPLATES = {
    'ioi': IOI_TEMPLATES + IOI_OTHER_TEMPLATES,
    'ioi_abc': IOI_TEMPLATES + IOI_OTHER_TEMPLATES,
    'agreement': AGREEMENT_TEMPLATES + AGREEMENT_OTHER_TEMPLATES,
    'agreement_both': AGREEMENT_TEMPLATES + AGREEMENT_OTHER_TEMPLATES,
}
#: ``--split``: the templates (indices into TEMPLATES) on which methods are chosen, and those held out from the
#: choosing, on which the figures are reported; two of each set of tasks.py in each
#: (``one-length``: the four templates of one length, whose first 4 pairs each are the 16 pairs of the earlier results
#: files, steps.md, span.md and patching.md)
SPLITS = {'choose': (0, 2, 4, 6), 'held-out': (1, 3, 5, 7), 'all': tuple(range(8)), 'one-length': (0, 1, 2, 3)}
#: component -> per_position of its activation patching reference (heads: patched at all positions, as in RelP)
REFERENCE = {'residual': True, 'attention': True, 'mlp': True, 'heads': False}


class ConstantGatesOnly(ProductRule):
    """Exploration: gates constant (``up`` gets all of ``act(gate) * up``), attention uniform (AttnLRP)."""

    def shares(self, kinds):
        gates = [kind is not None and kind != SOFTMAX for kind in kinds]
        if any(gates) and not all(gates):
            free = len(kinds) - sum(gates)
            return tuple(0.0 if gate else 1.0 / free for gate in gates)
        return Uniform().shares(kinds)


class PlainActivation(RelPEpsilon):
    """Exploration: RelP with the plain gradient through SiLU instead of the identity rule."""

    activation_rule = None


class PlainActivationCP(CPLRPEpsilon):
    """Exploration: CP-LRP with the plain gradient through SiLU."""

    activation_rule = None


class NoNormRule(RelPEpsilon):
    """Exploration: RelP without the module rule on RMSNorm (what the engine does inside it instead)."""

    def mapping(self, ctx, name, module):
        rule = super().mapping(ctx, name, module)
        return None if type(rule).__name__ == 'NormIdentity' else rule


class PlainNorm(RelPEpsilon):
    """Exploration: RelP with the plain gradient through RMSNorm (a rule that changes nothing on norm modules, whose
    inside the engine leaves to their module rule)."""

    def mapping(self, ctx, name, module):
        rule = super().mapping(ctx, name, module)
        return GradientRule() if type(rule).__name__ == 'NormIdentity' else rule


class PlainNormCP(CPLRPEpsilon):
    """Exploration: CP-LRP with the plain gradient through RMSNorm."""

    def mapping(self, ctx, name, module):
        rule = super().mapping(ctx, name, module)
        return GradientRule() if type(rule).__name__ == 'NormIdentity' else rule


class Shares(ProductRule):
    """Exploration: the shares of attention's products (``A V`` with a softmax factor, ``q k^T``: two plain factors) and
    of gated products (an activation factor): ``'plain'`` (1 each: the plain gradient), ``'uniform'`` (1/N each),
    ``'constant'`` (0 for the softmax or the gate, 1 for the rest)."""

    def __init__(self, attention: str, gate: str):
        self.attention = attention
        self.gate = gate

    def shares(self, kinds):
        if SOFTMAX in kinds and len(set(kinds)) > 1:
            rule, fixed = self.attention, [kind == SOFTMAX for kind in kinds]
        elif ACTIVATION in kinds and len(set(kinds)) > 1:
            rule, fixed = self.gate, [kind == ACTIVATION for kind in kinds]
        else:
            rule, fixed = (self.attention if self.attention != 'constant' else 'uniform'), [False] * len(kinds)
        if rule == 'plain':
            return (1.0,) * len(kinds)
        if rule == 'uniform' or rule == 'half':
            return (1.0 / len(kinds),) * len(kinds)
        free = len(kinds) - sum(fixed)
        return tuple(0.0 if constant else 1.0 / free for constant in fixed)


class Variant(AttnLRPComposite):
    """Exploration: the rules chosen one by one: attention and gate products (:py:class:`Shares`), the identity rule
    on SiLU or its plain gradient, the identity rule on RMSNorm or its plain gradient."""

    def __init__(self, attention='plain', gate='plain', silu='plain', norm='plain'):
        self.activation_rule = Identity if silu == 'identity' else None
        self.norm = norm
        super().__init__(product_rule=Shares(attention, gate))

    def mapping(self, ctx, name, module):
        rule = super().mapping(ctx, name, module)
        if type(rule).__name__ == 'NormIdentity' and self.norm == 'plain':
            return GradientRule()
        return rule


#: one rule at a time on top of the plain gradient, and the plain gradient through the engine (equal to AtP)
ABLATIONS = {
    'engine, every rule plain (= atp)': {},
    'atp + identity SiLU': {'silu': 'identity'},
    'atp + identity RMSNorm': {'norm': 'identity'},
    'atp + half rule on gate': {'gate': 'half'},
    'atp + constant gate': {'gate': 'constant'},
    'atp + uniform attention': {'attention': 'uniform'},
    'atp + constant attention': {'attention': 'constant'},
    'relp rules, plain SiLU and RMSNorm': {'attention': 'constant', 'gate': 'half'},
    'atp + identity SiLU + half rule on gate': {'silu': 'identity', 'gate': 'half'},
    'atp + identity SiLU + constant gate': {'silu': 'identity', 'gate': 'constant'},
    'atp + identity SiLU + identity RMSNorm': {'silu': 'identity', 'norm': 'identity'},
    'attnlrp rules, plain RMSNorm': {'attention': 'uniform', 'gate': 'half', 'silu': 'identity'},
}


def methods(explore: bool) -> dict:
    """name -> method of :py:func:`relevance_patching`."""
    chosen = {'atp': 'atp', 'attnlrp': 'attnlrp', 'cplrp': 'cplrp', 'relp': 'relp', 'mlp_rules': 'mlp_rules'}
    if explore:
        chosen.update(
            {
                'uniform attention, constant gates': AttnLRPComposite(product_rule=ConstantGatesOnly()),
                'relp, plain SiLU gradient': PlainActivation(),
                'cplrp, plain SiLU gradient': PlainActivationCP(),
                'relp, no RMSNorm module rule': NoNormRule(),
                'relp, plain RMSNorm gradient': PlainNorm(),
                'cplrp, plain RMSNorm gradient': PlainNormCP(),
            }
        )
        chosen.update({name: Variant(**choice) for name, choice in ABLATIONS.items()})
    return chosen


def write_tasks(tokenizer) -> None:
    """Write TASKS: per task, 120 pairs of the one-length templates (the pairs of the earlier file, in its order),
    then 30 of each other template (seeds 1 to 4)."""
    pairs = []
    for task, templates in TEMPLATES.items():
        pairs += task_pairs(tokenizer, task, 120)
        for seed, template in enumerate(templates[4:], 1):
            pairs += task_pairs(tokenizer, task, 30, seed=seed, templates=[template])
    save_pairs(pairs, TASKS)


def template_groups(tokenizer, task: str, split: str, count: int) -> list[tuple[int, dict]]:
    """``(template index, token ids)`` of the first ``count`` pairs of each template of ``split``."""
    groups = {pairs[0].template: pairs for pairs in by_template(load_pairs(TASKS, task))}
    chosen = [(index, TEMPLATES[task][index]) for index in SPLITS[split]]
    return [(index, pair_ids(tokenizer, groups[template][:count])) for index, template in chosen]


def reference(model, ids, cache: Path, task: str, template: int, count: int) -> dict:
    """Activation patching of the first ``count`` pairs of template ``template`` (kept in ``cache``)."""
    path = cache / f'{task}_t{template}_{count}.pt'
    if path.exists():
        return torch.load(path, weights_only=False)  # our own cache of PatchingScores
    result = {}
    for per_position in (True, False):
        components = [name for name, where in REFERENCE.items() if per_position == where]
        result[per_position] = activation_patching(
            model, components=components, per_position=per_position, batch_size=64, **ids
        )
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(result, path)
    return result


def score(
    model, groups: list[dict], exact: list[dict], method, steps: int, span: float = 1.0, path: str = 'causal'
) -> dict:
    """Correlations of relevance patching with ``method`` on ``steps`` points of the ``path`` (up to ``span`` of the
    way) per component and granularity, pooled over the template groups (``groups`` of token ids, ``exact`` their
    references), and its time (summed over the groups)."""
    components = [*exact[0][True].scores, *exact[0][False].scores]
    estimates = [
        relevance_patching(model, components=components, method=method, steps=steps, span=span, path=path, **ids)
        for ids in groups
    ]
    rows = {}
    for per_position in (True, False):
        references = [reference[per_position] for reference in exact]
        for component in references[0].scores:
            # one call per group: the scores at every position at once are the per-position scores summed
            scored = [estimate if per_position else at_every_position(estimate, component) for estimate in estimates]
            rows[(component, per_position)] = correlation(scored, references, component)
    return {'rows': rows, 'seconds': sum(estimate.seconds for estimate in estimates)}


def at_every_position(scores: PatchingScores, component: str) -> PatchingScores:
    """``component``'s scores of a unit patched at every position at once (the sum over positions of Eq. 2)."""
    return replace(scores, scores={component: scores.summed(component)}, per_position=False)


def row_name(name: str, steps: int, span: float, path: str, paths: list[str]) -> str:
    """The table row of a method at ``steps`` points, ``span`` and ``path`` (named where several are compared)."""
    row = f'{name}, {steps} step{"s" * (steps > 1)}{f", span {span:g}" * (span != 1)}'
    return row + (f', {path} path' if len(paths) > 1 and steps > 1 else '')


def forward_backward(model, groups: list[dict]) -> float:
    """Seconds of one forward and one plain backward pass of the clean prompts (summed over the groups)."""
    seconds = 0.0
    for ids in groups:
        embeddings = model.get_input_embeddings()(ids['clean']).detach().requires_grad_(True)
        start = time.perf_counter()
        logits = model(inputs_embeds=embeddings).logits[:, -1]
        torch.autograd.grad(logits.sum(), embeddings)
        seconds += time.perf_counter() - start
    return seconds


def table(results: dict, task: str, count: int) -> list[str]:
    """Markdown rows: method x component (Pearson / Spearman)."""
    components = [('residual', True), ('attention', True), ('heads', False), ('mlp', True)]
    head = ' | '.join(f'{name}{"" if where else " (all pos.)"}' for name, where in components)
    lines = [f'### {task}, {count} pairs', '', f'| method | {head} | seconds |', '|---' * (len(components) + 2) + '|']
    for name, result in results.items():
        cells = ' | '.join('{:.3f} / {:.3f}'.format(*result['rows'][key][:2]) for key in components)
        lines.append(f'| {name} | {cells} | {result["seconds"]:.2f} |')
    return lines


#: the component types of the summary (per position; heads at all positions, as their reference)
SUMMARY = ('residual', 'attention', 'heads_all', 'mlp')


def summary_table(paths: list[Path]) -> list[str]:
    """Markdown table over the tasks of the JSON files ``paths`` (written by ``--out``): per method, the Pearson
    correlation per task and component type, their mean and their lowest value, best mean first."""
    tasks = {task: rows for path in paths for task, rows in json.loads(path.read_text()).items()}
    names = [name for name in next(iter(tasks.values())) if name not in ('forward_backward', 'activation_seconds')]
    names = [name for name in names if all(name in rows for rows in tasks.values())]
    head = ' | '.join(f'{task} {component.removesuffix("_all")}' for task in tasks for component in SUMMARY)
    lines = [f'| method | {head} | mean | lowest |', '|---' * (len(tasks) * len(SUMMARY) + 3) + '|']
    values = {name: [tasks[task][name][component][0] for task in tasks for component in SUMMARY] for name in names}
    for name in sorted(names, key=lambda name: -sum(values[name])):
        cells = ' | '.join(f'{value:.2f}' for value in values[name])
        mean = sum(values[name]) / len(values[name])
        lines.append(f'| {name} | {cells} | {mean:.3f} | {min(values[name]):.2f} |')
    return lines


def references(model, tokenizer, args) -> None:
    """``--references-only``: compute and cache the references of this shard (``--shard i/n``: every n-th group of
    task and template, from the i-th) and stop."""
    index, shards = (int(part) for part in args.shard.split('/'))
    work = [
        (task, template, ids)
        for task in args.tasks
        for template, ids in template_groups(tokenizer, task, args.split, args.pairs)
    ]
    for task, template, ids in work[index::shards]:
        start = time.perf_counter()
        reference(model, ids, args.cache, task, template, args.pairs)
        print(f'{task} template {template}: {time.perf_counter() - start:.0f} s', flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--pairs', type=int, default=4, help='pairs per template')
    parser.add_argument('--tasks', nargs='+', default=list(TEMPLATES))
    parser.add_argument('--split', choices=list(SPLITS), default='held-out', help='the templates scored')
    parser.add_argument('--explore', action='store_true')
    parser.add_argument('--methods', nargs='+', default=None, help='only these methods (names of the table)')
    parser.add_argument(
        '--steps', type=int, nargs='+', default=[4, 1], help='path points of relevance patching (each a table row)'
    )
    parser.add_argument(
        '--span', type=float, nargs='+', default=[1.0], help='how far along the path the points go (each a table row)'
    )
    parser.add_argument(
        '--paths', nargs='+', default=['causal'], choices=PATHS, help='the paths of the points (each a table row)'
    )
    parser.add_argument('--write-tasks', action='store_true')
    parser.add_argument('--references-only', action='store_true', help='compute and cache the references, no scores')
    parser.add_argument('--shard', default='0/1', help="with --references-only: i/n, this process's share")
    parser.add_argument('--cache', type=Path, default=Path('/tmp/zennit_attn_patching'))
    parser.add_argument('--out', type=Path, default=None, help='write STEM.md and STEM.json to this folder')
    parser.add_argument('--stem', default='patching', help='the name of the files written to --out')
    parser.add_argument('--summary', type=Path, nargs='+', default=None, help='print the summary of these JSON files')
    args = parser.parse_args()
    if args.summary:
        print('\n'.join(summary_table(args.summary)))
        return
    torch.set_num_threads(1)
    model, tokenizer = load_smollm2()
    if args.write_tasks:
        write_tasks(tokenizer)
        print(f'wrote {TASKS}')
        return
    if args.references_only:
        references(model, tokenizer, args)
        return
    threads = os.environ.get('OMP_NUM_THREADS')
    lines = [f'load average: {open("/proc/loadavg").read().split()[:3]}, OMP_NUM_THREADS={threads}']
    summary = {}
    for task in args.tasks:
        templates = template_groups(tokenizer, task, args.split, args.pairs)
        groups = [ids for _, ids in templates]
        exact = [reference(model, ids, args.cache, task, template, args.pairs) for template, ids in templates]
        chosen = {name: method for name, method in methods(args.explore).items() if name in (args.methods or [name])}
        results = {
            row_name(name, steps, span, path, args.paths): score(model, groups, exact, method, steps, span, path)
            for path in args.paths
            for span in args.span
            for steps in args.steps
            for name, method in chosen.items()
            if steps > 1 or (span == args.span[0] and path == args.paths[0])
        }
        fb = min(forward_backward(model, groups) for _ in range(3))
        clean = torch.cat([reference[True].clean for reference in exact])
        corrupted = torch.cat([reference[True].corrupted for reference in exact])
        activation = sum(reference[True].seconds + reference[False].seconds for reference in exact)
        pairs = len(clean)
        lines += ['', *table(results, f'{task}, templates {", ".join(str(t) for t, _ in templates)}', pairs), '']
        lines.append(
            f'clean metric mean {clean.mean():.2f} (min {clean.min():.2f}), corrupted {corrupted.mean():.2f}; '
            f'one forward+backward {fb:.2f} s; activation patching {activation:.1f} s'
        )
        summary[task] = {
            name: {f'{c}{"" if p else "_all"}': v for (c, p), v in r['rows'].items()} | {'seconds': r['seconds']}
            for name, r in results.items()
        } | {'forward_backward': fb, 'activation_seconds': activation}
        print('\n'.join(lines), flush=True)
    lines.append(f'load average after: {open("/proc/loadavg").read().split()[:3]}')
    print(lines[-1])
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f'{args.stem}.md').write_text('\n'.join(lines) + '\n')
        (args.out / f'{args.stem}.json').write_text(json.dumps(summary, indent=1) + '\n')


if __name__ == '__main__':
    main()
