"""``zennit-attn explain-dataset`` (:py:mod:`zennit_attn.cli.explain_dataset`)."""

from __future__ import annotations

import json
import os

import pytest

from tests.cli.conftest import refused, run


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / 'texts.jsonl'
    path.write_text('{"text": "The bear"}\n')
    return path


def test_manual_and_refusals(capsys, tmp_path, texts):
    code, out, err = run(capsys, ['explain-dataset', '--help'])
    assert code == 0 and err == '' and 'examples:' in out and 'zennit-attn explain-dataset' in out
    for option in (
        '--input',
        '--output',
        '--batch-size',
        '--shard-size',
        '--method',
        '--target',
        '--model',
        '--checkpointing',
    ):
        assert option in out
    assert 'required: --input, --output' in refused(capsys, ['explain-dataset'])
    line = refused(capsys, ['explain-dataset', '--input', str(tmp_path / 'missing.jsonl'), '--output', 'x'])
    assert 'does not exist' in line
    (tmp_path / 'texts.txt').write_text('The bear')
    assert 'must be a .jsonl file' in refused(
        capsys, ['explain-dataset', '--input', str(tmp_path / 'texts.txt'), '--output', 'x']
    )
    bad = tmp_path / 'bad.jsonl'
    bad.write_text('{"text": "a"}\n[1, 2]\n')
    assert 'bad.jsonl:2 must be a JSON object' in refused(
        capsys, ['explain-dataset', '--input', str(bad), '--output', 'x']
    )
    base = ['explain-dataset', '--input', str(texts), '--output', str(tmp_path / 'out')]
    assert '--batch-size must be at least 1' in refused(capsys, base + ['--batch-size', '0'])
    assert '--param' in refused(capsys, base + ['--param', 'steps=3'])
    assert 'id: must be followed' in refused(capsys, base + ['--target', 'id:x'])
    # a method without a backward pass: refused before loading (explain() refused it after loading, exit status 1)
    for method in ('atman', 'attention_rollout', 'kernelshap', 'random'):
        line = refused(capsys, base + ['--method', method, '--checkpointing'])
        assert (
            f'--checkpointing saves memory of a backward pass, which --method {method} does not do; it applies '
            'to attnlrp, cplrp, palrp, attnlrp_late, input_x_gradient, integrated_gradients, smoothgrad, '
            'grad_attention_rollout, gradcam' in line
        )
    assert not (tmp_path / 'out').exists()


def test_output_that_is_a_file(capsys, texts):
    """A file as the output folder: exit status 2 before loading, the file untouched."""
    line = refused(capsys, ['explain-dataset', '--input', str(texts), '--output', str(texts)])
    assert line.startswith('zennit-attn: error: --output: ') and str(texts) in line and 'is a file' in line
    assert texts.read_text() == '{"text": "The bear"}\n'
    line = refused(capsys, ['explain-dataset', '--input', str(texts), '--output', str(texts / 'below')])
    assert str(texts) in line and 'is a file' in line


def test_output_not_writable(capsys, tmp_path, texts, monkeypatch):
    """A folder one may not write in (os.access says no, as for an ordinary user in a read-only folder; root may
    write anywhere): exit status 2 before loading, for a new output folder in it and for the folder itself."""
    folder = tmp_path / 'read-only'
    folder.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os,
        'access',
        lambda path, mode, *args, **kwargs: (
            False if str(path) == str(folder) and mode & os.W_OK else real_access(path, mode, *args, **kwargs)
        ),
    )
    for output in (folder / 'out', folder):
        line = refused(capsys, ['explain-dataset', '--input', str(texts), '--output', str(output)])
        assert line.startswith('zennit-attn: error: --output: ') and str(folder) in line and 'writ' in line
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc, a folder that refuses new files')
def test_output_where_the_file_system_refuses(capsys, texts):
    """/proc passes the permission check (os.access says yes to root) but refuses new folders: found before
    anything is loaded."""
    line = refused(capsys, ['explain-dataset', '--input', str(texts), '--output', '/proc/zennit-attn-explanations'])
    assert '/proc/zennit-attn-explanations' in line


def test_explain_dataset_with_a_model_folder(capsys, tiny_folder, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.text_tokenizer import CORPUS
    from zennit_attn import explain, load_explanations

    texts = tmp_path / 'texts.jsonl'
    texts.write_text(''.join(json.dumps({'text': text}) + '\n' for text in CORPUS[:5]))
    output = tmp_path / 'out'
    argv = [
        'explain-dataset',
        '--input',
        str(texts),
        '--output',
        str(output),
        '--model',
        str(tiny_folder['llama']),
        '--batch-size',
        '2',
        '--target',
        'id:5',
        '-q',
    ]
    code, out, err = run(capsys, argv)
    assert code == 0 and err == '', err
    assert 'Explained 5 texts with attnlrp' in out and str(output.resolve()) in out
    model = AutoModelForCausalLM.from_pretrained(tiny_folder['llama']).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder['llama'])
    for text, loaded in zip(CORPUS[:5], load_explanations(output)):
        single = explain(model, text, tokenizer=tokenizer, target=5)
        assert int(loaded.target) == 5
        assert float((loaded.relevance - single.relevance).abs().max()) <= 1e-4 * float(single.relevance.abs().max())
    assert run(capsys, argv)[0] == 0  # resumes: everything done
    line = refused(capsys, argv[:-3] + ['--method', 'cplrp', '-q'], code=1)
    assert 'other settings' in line and torch.is_tensor(loaded.relevance)
    # a method parameter reaches the method (and the recorded settings)
    other = tmp_path / 'ig'
    code, out, err = run(
        capsys, argv[:4] + [str(other)] + argv[5:] + ['--method', 'integrated_gradients', '--param', 'steps=3']
    )
    assert code == 0 and err == '', err
    assert 'integrated_gradients (steps=3)' in out
    first = load_explanations(other)[0]
    single = explain(model, CORPUS[0], tokenizer=tokenizer, target=5, method='integrated_gradients', steps=3)
    assert float((first.relevance - single.relevance).abs().max()) <= 1e-4 * float(single.relevance.abs().max())
