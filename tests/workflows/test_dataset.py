"""explain_dataset() / load_explanations(): results equal single explain() calls, shards resume, damaged shards are
redone on resume and named on load, settings are checked, .jsonl input, and two processes (gloo on CPU, torchrun)
give the one-process result."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zennit_attn.workflows.dataset as dataset
from tests.models import tiny_model
from tests.text_tokenizer import CORPUS, byte_level_tokenizer
from zennit_attn import explain, explain_dataset, load_explanations
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config
from zennit_attn.workflows.dataset import (
    INDEX_FILE,
    SETTINGS_FILE,
    SettingsMismatchError,
    check_fingerprint,
    read_texts,
)

ROOT = Path(__file__).resolve().parents[2]
TEXTS = CORPUS[:6] + ['The bear.', 'Question: where does the penguin live?']


def relative_error(actual, expected):
    return float((actual - expected).abs().max()) / max(float(expected.abs().max()), 1e-300)


@pytest.fixture(scope='module')
def setup():
    return tiny_model('llama'), byte_level_tokenizer(pad=False)


def assert_same(loaded, reference, tol=0.0):
    assert len(loaded) == len(reference)
    for got, want in zip(loaded, reference):
        assert torch.equal(got.input_ids, want.input_ids)
        assert torch.equal(got.target, want.target) and torch.equal(got.position, want.position)
        assert relative_error(got.relevance, want.relevance) <= tol
        assert relative_error(got.logit, want.logit) <= tol


def test_results_equal_single_explain_calls(setup, tmp_path):
    model, tokenizer = setup
    explain_dataset(model, tokenizer, TEXTS, tmp_path, batch_size=3, shard_size=3, progress=False)
    loaded = load_explanations(tmp_path, tokenizer=tokenizer)
    single = [explain(model, text, tokenizer=tokenizer) for text in TEXTS]
    # batched with padding vs alone: round-off only (transformers' RMSNorm computes in float32 also in float64 models)
    assert_same(loaded, single, tol=1e-6)
    assert all(item.method == 'attnlrp' and item.tokenizer is tokenizer for item in loaded)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert len(index['shards']) == 3  # 8 texts, 3 per batch and shard
    lengths = [len(tokenizer(text)['input_ids']) for text in TEXTS]
    order = [item for shard in index['shards'] for item in shard['items']]
    assert sorted(order) == list(range(len(TEXTS)))
    assert [lengths[item] for item in order] == sorted(lengths, reverse=True)  # longest first: least padding


def test_resume_skips_finished_shards(setup, tmp_path, monkeypatch):
    model, tokenizer = setup
    explain_dataset(model, tokenizer, TEXTS, tmp_path, batch_size=2, shard_size=4, progress=False)
    first = load_explanations(tmp_path)
    (tmp_path / 'shard-00001.safetensors').unlink()  # an interrupted run: one shard and the index missing
    (tmp_path / INDEX_FILE).unlink()
    with pytest.raises(FileNotFoundError, match='resume'):
        load_explanations(tmp_path)
    calls = counting_explain(monkeypatch)
    explain_dataset(model, tokenizer, TEXTS, tmp_path, batch_size=2, shard_size=4, progress=False)
    assert len(calls) == 2  # the two batches of the missing shard
    assert_same(load_explanations(tmp_path), first)
    explain_dataset(model, tokenizer, TEXTS, tmp_path, batch_size=2, shard_size=4, progress=False)
    assert len(calls) == 2  # all done: nothing explained again


def test_other_settings_are_refused(setup, tmp_path):
    model, tokenizer = setup
    explain_dataset(model, tokenizer, TEXTS[:3], tmp_path, batch_size=2, progress=False)
    for change in (dict(method='cplrp'), dict(batch_size=1), dict(target=5), dict(texts=TEXTS[1:4])):
        arguments = dict(texts=TEXTS[:3], batch_size=2, progress=False)
        arguments.update(change)
        with pytest.raises(SettingsMismatchError, match='other settings'):
            explain_dataset(model, tokenizer, output_dir=tmp_path, **arguments)
    with pytest.raises(SettingsMismatchError, match='other settings'):
        explain_dataset(tiny_model('llama', seed=1), tokenizer, TEXTS[:3], tmp_path, batch_size=2, progress=False)


def test_jsonl_targets_positions_and_bad_input(setup, tmp_path):
    model, tokenizer = setup
    path = tmp_path / 'texts.jsonl'
    path.write_text(
        '\n'.join(json.dumps({'text': text, 'id': number}) for number, text in enumerate(TEXTS[:4])) + '\n\n'
    )
    assert read_texts(path) == TEXTS[:4] == read_texts(str(path))
    targets = [5, 7, 9, 11]
    explain_dataset(model, tokenizer, path, tmp_path / 'out', batch_size=4, target=targets, position=2, progress=False)
    loaded = load_explanations(tmp_path / 'out')
    single = [
        explain(model, text, tokenizer=tokenizer, target=target, position=2) for text, target in zip(TEXTS[:4], targets)
    ]
    assert_same(loaded, single, tol=1e-6)
    assert [int(item.target) for item in loaded] == targets
    bad = tmp_path / 'bad.jsonl'
    bad.write_text('{"text": "a"}\n{"txt": "b"}\n')
    with pytest.raises(ValueError, match='bad.jsonl:2 must be a JSON object with a string "text"'):
        explain_dataset(model, tokenizer, bad, tmp_path / 'x', progress=False)
    with pytest.raises(ValueError, match='list of texts or the path'):
        explain_dataset(model, tokenizer, 'The bear.', tmp_path / 'x', progress=False)
    with pytest.raises(ValueError, match='one integer per text'):
        explain_dataset(model, tokenizer, TEXTS[:2], tmp_path / 'x', target=[1], progress=False)
    with pytest.raises(ValueError, match='batch_size'):
        explain_dataset(model, tokenizer, TEXTS[:2], tmp_path / 'x', batch_size=0, progress=False)
    with pytest.raises(ValueError, match='out of range for text'):
        explain_dataset(model, tokenizer, TEXTS[:2], tmp_path / 'x', position=500, progress=False)
    assert not (tmp_path / 'x').exists()  # refused before anything was written


WORKER = """
import sys
import torch
sys.path.insert(0, {root!r})
torch.set_num_threads(1)
from tests.models import tiny_model
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain_dataset
texts = {texts!r}
explain_dataset(tiny_model('llama'), byte_level_tokenizer(pad=False), texts, sys.argv[1], batch_size=2,
                shard_size=2, progress=False)
