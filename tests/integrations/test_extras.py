"""The integrations name the extra that installs what they need, where it is missing."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ('module', 'package', 'extra'),
    [('zennit_attn.integrations.captum', 'captum', 'captum'), ('zennit_attn.integrations.inseq', 'inseq', 'inseq')],
)
def test_missing_package_names_the_extra(monkeypatch, module, package, extra):
    """With the package unimportable (``sys.modules[name] = None`` makes ``import name`` raise), importing the
    integration raises an ImportError that says which extra to install."""
    for name in [name for name in sys.modules if name == package or name.startswith(f'{package}.')]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    if package == 'inseq':  # the inseq integration imports the captum one, which must not be the failure here
        monkeypatch.delitem(sys.modules, 'zennit_attn.integrations.captum', raising=False)
        pytest.importorskip('captum')
    with pytest.raises(ImportError, match=rf"pip install 'zennit-attn\[{extra}\]'"):
        importlib.import_module(module)
