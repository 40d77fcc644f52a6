"""The package's structure: imports between its modules run one way (no cycle, also not through imports inside
functions), no private name is imported across modules, and the old paths of moved modules still work, with a
deprecation warning."""
from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

import zennit_attn

ROOT = Path(zennit_attn.__file__).parent


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
                base = base[:len(base) - node.level + 1]
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
                cycle = stack[stack.index(target):] + [target]
                pytest.fail('import cycle: ' + ' -> '.join(cycle))
            if state.get(target) is None:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if state.get(node) is None:
            visit(node)


def test_layers_run_one_way():
    """rules -> canonizers -> composites -> task -> attention, lrp -> methods -> explain: no module imports from a
    later layer (the composite search, a consumer of explain and evaluation, sits on top)."""
    order = ['zennit_attn.layers', 'zennit_attn.module_kinds', 'zennit_attn.rules', 'zennit_attn.canonizers',
             'zennit_attn.composites', 'zennit_attn.task', 'zennit_attn.attention', 'zennit_attn.lrp',
             'zennit_attn.methods', 'zennit_attn.explain']

    def layer(module):
        matches = [index for index, prefix in enumerate(order) if module == prefix or module.startswith(prefix + '.')]
        return matches[-1] if matches else None

    for source, targets in graph().items():
        if source == 'zennit_attn.composites.search' or layer(source) is None:
            continue
        for target in targets:
            if layer(target) is not None:
                assert layer(target) <= layer(source), f'{source} imports {target}, a later layer'


def test_no_private_name_is_imported_across_modules():
    private = [(module_name(path), target, name) for path in FILES for target, name in imports(path)
               if name.startswith('_') and name != '__all__']
    assert not private


@pytest.mark.parametrize('old, new, name', [
    ('zennit_attn.heatmap', 'zennit_attn.render.text', 'render_html'),
    ('zennit_attn.viz', 'zennit_attn.render.image', 'overlay'),
    ('zennit_attn.models', 'zennit_attn.pretrained', 'load_smollm2'),
    ('zennit_attn.search', 'zennit_attn.composites.search', 'composite_search'),
    ('zennit_attn.types', 'zennit_attn.module_kinds', 'norm_kind'),
    ('zennit_attn.images', 'zennit_attn.task', 'ImageExplanation'),
])
def test_old_paths_warn_and_work(old, new, name):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        module = importlib.import_module(old)
    assert any(issubclass(warning.category, DeprecationWarning) and new in str(warning.message)
               or issubclass(warning.category, DeprecationWarning) and old in str(warning.message) for warning in caught)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