assert torch.distributed.is_available() and not torch.distributed.is_initialized()  # created and destroyed
"""


@pytest.mark.slow  # two worker processes, each a fresh interpreter (about 30 s)
def test_two_processes_equal_one(setup, tmp_path):
    model, tokenizer = setup
    script = tmp_path / 'worker.py'
    script.write_text(WORKER.format(root=str(ROOT), texts=TEXTS))
    environment = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))
    completed = subprocess.run(
        [
            sys.executable,
            '-m',
            'torch.distributed.run',
            '--standalone',
            '--nproc-per-node',
            '2',
            str(script),
            str(tmp_path / 'two'),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    shards = sorted(path.name for path in (tmp_path / 'two').glob('shard-*.safetensors'))
    assert len(shards) == 4
    explain_dataset(model, tokenizer, TEXTS, tmp_path / 'one', batch_size=2, shard_size=2, progress=False)
    assert_same(load_explanations(tmp_path / 'two'), load_explanations(tmp_path / 'one'))
    assert json.loads((tmp_path / 'two' / INDEX_FILE).read_text()) == json.loads(
        (tmp_path / 'one' / INDEX_FILE).read_text()
    )


def test_method_params_are_keyword_arguments(setup, tmp_path):
    """A method's hyperparameters are keyword arguments, as for explain() (AtMan's forward batch is
    ``perturbation_batch``, next to the texts per call ``batch_size``); results equal explain() with the same
    hyperparameters, the settings record them, and another value is refused."""
    model, tokenizer = setup
    params = {'perturbation_batch': 3, 'p': 0.5}
    explain_dataset(model, tokenizer, TEXTS[:3], tmp_path, batch_size=2, method='atman', progress=False, **params)
    single = [explain(model, text, tokenizer=tokenizer, method='atman', **params) for text in TEXTS[:3]]
    assert_same(load_explanations(tmp_path), single, tol=1e-6)
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())['params'] == {'p': '0.5', 'perturbation_batch': '3'}
    with pytest.raises(SettingsMismatchError, match='differing: params'):
        explain_dataset(
            model,
            tokenizer,
            TEXTS[:3],
            tmp_path,
            batch_size=2,
            method='atman',
            perturbation_batch=3,
            p=0.9,
            progress=False,
        )
    # refused before anything is written: a name the method does not take, a value out of its range
    with pytest.raises(TypeError, match=r"attnlrp takes no parameter\(s\) \['latent'\]"):
        explain_dataset(model, tokenizer, TEXTS[:3], tmp_path / 'x', latent='mlp', progress=False)
    with pytest.raises(ValueError, match='steps must be a positive integer, got 0'):
        explain_dataset(
            model, tokenizer, TEXTS[:3], tmp_path / 'x', method='integrated_gradients', steps=0, progress=False
        )
    assert not (tmp_path / 'x').exists()


def test_check_fingerprint(setup, tmp_path):
    model, tokenizer = setup
    explain_dataset(model, tokenizer, TEXTS[:2], tmp_path, progress=False)
    check_fingerprint(tmp_path, model)  # the same model: accepted
    with pytest.raises(SettingsMismatchError, match='weights_sha256'):
        check_fingerprint(tmp_path, tiny_model('llama', seed=1))
    with pytest.raises(FileNotFoundError, match='not an explain_dataset'):
        check_fingerprint(tmp_path / 'missing', model)


def counting_explain(monkeypatch) -> list:
    """Count the explain() calls of explain_dataset (one per batch)."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return explain(*args, **kwargs)

    monkeypatch.setattr(dataset, 'explain', counting)
    return calls


