"""The dequantised SmolLM2 kept in the cache folder is the model read from the GGUF file (same weights, tokenizer and
chat template), and the cache folder follows its environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zennit_attn.pretrained import cache_folder, load_smollm2


@pytest.mark.slow  # the real SmolLM2-135M, dequantised from its GGUF file again (about 60 s)
def test_cached_model_equals_the_gguf_model(smollm2):
    cached, cached_tokenizer = smollm2
    model, tokenizer = load_smollm2(cache=False)
    assert model.config.to_dict().keys() - {'quantization_config'} <= cached.config.to_dict().keys()
    state, cached_state = model.state_dict(), cached.state_dict()
    assert state.keys() == cached_state.keys()
    assert all(torch.equal(state[name], cached_state[name]) for name in state)
    text = 'The Eiffel Tower is located in the city of'
    assert tokenizer(text).input_ids == cached_tokenizer(text).input_ids
    assert tokenizer.chat_template == cached_tokenizer.chat_template
    assert (tokenizer.eos_token, tokenizer.bos_token) == (cached_tokenizer.eos_token, cached_tokenizer.bos_token)


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv('ZENNIT_ATTN_CACHE', str(tmp_path / 'a'))
    assert cache_folder() == tmp_path / 'a'
    monkeypatch.delenv('ZENNIT_ATTN_CACHE')
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'b'))
    assert cache_folder() == tmp_path / 'b' / 'zennit-attn'
    monkeypatch.delenv('XDG_CACHE_HOME')
    assert cache_folder() == Path.home() / '.cache' / 'zennit-attn'
