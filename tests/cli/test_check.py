"""``zennit-attn check`` (:py:mod:`zennit_attn.cli.check`): will my model work? The verdict on a tiny random model of
the architecture of a model folder or a ``model_type``, its exit status, and the refusals of bad arguments."""

from __future__ import annotations

import json
import math
import re

import pytest
import transformers

from tests.cli.conftest import refused, run
from zennit_attn.cli.check import Architecture
from zennit_attn.cli.runs.check import verdict
from zennit_attn.workflows.architecture_check import check_architecture, check_config
from zennit_attn.workflows.architecture_check.check import Result
from zennit_attn.workflows.architecture_check.configs import tiny_copy

VERSION = transformers.__version__


def ratio_of(line: str) -> float:
    """The ratio ``(ratio R)`` of an explained verdict."""
    return float(line.split('(ratio ')[1].split(')')[0])


def test_a_model_type_is_explained(capsys):
    code, out, err = run(capsys, ['check', '--model', 'llama', '--quiet'])
    assert code == 0 and err == ''
    model, line, attnlrp = out.splitlines()
    assert model == (
        f'model: llama (a model_type of transformers {VERSION}), checked as causal-lm, on a tiny random model in '
        'float64 with zero biases'
    )
    assert attnlrp.startswith("AttnLRP: with the softmax rule's bias term handed back, its relevance / logit = 1.0")
    assert attnlrp.endswith(': its other rules lose nothing')
    assert line.startswith("verdict: explained: CP-LRP's relevance at the inputs sums to the explained logit (ratio ")
    assert line.endswith(') and AttnLRP runs: zennit-attn explains this architecture')
    assert abs(ratio_of(line) - 1) <= 1e-6
    # the verdict of the supported-models page for the same architecture
    assert ratio_of(line) == pytest.approx(check_architecture('causal-lm', 'llama').ratio, abs=5e-13)


def test_a_refusal_names_the_operation_and_the_module(capsys):
    code, out, err = run(capsys, ['check', '--model', 'minimax', '--quiet'])
    assert code == 1 and err == ''
    assert out.splitlines()[-1].startswith(
        "verdict: refused: zennit-attn cannot explain matmul in 'model.layers.1.self_attn' "
        '(MiniMaxLightningAttention): '
    )


def test_the_rules_of_each_operation(capsys):
    """``--rules cplrp``: after the verdict, the dry run's table of the tiny model: module by module the operation, its
    rule and what the engine does (CP-LRP's shares by the kinds of the factors), nothing refused."""
    code, out, err = run(capsys, ['check', '--model', 'llama', '--rules', 'cplrp', '--quiet'])
    assert code == 0 and err == ''
    lines = out.splitlines()
    assert lines[1].startswith('verdict: explained') and lines[2].startswith('AttnLRP: ') and lines[3] == ''
    assert (
        lines[4]
        == 'rules of LlamaForCausalLM under CPLRPEpsilon (products: ConstantGates()) (dry run: no backward pass)'
    )
    assert lines[5].split() == ['module', 'operation', 'rule', 'what', 'the', 'engine', 'does', 'count']
    rows = [re.split(r'\s{2,}', line.strip()) for line in lines[6:-1]]
    assert [
        'model.layers.*.mlp',
        'mul',
        'product',
        'ConstantGates(): shares (0, 1) of the factors (activation, value)',
        '2',
    ] in rows
    assert ['model.layers.*.mlp.act_fn', 'SiLUActivation (module)', 'module rule', 'Identity', '2'] in rows
    assert lines[-1] == 'refused: nothing'


def test_the_rules_of_a_refused_model_list_the_refusal(capsys):
    """``--rules`` (AttnLRP by default) on a model that is refused: the table goes on past the refusal and lists it."""
    code, out, _ = run(capsys, ['check', '--model', 'minimax', '--rules', '--quiet'])
    assert code == 1
    assert '\nrules of MiniMaxForCausalLM under AttnLRPEpsilon (products: Uniform())' in out
    assert (
        "\nrefused: zennit-attn cannot explain matmul in 'model.layers.*.self_attn' (MiniMaxLightningAttention)" in out
    )
    assert 'refused (see below)' in out


def test_vision_language_models_are_fed_pixels(capsys):
    code, out, _ = run(capsys, ['check', '--model', 'llava', '--quiet'])
    assert code == 0
    model, inputs, line, _ = out.splitlines()
    assert 'checked as image-text-to-text' in model
    assert inputs.startswith('inputs: text + image (pixels via processor), pixel share '), inputs
    assert abs(ratio_of(line) - 1) <= 1e-6