def test_damaged_shards_are_redone_on_resume(setup, tmp_path, monkeypatch):
    """A truncated shard (a cut copy) and one with a changed byte (its safetensors header intact) are explained
    again on resume, with a warning, whether or not the index was written; the result equals a clean run, bit for
    bit. The old code skipped every shard that existed."""
    model, tokenizer = setup
    explain_dataset(model, tokenizer, TEXTS, tmp_path / 'clean', batch_size=2, shard_size=2, progress=False)
    clean = load_explanations(tmp_path / 'clean')
    for index_written in (True, False):
        out = tmp_path / f'index-{index_written}'
        explain_dataset(model, tokenizer, TEXTS, out, batch_size=2, shard_size=2, progress=False)
        truncated, changed = out / 'shard-00001.safetensors', out / 'shard-00002.safetensors'
        truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size - 7])
        data = bytearray(changed.read_bytes())
        data[-3] ^= 0x40  # a byte of the last tensor: the header still parses, the sizes still fit
        changed.write_bytes(bytes(data))
        if not index_written:
            (out / INDEX_FILE).unlink()
        calls = counting_explain(monkeypatch)
        with pytest.warns(UserWarning) as warned:
            explain_dataset(model, tokenizer, TEXTS, out, batch_size=2, shard_size=2, progress=False)
        messages = sorted(str(warning.message) for warning in warned)
        assert len(messages) == 2 and len(calls) == 2  # one batch per damaged shard, nothing else
        assert 'shard-00001.safetensors' in messages[0] and 'truncated' in messages[0]
        assert 'shard-00002.safetensors' in messages[1] and 'SHA-256' in messages[1]
        assert all(message.endswith('explaining its texts again') for message in messages)
        assert_same(load_explanations(out), clean)
        monkeypatch.undo()


