"""``zennit-attn faithfulness`` (:py:mod:`zennit_attn.cli.faithfulness`)."""

from __future__ import annotations

import json
import os

import pytest

from tests.cli.conftest import refused, run


@pytest.fixture
def finished(tmp_path):
    """A folder that passes the check for a finished explain-dataset output (it has an index)."""
    folder = tmp_path / 'explanations'
    folder.mkdir()
    (folder / 'index.json').write_text('{}')
    return folder


def test_faithfulness_refusals(capsys, tmp_path, finished):
    code, out, err = run(capsys, ['faithfulness', '--help'])
    assert code == 0 and 'examples:' in out and '--explanations' in out and '--mode' in out
    assert 'not a finished explain-dataset output' in refused(capsys, ['faithfulness', '--explanations', str(tmp_path)])
    base = ['faithfulness', '--explanations', str(finished)]
    assert '--steps must be at least 1' in refused(capsys, base + ['--steps', '0'])
    assert '--batch-size must be at least 1' in refused(capsys, base + ['--batch-size', '0'])
    assert 'names a mode twice' in refused(capsys, base + ['--mode', 'flipping', 'flipping'])


def test_csv_checked_before_loading(capsys, tmp_path, finished, monkeypatch):
    """A --csv that cannot be written is refused with exit status 2 before the model is loaded (it used to fail
    after the whole scoring)."""
    base = ['faithfulness', '--explanations', str(finished), '--csv']
    line = refused(capsys, base + [str(tmp_path)])
    assert line.startswith('zennit-attn: error: --csv: ') and 'is a directory' in line
    regular = tmp_path / 'file.txt'
    regular.write_text('not a folder')
    assert 'not a folder' in refused(capsys, base + [str(regular / 'scores.csv')])
    assert 'use one of .csv' in refused(capsys, base + [str(tmp_path / 'scores.txt')])
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
    line = refused(capsys, base + [str(folder / 'scores.csv')])
    assert 'cannot write' in line and 'permission' in line and str(folder) in line
    if os.path.isdir('/proc/self'):  # passes the permission check, refuses new files
        assert '/proc/scores.csv' in refused(capsys, base + ['/proc/scores.csv'])


def test_faithfulness_with_a_model_folder(capsys, tiny_folder, tmp_path):
    """The flipping MoRF area of the first text equals one computed by hand (word embeddings of the most relevant
    tokens set to 0, one token per step, the explained logit read from the model); another model is refused."""
    import csv

    import torch
    from transformers import AutoModelForCausalLM

    from tests.models import tiny_model
    from tests.text_tokenizer import CORPUS, byte_level_tokenizer
    from zennit_attn import load_explanations

    texts = tmp_path / 'texts.jsonl'
    texts.write_text(''.join(json.dumps({'text': text}) + '\n' for text in CORPUS[:3]))
    output = tmp_path / 'out'
    assert (
        run(
            capsys,
            [
                'explain-dataset',
                '--input',
                str(texts),
                '--output',
                str(output),
                '--model',
                str(tiny_folder['llama']),
                '-q',
            ],
        )[0]
        == 0
    )
    table = tmp_path / 'new' / 'scores.csv'  # its folder is made
    code, out, err = run(
        capsys,
        [
            'faithfulness',
            '--explanations',
            str(output),
            '--model',
            str(tiny_folder['llama']),
            '--steps',
            '1000',
            '--csv',
            str(table),
            '-q',
        ],
    )  # capped: one token per step
    assert code == 0 and err == '', err
    assert '3 texts explained by attnlrp' in out and 'flipping' in out and 'insertion' in out
    assert f'wrote {table.resolve()}' in out
    rows = list(csv.DictReader(table.open()))
    assert [(row['text'], row['mode']) for row in rows] == [
        (str(i), mode) for i in range(3) for mode in ('flipping', 'insertion')
    ]

    model = AutoModelForCausalLM.from_pretrained(tiny_folder['llama']).eval()
    explanation = load_explanations(output)[0]
    ids, relevance, target = explanation.input_ids[0], explanation.relevance[0], int(explanation.target[0])
    assert len(ids) >= 4
    order = torch.argsort(-relevance.double(), stable=True)
    points = []
    with torch.no_grad():
        for count in range(len(ids) + 1):
            embeddings = model.get_input_embeddings()(ids[None]).clone()
            embeddings[0, order[:count]] = 0
            points.append(float(model(inputs_embeds=embeddings).logits[0, -1, target]))
    assert float(rows[0]['area_morf']) == pytest.approx(sum(points) / len(points), rel=1e-5, abs=1e-6)
    assert float(rows[0]['score']) == pytest.approx(float(rows[0]['area_lerf']) - float(rows[0]['area_morf']))

    other = tmp_path / 'other'
    tiny_model('llama', dtype=torch.float32, seed=1).save_pretrained(other)
    byte_level_tokenizer().save_pretrained(other)
    capsys.readouterr()  # what loading the model above printed
    line = refused(capsys, ['faithfulness', '--explanations', str(output), '--model', str(other), '-q'], code=1)
    assert 'another model' in line and 'weights_sha256' in line
