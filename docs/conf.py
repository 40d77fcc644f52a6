"""Sphinx configuration of the zennit-attn documentation (``make docs`` builds it into ``docs/_build/html`` with
warnings as errors).

Pages are Markdown (MyST), the API reference comes from the NumPy-style docstrings (autodoc + napoleon), and the
notebooks of ``notebooks/`` are rendered as stored, without outputs and without executing them (myst-nb): they are
copied into ``docs/notebooks/`` (generated, git-ignored) at the start of every build.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import zennit_attn  # noqa: E402

project = 'zennit-attn'
author = 'the zennit-attn authors'
copyright = 'the zennit-attn authors; LGPL-3.0-or-later'
release = version = zennit_attn.__version__

extensions = [
    'myst_nb',  # Markdown pages and notebooks (includes myst_parser)
    'sphinx.ext.autodoc',  # API reference from the docstrings
    'sphinx.ext.napoleon',  # NumPy-style docstring sections
    'sphinx.ext.viewcode',  # source links
    'sphinx.ext.mathjax',
]

# ------------------------------------------------------------------------------------------------------ sources
source_suffix = {'.rst': 'restructuredtext', '.md': 'myst-nb', '.ipynb': 'myst-nb'}
root_doc = 'index'
# docs/results/ holds benchmark outputs that the README links to; they are not pages of the site
exclude_patterns = ['_build', 'results', 'Thumbs.db', '.DS_Store', '**.ipynb_checkpoints']

# the notebooks are kept in notebooks/ at the repository root; the site renders copies of them
NOTEBOOKS = ROOT / 'notebooks'
COPIES = DOCS / 'notebooks'
if COPIES.exists():
    shutil.rmtree(COPIES)
COPIES.mkdir()
for notebook in sorted(NOTEBOOKS.glob('*.ipynb')):
    shutil.copy2(notebook, COPIES / notebook.name)

# ---------------------------------------------------------------------------------------------------- MyST / notebooks
myst_enable_extensions = ['colon_fence', 'deflist', 'dollarmath']
myst_heading_anchors = 3
nb_execution_mode = 'off'  # stored without outputs; tests/notebooks/ executes them
nb_merge_streams = True

# ------------------------------------------------------------------------------------------------------ API reference
autodoc_default_options = {
    'members': True,
    'member-order': 'bysource',
    'show-inheritance': True,
    # document each object once, on the page of the module that defines it (packages re-export through __all__)
    'ignore-module-all': True,
}
autodoc_typehints = 'signature'
autodoc_preserve_defaults = True
autodoc_class_signature = 'separated'
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True  # dataclass "Attributes" sections as fields, not as second attribute entries
napoleon_use_rtype = False
napoleon_preprocess_types = False
add_module_names = False
python_use_unqualified_type_names = True

# ------------------------------------------------------------------------------------------------------ HTML
html_theme = 'furo'
html_title = f'zennit-attn {release}'
html_static_path = []
pygments_style = 'friendly'
