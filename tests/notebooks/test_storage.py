"""The notebooks are stored without outputs, with a parameters cell the test settings override, and each has its
test file ``tests/notebooks/test_<name>.py`` (which runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.notebooks.runner import NOTEBOOKS, SETTINGS, parameters_index, read


def test_notebooks_found():
    names = {path.stem for path in NOTEBOOKS}
    assert {'quickstart', 'generation', 'vision', 'faithfulness'} <= names
    assert names <= set(SETTINGS), f'give every notebook small settings in SETTINGS: {sorted(names - set(SETTINGS))}'
    tested = {path.stem.removeprefix('test_') for path in Path(__file__).parent.glob('test_*.py')} - {'storage'}
    assert names == tested, f'every notebook needs tests/notebooks/test_<name>.py: {sorted(names ^ tested)}'


@pytest.mark.parametrize('path', NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_stored_without_outputs(path):
    """Notebooks are committed stripped: no outputs, no execution counts, one parameters cell whose names the
    settings override."""
    notebook = read(path)
    assert notebook['nbformat'] == 4
    assert notebook['metadata']['kernelspec']['name'] == 'python3'
    for number, cell in enumerate(notebook['cells']):
        if cell['cell_type'] == 'code':
            assert cell['outputs'] == [], f'cell {number} has outputs: clear them before committing'
            assert cell['execution_count'] is None, f'cell {number} has an execution count'
    index = parameters_index(notebook['cells'])
    source = ''.join(notebook['cells'][index]['source'])
    for name in SETTINGS[path.stem]:
        assert f'\n{name} = ' in f'\n{source}', f'{name} is not set in the parameters cell of {path.name}'