def test_load_names_a_damaged_shard(setup, tmp_path):
    """load_explanations checks every shard against the size and SHA-256 in the index and names a damaged one
    (the old code returned the changed values silently, and failed inside safetensors for a truncated file)."""
    model, tokenizer = setup
    explain_dataset(model, tokenizer, TEXTS[:4], tmp_path, batch_size=2, shard_size=2, progress=False)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    path = tmp_path / 'shard-00001.safetensors'
    assert [shard['bytes'] for shard in index['shards']] == [
        (tmp_path / shard['file']).stat().st_size for shard in index['shards']
    ]
    assert (tmp_path / 'shard-00001.safetensors.sha256').read_text() == (
        f'{index["shards"][1]["sha256"]}  shard-00001.safetensors\n'
    )  # sha256sum -c reads it
    original = path.read_bytes()
    data = bytearray(original)
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(
        ValueError,
        match=f"^'{path}' is damaged \\(its SHA-256 is .*\\(changed bytes\\)\\): run "
        'explain_dataset\\(\\) again with the same arguments',
    ):
        load_explanations(tmp_path)
    path.write_bytes(original[:100])
    with pytest.raises(ValueError, match=f"^'{path}' is damaged \\(truncated: .*\\): run explain_dataset"):
        load_explanations(tmp_path)
    path.unlink()
    with pytest.raises(ValueError, match=f"^'{path}' is damaged \\(missing\\)"):
        load_explanations(tmp_path)


def test_output_dir_that_is_a_file_is_refused(setup, tmp_path, monkeypatch):
    """A file as the output directory (or as one of its parents) is refused with the reason before any text is
    explained (the old code failed in mkdir with "File exists")."""
    model, tokenizer = setup
    calls = counting_explain(monkeypatch)
    path = tmp_path / 'results.jsonl'
    path.write_text('{"text": "a"}\n')
    with pytest.raises(
        NotADirectoryError, match=f"^the output directory '{path}' is a file: pass the path of a new directory"
    ):
        explain_dataset(model, tokenizer, TEXTS[:2], path, progress=False)
    with pytest.raises(NotADirectoryError, match=f"cannot be created: '{path}' is a file"):
        explain_dataset(model, tokenizer, TEXTS[:2], path / 'out', progress=False)
    assert calls == [] and path.read_text() == '{"text": "a"}\n'


def test_a_one_token_text_with_kernelshap(setup, tmp_path):
    """A one-token text in a dataset explained by KernelSHAP: the run completes (one such text aborted the whole
    run inside captum) and gives what explain() gives for each text alone."""
    model, tokenizer = setup
    texts = ['The', TEXTS[0]]
    assert len(tokenizer('The')['input_ids']) == 1
    explain_dataset(model, tokenizer, texts, tmp_path, batch_size=1, method='kernelshap', samples=32, progress=False)
    loaded = load_explanations(tmp_path)
    single = [explain(model, text, tokenizer=tokenizer, method='kernelshap', samples=32) for text in texts]
    assert_same(loaded, single, tol=1e-6)
    assert loaded[0].relevance.shape == (1, 1) and torch.isfinite(loaded[0].relevance).all()


REFUSED_WORKER = """
import os
import sys
import torch
sys.path.insert(0, {root!r})
torch.set_num_threads(1)
from tests.models import tiny_model
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain_dataset
from zennit_attn.workflows.dataset import SettingsMismatchError
try:
    explain_dataset(tiny_model('llama'), byte_level_tokenizer(pad=False), {texts!r}, sys.argv[1], method='cplrp',
                    progress=False)
except SettingsMismatchError as error:
    print(f'rank {{os.environ["RANK"]}}: {{error}}')
    sys.exit(3)
"""


