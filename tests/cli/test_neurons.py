"""``zennit-attn neurons`` (:py:mod:`zennit_attn.cli.neurons`)."""

from __future__ import annotations

import pytest

from tests.cli.conftest import PROMPT, refused, run
from zennit_attn.cli.errors import UsageError
from zennit_attn.cli.neurons import parse_layers


@pytest.mark.parametrize(
    'argv, message',
    [
        (
            ['--method', 'atman'],
            '--method atman does not record latent relevance; use one of attnlrp, cplrp, palrp, attnlrp_late, '
            'input_x_gradient',
        ),
        (['--top', '0'], '--top must be at least 1'),
        (['--vocabulary', '-1'], '--vocabulary must be 0 or more'),
        (['--layers', '3-x'], "--layers '3-x': give a range"),
        (['--layers', '-2'], 'give layer indices >= 0'),
        (['--site', 'residual'], "argument --site: invalid choice: 'residual'"),
    ],
)
def test_neurons_refusals(capsys, argv, message):
    assert message in refused(capsys, ['neurons', '--prompt', PROMPT, *argv])


def test_parse_layers():
    assert parse_layers(None) is None
    assert parse_layers('3-5') == [3, 4, 5]
    assert parse_layers('2') == [2] and parse_layers('10,12') == [10, 12]
    assert parse_layers('1,1') == [1] and parse_layers('12,10,12') == [10, 12]  # each layer once
    with pytest.raises(UsageError):
        parse_layers('5-3')  # an empty range


def ranked_lines(out: str, unit: str = 'FFN neuron') -> list[str]:
    return [line for line in out.splitlines() if f' {unit} ' in line and 'relevance' in line]


def test_neurons_with_a_model_folder(capsys, tiny_folder):
    """The printed ranking is top_neurons() of the same explanation, each mlp neuron with the tokens its down
    projection column promotes (the bottom of the vocabulary projection where the activation is negative)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zennit_attn import explain
    from zennit_attn.latent import Neuron, top_neurons, vocabulary_projection
    from zennit_attn.results.render.tokens import token_texts

    prompt = 'The ice bear lives in the'
    code, out, err = run(
        capsys,
        [
            'neurons',
            '--prompt',
            prompt,
            '--model',
            str(tiny_folder['llama']),
            '--top',
            '3',
            '--vocabulary',
            '2',
            '--layers',
            '1',
            '-q',
        ],
    )
    assert code == 0 and err == '', err
    model = AutoModelForCausalLM.from_pretrained(tiny_folder['llama']).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_folder['llama'])
    capsys.readouterr()  # the loaders' progress bars
    exp = explain(model, prompt, tokenizer=tokenizer, latent=('mlp',))
    per_layer = exp.latent['mlp'][0].sum((1, 2)).tolist()
    for layer, value in enumerate(per_layer):
        assert f'layer {layer:>3}  {value:+10.4f}' in out
    ranked = top_neurons(exp, k=3, site='mlp', layers=[1])
    assert len(ranked) == 3 and all(item.layer == 1 for item in ranked)
    lines = [line for line in out.splitlines() if 'FFN neuron' in line and 'promotes' in line]
    assert len(lines) == 3
    for line, item in zip(lines, ranked):
        assert f'layer {item.layer:>3}  FFN neuron {item.index:>6}  relevance {item.relevance:+.4f}' in line
        projection = vocabulary_projection(model, Neuron('mlp', item.layer, item.index), k=2)
        promoted = projection.top if item.activation >= 0 else projection.bottom
        texts = token_texts(tokenizer, [token for token, _, _ in promoted])
        assert line.endswith('promotes ' + ', '.join(repr(text) for text in texts))
    # a layer named twice: the same ranking as named once, each neuron listed once
    code, twice, err = run(
        capsys,
        [
            'neurons',
            '--prompt',
            prompt,
            '--model',
            str(tiny_folder['llama']),
            '--top',
            '3',
            '--vocabulary',
            '2',
            '--layers',
            '1,1',
            '-q',
        ],
    )
    assert code == 0 and err == '', err
    assert ranked_lines(twice) == ranked_lines(out) and len(ranked_lines(twice)) == 3
    # a layer the model does not have: one line, exit status 1
    line = refused(
        capsys, ['neurons', '--prompt', prompt, '--model', str(tiny_folder['llama']), '--layers', '9', '-q'], code=1
    )
    assert 'the model has 2 layers' in line
    # heads under CP-LRP
    code, out, err = run(
        capsys,
        [
            'neurons',
            '--prompt',
            prompt,
            '--model',
            str(tiny_folder['llama']),
            '--site',
            'attention',
            '--method',
            'cplrp',
            '-q',
        ],
    )
    assert code == 0 and 'Top-' in out and ' head ' in out and 'promotes' not in out
