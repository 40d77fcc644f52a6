"""The methods' declarations (:py:mod:`zennit_attn.methods.declarations`) against their implementations, loaded on
first use by the registry (:py:func:`zennit_attn.methods.registry.load_implementation`): a method added, renamed or
given another parameter or default in one place and not the other fails here; a missing optional package is an
ImportError naming the extra; the declarations import no torch, and the core methods run without captum and
scikit-learn."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zennit_attn.methods.declarations import DECLARATIONS, Declaration, Parameter, positive, seed
from zennit_attn.methods.registry import METHODS, Method, load_implementation

ROOT = Path(__file__).resolve().parents[2]


def test_declarations_are_the_implementations():
    assert list(DECLARATIONS) == list(METHODS)
    for name, declaration in DECLARATIONS.items():
        method = METHODS[name]
        assert isinstance(method, Method) and method.name == name
        signature = list(inspect.signature(method.function).parameters.values())[3:]
        own = {parameter.name: parameter.default for parameter in signature if parameter.name != 'composite'}
        assert dict(declaration.params) == own, name
        assert [type(value) for value in declaration.params.values()] == [type(value) for value in own.values()]
        assert declaration.lrp == any(parameter.name == 'composite' for parameter in signature), name
        assert (method.backward, method.latent, method.neuron, method.lrp) == (
            declaration.backward,
            declaration.latent,
            declaration.neuron,
            declaration.lrp,
        )
        # the methods that read attention maps (refused for encoder-decoder models) are those that call them
        assert declaration.attention_maps == ('attention_maps(' in inspect.getsource(method.function)), name
        for parameter, default in declaration.params.items():  # each default passes its own check unchanged
            assert declaration.checks[parameter](default, parameter) == default, (name, parameter)
    assert [name for name, declaration in DECLARATIONS.items() if declaration.attention_maps] == [
        'attention_rollout',
        'grad_attention_rollout',
        'gradcam',
    ]
    assert [name for name, declaration in DECLARATIONS.items() if declaration.requires] == ['kernelshap']
    assert DECLARATIONS['kernelshap'].requires == (('captum', 'captum'), ('sklearn', 'scikit-learn'))


@pytest.mark.parametrize(
    'declaration, match',
    [
        (
            Declaration(
                'seeded_differently', 'random_baseline:random', backward=False, parameters=(Parameter('seed', 1, seed),)
            ),
            r"its parameters and defaults \{'seed': 0\} are not the declared ones \{'seed': 1\}",
        ),
        (
            Declaration(
                'seed_as_float', 'random_baseline:random', backward=False, parameters=(Parameter('seed', 0.0, seed),)
            ),
            'are not the declared ones',
        ),
        (
            Declaration('without_parameters', 'random_baseline:random', backward=False),
            r"its parameters and defaults \{'seed': 0\} are not the declared ones \{\}",
        ),
        (
            Declaration(
                'renamed', 'random_baseline:random', backward=False, parameters=(Parameter('steps', 0, positive),)
            ),
            'are not the declared ones',
        ),
        (
            Declaration('lrp_without_composite', 'gradients:input_x_gradient', backward=True, lrp=True),
            'declared lrp=True, but it takes composite= not',
        ),
        (
            Declaration('composite_undeclared', 'propagation:attnlrp', backward=True),
            'declared lrp=False, but it takes composite=',
        ),
        (
            Declaration('no_task', 'selection:forked_random_state', backward=False),
            r'must take \(task, position, target, ...\)',
        ),
    ],
)
def test_a_declaration_that_does_not_match_its_implementation_is_refused(declaration, match):
    with pytest.raises(TypeError, match=match):
        load_implementation(declaration)
    with pytest.raises(TypeError, match=match):
        Method.of(declaration).function  # noqa: B018


def test_a_missing_package_names_the_extra():
    declaration = Declaration(
        'needs_more',
        'random_baseline:random',
        backward=False,
        parameters=(Parameter('seed', 0, seed),),
        requires=(('zennit_attn_no_such_module', 'no-such-distribution'), ('json', 'not-missing')),
        extra='baselines',
    )
    with pytest.raises(ImportError) as error:
        load_implementation(declaration)
    assert str(error.value) == (
        "method 'needs_more' needs no-such-distribution, which is not installed: pip install "
        "'zennit-attn[baselines]' (or pip install no-such-distribution)"
    )


def python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter in the repository; it prints one JSON value last, which is returned."""
    result = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_declarations_import_no_torch():
    found = python("""
        import json, sys
        from zennit_attn.methods.declarations import DECLARATIONS
        DECLARATIONS['integrated_gradients'].check({'steps': 3})
        print(json.dumps(sorted(name for name in ('torch', 'zennit', 'transformers', 'numpy') if name in sys.modules)))
        """)
    assert found == []


@pytest.mark.slow  # fresh interpreters (about 25 s)
def test_the_core_methods_need_neither_captum_nor_sklearn():
    """With captum and scikit-learn not importable (as after ``pip install zennit-attn`` without extras), explain()
    runs AttnLRP, CP-LRP and the gradient baselines, and KernelSHAP is an ImportError that names the extra."""
    found = python("""
        import json, sys
        blocked = ('captum', 'sklearn')
        sys.modules['captum'] = sys.modules['sklearn'] = None  # not importable
        import torch
        from tests.models import tiny_model, token_ids
        from zennit_attn import explain
        model, ids = tiny_model('llama'), token_ids('llama', 5)
        sums = {}
        for method in ('attnlrp', 'cplrp', 'input_x_gradient', 'integrated_gradients', 'smoothgrad', 'random'):
            explanation = explain(model, ids, method=method)
            sums[method] = [float(explanation.relevance.sum()), float(explanation.logit.sum())]
        try:
            explain(model, ids, method='kernelshap')
            error = None
        except ImportError as raised:
            error = str(raised)
        loaded = sorted(name for name, module in sys.modules.items() if module and name.split('.')[0] in blocked)
        print(json.dumps({'sums': sums, 'error': error, 'loaded': loaded}))
        """)
    assert found['loaded'] == []
    assert found['error'] == (
        "method 'kernelshap' needs captum and scikit-learn, which are not installed: pip install "
        "'zennit-attn[baselines]' (or pip install captum scikit-learn)"
    )
    relevance, logit = found['sums']['cplrp']
    assert relevance == pytest.approx(logit, rel=1e-9)  # CP-LRP on the tiny Llama (no biases) conserves exactly
    relevance, logit = found['sums']['attnlrp']
    assert abs(relevance) > 0 and found['sums']['attnlrp'][1] == logit
