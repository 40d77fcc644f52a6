"""The package's structure: imports between its modules run one way through the layers (no cycle, also not through
imports inside functions), no private name is imported across modules. Read from the source files (the package is
not imported). The length and complexity of functions are ruff's (make lint)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / 'zennit_attn'


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imports(path: Path) -> list[tuple[str, str]]:
    """``(module, imported name)`` of every import of the package's own modules in ``path``, wherever it stands."""
    name = module_name(path)
    package = name if path.name == '__init__.py' else name.rsplit('.', 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')
                base = base[: len(base) - node.level + 1]
                target = '.'.join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ''
            if target.split('.')[0] == 'zennit_attn':
                found += [(target, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, '') for alias in node.names if alias.name.split('.')[0] == 'zennit_attn']
    return found


FILES = sorted(ROOT.rglob('*.py'))
MODULES = {module_name(path) for path in FILES}


def graph() -> dict[str, set[str]]:
    edges = {}
    for path in FILES:
        targets = set()
        for target, name in imports(path):
            # `from . import rules` imports a module; `from .x import y` imports from x
            targets.add(f'{target}.{name}' if f'{target}.{name}' in MODULES else target)
        edges[module_name(path)] = targets - {module_name(path)}
    return edges


def test_no_import_cycle():
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :] + [target]
                pytest.fail('import cycle: ' + ' -> '.join(cycle))
            if state.get(target) is None:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if state.get(node) is None:
            visit(node)


#: The layers of the package, lowest first: a module imports only from its own subpackage or module and from earlier
#: layers, never from a module of its own layer or a later one. Every module of the package is in one layer; each
#: subpackage is one layer.
LAYERS = [
    # what zennit-attn knows of models and tensors below its rules (errors, module kinds, blocks, quantization,
    # devices, the audit of a forward), what an explanation is and how it looks, the real models that install offline
    ('zennit_attn.core', 'zennit_attn.results', 'zennit_attn.pretrained'),
    ('zennit_attn.rules',),  # the rules of modules and the product rules (zennit hooks)
    ('zennit_attn.operations',),  # the operation machinery: registry, classifying mode, marks, handlers
    ('zennit_attn.canonizers',),  # the zennit canonizers that apply it (and checkpointing) on a model instance
    ('zennit_attn.composites', 'zennit_attn.structure'),  # the named composites; what a transformer is made of
    ('zennit_attn.inputs',),  # requests and inputs: ids, texts, chats, images, targets -> a Task
    ('zennit_attn.methods',),  # the attribution methods
    ('zennit_attn.latent', 'zennit_attn.integrations'),  # neurons and concepts; captum and inseq
    ('zennit_attn.explain',),  # the front door
    ('zennit_attn.workflows',),  # generation, datasets, the conservation report, evaluation
    ('zennit_attn',),  # the package's __init__: the public names
    ('zennit_attn.cli',),
    ('zennit_attn.demo', 'zennit_attn.__main__'),
]


def home(module: str) -> tuple[int, str] | None:
    """``(layer, prefix)`` of ``module``: the longest prefix of :py:data:`LAYERS` that is the module or a package
    holding it (``'zennit_attn'`` only for the package's ``__init__``)."""
    matches = [
        (len(prefix), index, prefix)
        for index, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or (prefix != 'zennit_attn' and module.startswith(prefix + '.'))
    ]
    return max(matches)[1:] if matches else None


def test_every_module_has_a_layer():
    assert sorted(module for module in MODULES if home(module) is None) == []


def test_layers_run_one_way():
    """core, results, pretrained -> rules -> operations -> canonizers -> composites, structure -> inputs -> methods
    -> latent, integrations -> explain -> workflows -> the package's names -> cli -> demo: no module imports from
    another subpackage of its own layer or from a later layer, without exemptions."""
    wrong = []
    for source, targets in graph().items():
        layer, prefix = home(source)
        for target in targets:
            target_layer, target_prefix = home(target)
            if target_layer > layer or (target_layer == layer and target_prefix != prefix):
                wrong.append(f'{source} imports {target}')
    assert sorted(wrong) == []


#: The LRP engine: it knows models and tensors, not tokens or texts.
ENGINE = (
    'zennit_attn.core',
    'zennit_attn.rules',
    'zennit_attn.operations',
    'zennit_attn.canonizers',
    'zennit_attn.composites',
    'zennit_attn.structure',
)


def test_engine_imports_no_consumer():
    """The engine knows models and tensors: nothing of the inputs, methods or workflows built on it."""
    consumers = ('zennit_attn.explain', 'zennit_attn.inputs', 'zennit_attn.methods', 'zennit_attn.workflows')
    found = [
        (source, target)
        for source, targets in graph().items()
        if source.startswith(ENGINE)
        for target in targets
        if target.startswith(consumers)
    ]
    assert found == []


def test_the_public_homes_are_zennits():
    """A zennit user's imports, one package further: ``zennit_attn.composites``, ``.canonizers``, ``.rules``."""
    from zennit.canonizers import Canonizer
    from zennit.core import Composite, Hook

    from zennit_attn.canonizers import OperationCanonizer
    from zennit_attn.composites import AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma
    from zennit_attn.rules import Epsilon, Identity, NormIdentity, Uniform

    assert all(issubclass(cls, Composite) for cls in (AttnLRPEpsilon, AttnLRPGamma, CPLRPEpsilon, CPLRPGamma))
    assert issubclass(OperationCanonizer, Canonizer)
    assert (
        all(issubclass(cls, Hook) for cls in (Epsilon, Identity, NormIdentity))
        and Uniform().shares([None] * 4) == (0.25,) * 4
    )


def test_no_private_name_is_imported_across_modules():
    private = [
        (module_name(path), target, name)
        for path in FILES
        for target, name in imports(path)
        if name.startswith('_') and not (name.startswith('__') and name.endswith('__'))
    ]  # dunders are public
    assert not private