def test_a_model_folder(capsys, tmp_path):
    """A folder with only a config.json of real sizes (SmolLM2-135M's): a tiny copy of it is built and explained; the
    progress line names the folder."""
    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
        architectures=['LlamaForCausalLM'],
    )
    config.save_pretrained(tmp_path)
    for argv in (['--model', str(tmp_path)], ['--model', str(tmp_path / 'config.json')]):
        code, out, err = run(capsys, ['check', *argv])
        assert code == 0, (out, err)
        assert err.startswith(f'zennit-attn: checking {tmp_path} on a tiny random model ... done (')
        model, line, _ = out.splitlines()
        assert model.startswith(f'model: {tmp_path} (model_type llama), checked as causal-lm, on a tiny random')
        assert abs(ratio_of(line) - 1) <= 1e-6


def test_a_folder_the_check_cannot_read_fails_with_one_line(capsys, tmp_path):
    (tmp_path / 'config.json').write_text(json.dumps({'model_type': 'frobnicate'}))
    line = refused(capsys, ['check', '--model', str(tmp_path), '-q'], code=1)
    assert line.startswith(f'zennit-attn: error: cannot read the configuration of {tmp_path}: ')


def test_an_unknown_model_type_is_refused_with_the_closest(capsys):
    line = refused(capsys, ['check', '--model', 'lama'])
    assert f"--model 'lama' is no model folder here, nor a model_type of transformers {VERSION}" in line
    assert 'did you mean llama' in line and line.endswith("; see 'zennit-attn check --help'")


@pytest.mark.parametrize(
    'value, message',
    [
        ('', '--model is empty'),
        ('no/such/folder', "--model 'no/such/folder': no such file or folder, and not a model_type"),
    ],
)
def test_bad_values_are_refused(capsys, value, message):
    line = refused(capsys, ['check', '--model', value])
    assert message in line and line.endswith("; see 'zennit-attn check --help'")


def test_an_unknown_method_of_the_rules_is_refused(capsys):
    line = refused(capsys, ['check', '--model', 'llama', '--rules', 'gamma'])
    assert "argument --rules: invalid choice: 'gamma' (choose from 'attnlrp', 'cplrp')" in line


def test_bad_paths_are_refused(capsys, tmp_path):
    assert 'is a folder without config.json' in refused(capsys, ['check', '--model', str(tmp_path)])
    weights = tmp_path / 'model.safetensors'
    weights.write_bytes(b'')
    assert 'is neither a model folder nor its config.json' in refused(capsys, ['check', '--model', str(weights)])
    (tmp_path / 'config.json').write_text('{"model_type": ')
    assert 'cannot read its config.json' in refused(capsys, ['check', '--model', str(tmp_path)])


def test_verdicts_say_what_they_mean():
    folder = Architecture(model_type='x')
    built = Result('', 'vit', 'not built', 'no model class for model_type')
    assert verdict(folder, built)[-1] == (
        'verdict: not built: no model class for model_type; the tiny random model could not be built or run: a '
        'limit of the check, not necessarily of zennit-attn'
    )
    assert 'in none of the mappings causal-lm, image-text-to-text, masked-lm, seq2seq-lm' in verdict(folder, built)[0]
    failed = Result('causal-lm', 'x', 'failed', 'CP-LRP relevance / logit = 0.5')
    assert verdict(folder, failed)[-1] == (
        'verdict: failed: CP-LRP relevance / logit = 0.5; a defect of zennit-attn: please report it with this line'
    )


def test_a_model_that_adds_constants_is_explained_with_the_reason(capsys):
    """Pegasus-X adds its sinusoidal position embeddings, a constant tensor of its code that the check cannot zero,
    to the token embeddings: explained, not exactly conservative, and the verdict says where (the module whose code
    adds it: the encoder)."""
    code, out, _ = run(capsys, ['check', '--model', 'pegasus_x', '-q'])
    assert code == 0
    verdict, attnlrp = out.splitlines()[-2:]
    assert verdict.startswith(
        'verdict: explained: not exactly conservative by design: the model adds the constant tensor of shape '
        "[1, 6, 32] (largest |value| 1) at 'model.encoder' "
    )
    assert attnlrp.endswith('(docs: Rules, where AttnLRP loses relevance); anything else is a defect')


def test_check_config_leaves_the_configuration_as_it_was():
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=6, num_attention_heads=8)
    before = config.to_dict()
    tiny = tiny_copy(config)
    assert (tiny.vocab_size, tiny.hidden_size, tiny.num_hidden_layers, tiny.num_attention_heads) == (96, 32, 2, 4)
    result = check_config(config)
    assert config.to_dict() == before
    assert (result.mapping, result.architecture, result.status) == ('causal-lm', 'llama', 'explained')
    assert math.isclose(result.ratio, 1, abs_tol=1e-6)
