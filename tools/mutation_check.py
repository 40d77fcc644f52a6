"""Mutation check of the engine: single changes (mutants) of the operation registry, the classifying mode, the marks,
the product rules and the recurrences, applied one at a time, each run against the engine's tests; every mutant that
changes what the engine computes must make a test fail.

Each mutant replaces one snippet of one source file (the snippet must occur exactly once); the file is put back after
the run, also when it is interrupted. The tests run with ``pytest -x`` (the first failing test is the one that caught
the mutant). Run from the repository root, on a clean work tree of the mutated files::

    python tools/mutation_check.py                    # every mutant against the engine's tests
    python tools/mutation_check.py --only 3 7         # some of them
    python tools/mutation_check.py --tests tests/operations --workers 2

Prints one line per mutant: its number, what it changes, and the test that caught it or ``SURVIVED``; the exit
status is the number of survivors.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the mutated packages: the operation machinery and the rules
OPERATIONS = 'zennit_attn/operations'
RULES = 'zennit_attn/rules'
#: the engine's tests
TESTS = ['tests/core', 'tests/rules', 'tests/operations', 'tests/canonizers', 'tests/composites']


@dataclass(frozen=True)
class Mutant:
    """One change: ``old`` replaced by ``new`` in ``path`` (relative to the repository root)."""

    what: str
    path: str
    old: str
    new: str


MUTANTS = [
    # ---------------------------------------------------------------------------------------------- registry
    Mutant(
        'an undeclared operation passes with its plain gradient instead of a refusal',
        f'{OPERATIONS}/classifier.py',
        '    if entry is None:\n        state.refuse(call.name)\n',
        '    if entry is None:\n        return call.run()\n',
    ),
    Mutant(
        'a refused operation passes with its plain gradient',
        f'{OPERATIONS}/registry.py',
        '    state.refuse(call.name, call.entry.reason)',
        '    return call.run()',
    ),
    Mutant(
        'silu declared plain instead of elementwise',
        f'{OPERATIONS}/registry.py',
        'tanh sigmoid log_sigmoid silu gelu',
        'tanh sigmoid log_sigmoid gelu',
    ),
    Mutant(
        'mul declared plain instead of product',
        f'{OPERATIONS}/registry.py',
        "operation('product', 'mul kron', params='input other')",
        "operation('plain', 'mul kron', shape='view', params='input other')",
    ),
    Mutant(
        'selections do not keep gates',
        f'{OPERATIONS}/registry.py',
        "    'selection': MARKS,",
        "    'selection': MARKS - {'gate'},",
    ),
    Mutant(
        'joins do not keep gates',
        f'{OPERATIONS}/registry.py',
        "    'join': _MOVED | {'bias'},",
        "    'join': (_MOVED - {'gate'}) | {'bias'},",
    ),
    Mutant(
        'views do not keep log-softmaxes',
        f'{OPERATIONS}/registry.py',
        "    'view': MARKS,",
        "    'view': MARKS - {'log_softmax'},",
    ),
    Mutant(
        'divisions do not keep gates',
        f'{OPERATIONS}/registry.py',
        "            frozenset({'gate', 'sink', 'attention', 'contraction', 'normaliser', 'term'}),",
        "            frozenset({'sink', 'attention', 'contraction', 'normaliser', 'term'}),",
    ),
    Mutant(
        'contractions of activations stay activation gates (not mixed)',
        f'{OPERATIONS}/registry.py',
        "    mixes = shape == 'reduction' or contraction or layer or rule in ('elements', 'solve', 'attention')",
        "    mixes = shape == 'reduction' or rule in ('elements', 'solve', 'attention')",
    ),
    Mutant(
        "linear's bias is a factor, not an additive term",
        f'{OPERATIONS}/registry.py',
        "    layer=True,\n    params='input weight bias',\n    additive='bias',\n",
        "    layer=True,\n    params='input weight bias',\n",
    ),
    # ---------------------------------------------------------------------------------------------- classifier
    Mutant(
        'operations on normalisers are not routed to their handler',
        f'{OPERATIONS}/classifier.py',
        "    'normaliser': normaliser_use,",
        "    'normaliser': lambda call, state: dispatch(call, state),",
    ),
    Mutant(
        'outputs of module rules are not read through',
        f'{OPERATIONS}/classifier.py',
        '(marks.get(node) if kind in marks.rule_nodes else None)',
        'None',
    ),
    Mutant(
        'the fast path of quiet operations ignores marks',
        f'{OPERATIONS}/classifier.py',
        '        and not any(marks)\n        and not state.overrides',
        '        and not state.overrides',
    ),
    Mutant(
        "an operand outside the engine's sight passes (the audit's refusal ignored)",
        f'{OPERATIONS}/classifier.py',
        '        if refusal is not None:  # an operand the engine did not produce or sanction\n'
        '            state.recorded(state.refuse, name, *refusal)\n',
        '',
    ),
    Mutant(
        'shifts and joins on the fast path note no constants',
        f'{OPERATIONS}/classifier.py',
        '        if fast in ADDING:\n            state.note_constant(fast, args, kwargs)\n',
        '',
    ),
    Mutant(
        'shifts on the fast path note nothing of what they shift',
        f'{OPERATIONS}/classifier.py',
        "        elif fast == 'shift':\n            state.marks.derive(produced_tensors(output), carrying)\n",
        '',
    ),
    Mutant(
        'overrides of rule objects are ignored',
        f'{OPERATIONS}/classifier.py',
        '        call.product_rule, call.activation_rule = override.product_rule, override.activation_rule\n',
        '',
    ),
    # ---------------------------------------------------------------------------------------------- marks
    Mutant(
        'a softmax joined with an activation is a softmax gate',
        f'{OPERATIONS}/marks.py',
        '    if kinds == {SOFTMAX}:\n        return Mark(gate=SOFTMAX, scores=frozenset(scores))\n    if mixes',
        '    if SOFTMAX in kinds:\n        return Mark(gate=SOFTMAX, scores=frozenset(scores))\n    if mixes',
    ),
    Mutant(
        'gates pass through declared recurrences',
        f'{OPERATIONS}/marks.py',
        "    if 'gate' in keeps and not call.held and not state.in_recurrence:",
        "    if 'gate' in keeps and not call.held:",
    ),
    Mutant(
        'contractions of softmax outputs are mixed',
        f'{OPERATIONS}/marks.py',
        '    if kinds == {SOFTMAX}:\n        return Mark(gate=SOFTMAX, scores=frozenset(scores))\n'
        '    if mixes or MIXED in kinds:\n        return _MIXED\n',
        '    if mixes or MIXED in kinds:\n        return _MIXED\n'
        '    if kinds == {SOFTMAX}:\n        return Mark(gate=SOFTMAX, scores=frozenset(scores))\n',
    ),
    Mutant(
        'a normaliser computed from a chain of identity rules is not found',
        f'{OPERATIONS}/marks.py',
        "            if rule_node(node) in ('gate', 'rescaled') and node.next_functions:",
        '            if False:',
    ),
    # ---------------------------------------------------------------------------------------------- rules
    Mutant(
        "RelP's attention is uniform (ConstantAttention as Uniform)",
        f'{RULES}/products.py',
        '        constant = [kind == SOFTMAX for kind in kinds]\n        if all(constant) or not any(constant):',
        '        constant = [kind == SOFTMAX for kind in kinds]\n        if True:',
    ),
    Mutant(
        'HalfGates halves products that contain a softmax',
        f'{RULES}/products.py',
        '        if ACTIVATION in kinds and SOFTMAX not in kinds:',
        '        if ACTIVATION in kinds or SOFTMAX in kinds:',
    ),
    Mutant(
        'CP-LRP holds the activation, not the softmax, constant where both meet',
        f'{RULES}/products.py',
        '            constant = [kind == SOFTMAX for kind in kinds]\n        else:',
        '            constant = [kind == ACTIVATION for kind in kinds]\n        else:',
    ),
    Mutant(
        'the uniform rule gives 1/2 whatever the number of factors',
        f'{RULES}/products.py',
        '        return (1.0 / len(kinds),) * len(kinds)\n\n\nclass ConstantGates',
        '        return (0.5,) * len(kinds)\n\n\nclass ConstantGates',
    ),
    Mutant(
        'a softmax divisor is kept even where the numerator is not a softmax gate',
        f'{OPERATIONS}/elementwise.py',
        '    if _softmax(state, denominator) and isinstance(numerator, torch.Tensor) and _softmax(state, numerator):',
        '    if _softmax(state, denominator):',
    ),
    Mutant(
        'a normaliser of the normalised tensor is not held constant',
        f'{OPERATIONS}/elementwise.py',
        '    if not constants:\n        return state.dispatch(call, state)\n    inner = call.without(constants)',
        '    if True:\n        return state.dispatch(call, state)\n    inner = call.without(constants)',
    ),
    Mutant(
        'a bound of a value is a gate',
        f'{OPERATIONS}/elementwise.py',
        "    gate = call.entry.rule != 'bound' or kind(call.marks[0]) is not None",
        '    gate = True',
    ),
    Mutant(
        'a sink mass gets the share of its product with the attention output regardless of its logits',
        f'{OPERATIONS}/products.py',
        '    return tuple(share if index == sinks[0] else 1.0 for index in range(len(found)))',
        '    return tuple(1.0 for index in range(len(found)))',
    ),
    Mutant(
        'a scattered product is not divided by its number of factors',
        f'{OPERATIONS}/products.py',
        '    return scaled_gradient(output, 1 / counts.clamp_min(1))',
        '    return output',
    ),
    Mutant(
        'linear attention written inline is not refused',
        f'{OPERATIONS}/products.py',
        '    if any(mark is not None and mark.contraction for mark in marks):\n        state.refuse(',
        '    if False:\n        state.refuse(',
    ),
    Mutant(
        'constants added to relevance are not noted',
        f'{OPERATIONS}/tracking.py',
        '        if all(isinstance(value, torch.Tensor) and value.requires_grad for value in values):\n'
        '            return  # relevance-carrying tensors only (a residual connection): nothing added\n',
        '        return\n',
    ),
    # ---------------------------------------------------------------------------------------------- recurrences
    Mutant(
        'the constants of a declared recurrence are not held',
        f'{OPERATIONS}/recurrences.py',
        '    detached = entry[2]\n    if not any(id(tensor) in detached for tensor in carrying):',
        '    detached = {}\n    if not any(id(tensor) in detached for tensor in carrying):',
    ),
    Mutant(
        "the gated delta rule's decay g has no role",
        f'{OPERATIONS}/recurrences.py',
        "    values='value initial_state',\n    constants='query key g beta',\n)\nrecurrence(\n    'chunk_kimi",
        "    values='value initial_state',\n    constants='query key beta',\n)\nrecurrence(\n    'chunk_kimi",
    ),
    Mutant(
        'a term of a recurrence may be used as a value',
        f'{OPERATIONS}/recurrences.py',
        "    if all(terms) and entry is not None and 'term' in entry.keeps:",
        '    if entry is not None:',
    ),
    Mutant(
        'the product of an exponential in a mixer with another tensor is not a held constant',
        f'{OPERATIONS}/recurrences.py',
        '        inner = call.without(constants, held=True)',
        '        inner = call',
    ),
]


def run(mutant: Mutant, tests: list[str], workers: int) -> str:
    """Apply ``mutant``, run ``tests`` and put the file back; the first failing test, or ``'SURVIVED'``."""
    path = ROOT / mutant.path
    source = path.read_text()
    if source.count(mutant.old) != 1:
        return f'NOT APPLIED ({source.count(mutant.old)} occurrences of the snippet)'
    path.write_text(source.replace(mutant.old, mutant.new))
    try:
        command = [sys.executable, '-m', 'pytest', '-x', '-q', '-p', 'no:cacheprovider', '-n', str(workers), *tests]
        environment = dict(os.environ, OMP_NUM_THREADS='1')
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=environment)
    finally:
        path.write_text(source)
    if result.returncode == 0:
        return 'SURVIVED'
    failed = [line.split(' ')[1] for line in result.stdout.splitlines() if line.startswith(('FAILED ', 'ERROR '))]
    return failed[0] if failed else f'pytest exit {result.returncode}: {result.stdout.strip().splitlines()[-1:]}'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--only', type=int, nargs='+', help='the numbers of the mutants to run (default: all)')
    parser.add_argument('--tests', nargs='+', default=TESTS, help=f'the tests to run (default {" ".join(TESTS)})')
    parser.add_argument('--workers', type=int, default=2, help='pytest-xdist workers (default 2)')
    args = parser.parse_args(argv)
    dirty = subprocess.run(['git', 'diff', '--quiet', '--', OPERATIONS, RULES], cwd=ROOT).returncode
    if dirty:
        parser.error(
            f'{OPERATIONS} or {RULES} has uncommitted changes: commit or stash them first (the check rewrites them)'
        )
    survivors = 0
    for number, mutant in enumerate(MUTANTS, 1):
        if args.only and number not in args.only:
            continue
        outcome = run(mutant, args.tests, args.workers)
        survivors += outcome == 'SURVIVED' or outcome.startswith('NOT APPLIED')
        print(f'{number:2d}. {mutant.what}: {outcome}', flush=True)
    return survivors


if __name__ == '__main__':
    sys.exit(main())
