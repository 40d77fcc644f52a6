"""notebooks/patching_circuits.ipynb runs top to bottom with small settings (tests/notebooks/runner.py)."""

import pytest

from tests.notebooks.runner import run


@pytest.mark.slow
@pytest.mark.notebooks
def test_runs(tmp_path):
    run('patching_circuits', tmp_path)
