"""``zennit-attn generate`` (:py:mod:`zennit_attn.cli.generate`)."""

from __future__ import annotations

import pytest

from tests.cli.conftest import PROMPT, refused, run


def test_bad_arguments(capsys):
    assert '--max-new-tokens must be at least 1' in refused(
        capsys, ['generate', '--prompt', PROMPT, '--max-new-tokens', '0']
    )


def test_generate_with_a_model_folder(capsys, tiny_folder, tmp_path):
    output = tmp_path / 'answer.html'
    code, out, err = run(
        capsys,
        [
            'generate',
            '--prompt',
            'Question: where does the ice bear live? Answer:',
            '--model',
            str(tiny_folder['llama']),
            '--max-new-tokens',
            '2',
            '--output',
            str(output),
            '--color',
            'never',
        ],
    )
    assert code == 0, err
    assert 'Answer:      ' in out and 'whole answer' in out and output.stat().st_size > 0
    assert 'generating up to 2 tokens' in err


@pytest.mark.slow
def test_generate_end_to_end(capsys, builtin, tmp_path):
    output = tmp_path / 'a.html'
    code, out, err = run(
        capsys, ['generate', '--prompt', PROMPT, '--max-new-tokens', '3', '--output', str(output), '--color', 'never']
    )
    assert code == 0, err
    assert "Answer:      ' Paris" in out and '(3 tokens)' in out
    assert 'whole answer' in out and 'prompt: ' in out  # the heatmap over prompt and answer
    assert f'Wrote the interactive page (click a generated token for its heatmap) to {output.resolve()}' in out
    assert output.stat().st_size > 0 and '<html' in output.read_text().lower()


def test_generate_with_a_contrast(capsys, tiny_folder):
    code, out, err = run(
        capsys,
        [
            'generate',
            '--prompt',
            'Question: where does the ice bear live? Answer:',
            '--model',
            str(tiny_folder['llama']),
            '--max-new-tokens',
            '2',
            '--contrast',
            'runner-up',
            '--color',
            'never',
            '-q',
        ],
    )
    assert code == 0, err
    assert 'Contrast:    ' in out and 'the logit differences are explained' in out
    assert 'whole answer rather than the contrast tokens' in out
    assert "--contrast 'id:x'" in refused(capsys, ['generate', '--prompt', PROMPT, '--contrast', 'id:x'])
