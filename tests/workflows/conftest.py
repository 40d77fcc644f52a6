"""Fixtures of the patching tests (test_patching.py, test_patching_edges.py, test_patching_names.py): a tiny random
float64 Llama and prompt pairs that differ in one token."""

from __future__ import annotations

import pytest

from tests.models import tiny_model, token_ids


@pytest.fixture(scope='module')
def llama():
    """A tiny random Llama with grouped-query attention (the edge tests score keys and values per key-value head)."""
    model = tiny_model('llama')
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    return model


@pytest.fixture(scope='module')
def pairs(llama):
    """Three prompt pairs of 6 tokens whose corrupted prompt differs at position 2."""
    clean = token_ids('llama', 6, 3)
    corrupted = clean.clone()
    corrupted[:, 2] = (corrupted[:, 2] + 7) % llama.config.vocab_size
    return clean, corrupted