@pytest.mark.slow  # two worker processes, each a fresh interpreter (about 20 s)
def test_a_refused_directory_stops_every_rank(setup, tmp_path):
    """Rank 0 refuses a directory made with other settings; the other rank gets the refusal instead of waiting for
    rank 0 at a barrier (the run would hang until torchrun's timeout)."""
    model, tokenizer = setup
    explain_dataset(model, tokenizer, TEXTS[:4], tmp_path / 'out', progress=False)  # attnlrp
    script = tmp_path / 'worker.py'
    script.write_text(REFUSED_WORKER.format(root=str(ROOT), texts=TEXTS[:4]))
    environment = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))
    completed = subprocess.run(
        [
            sys.executable,
            '-m',
            'torch.distributed.run',
            '--standalone',
            '--nproc-per-node',
            '2',
            str(script),
            str(tmp_path / 'out'),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert completed.returncode != 0
    assert 'rank 1: rank 0 refused the output directory' in completed.stdout, completed.stdout + completed.stderr


def test_damaged_json_files_are_named_and_loads_are_copies(setup, tmp_path):
    """A damaged index.json or settings.json is named (not a bare JSONDecodeError); loaded explanations do not change
    when a shard file is changed afterwards (they are copies, not mapped from the file)."""
    model, tokenizer = setup
    explain_dataset(model, tokenizer, TEXTS[:4], tmp_path, batch_size=2, shard_size=2, progress=False)
    loaded = load_explanations(tmp_path)
    before = [explanation.relevance.clone() for explanation in loaded]
    path = tmp_path / 'shard-00000.safetensors'
    data = bytearray(path.read_bytes())
    with open(path, 'r+b') as handle:  # in place, as an editor or a second run would
        handle.seek(len(data) - 8)
        handle.write(bytes(byte ^ 0xFF for byte in data[-8:]))
    assert all(torch.equal(a.relevance, b) for a, b in zip(loaded, before))
    for name in (INDEX_FILE, 'settings.json'):
        target = tmp_path / name
        target.write_text(target.read_text()[:20])
        call = (
            (lambda: load_explanations(tmp_path))
            if name == INDEX_FILE
            else (
                lambda: explain_dataset(
                    model, tokenizer, TEXTS[:4], tmp_path, batch_size=2, shard_size=2, progress=False
                )
            )
        )
        with pytest.raises(ValueError, match=f"^'{target}' is damaged .*delete the output directory"):
            call()


def test_palrp_of_an_encoder_decoder_keeps_the_decoders_positions(tmp_path):
    """PA-LRP of an encoder-decoder model gives the decoder's positions their own relevance
    (``decoder_position_relevance``): the loaded explanation keeps it, so that ``with_positions()`` adds it to the
    decoder's tokens as for the single call. Before: not written (None when loaded), so the loaded pairs lacked the
    decoder positions (a tiny BART with a random table: pairs summing to -0.0014 where the single call's sum to
    0.322)."""
    model_type, config_type = model_class('seq2seq-lm', 'bart')
    torch.manual_seed(0)
    model = model_type(tiny_config(config_type)).double().eval()
    tokenizer = byte_level_tokenizer(pad=True)
    texts = ['The bear ate', 'A cat']
    explain_dataset(model, tokenizer, texts, tmp_path, batch_size=2, method='palrp', progress=False)
    for text, loaded in zip(texts, load_explanations(tmp_path, tokenizer=tokenizer)):
        single = explain(model, text, tokenizer=tokenizer, method='palrp')
        assert loaded.decoder_position_relevance is not None
        assert relative_error(loaded.decoder_position_relevance, single.decoder_position_relevance) <= 1e-12
        assert relative_error(loaded.position_relevance, single.position_relevance) <= 1e-12
        pairs, reference = loaded.with_positions(), single.with_positions()
        assert relative_error(pairs.decoder_relevance, reference.decoder_relevance) <= 1e-12
