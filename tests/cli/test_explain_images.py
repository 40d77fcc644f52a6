"""``zennit-attn explain --image``: a tiny LLaVA and a tiny CLIP saved with their processors, end to end; and the
refusals of ``--image`` before anything is loaded."""
from __future__ import annotations

import pytest
from PIL import Image

from tests.cli.conftest import refused, run
from tests.models import tiny_clip, tiny_llava
from tests.processors import clip_processor, image, llava_processor


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp('multimodal')
    for name, model, processor in (('llava', tiny_llava(zero_bias=True), llava_processor()),
                                   ('clip', tiny_clip(zero_bias=True), clip_processor())):
        model.save_pretrained(root / name)
        processor.save_pretrained(root / name)
    Image.fromarray(image()).save(root / 'picture.png')
    return root


@pytest.fixture
def tiny_folder(folders):  # the name lets conftest's no_loading allow loading
    return folders


def test_llava_end_to_end(capsys, tiny_folder):
    output = tiny_folder / 'out.html'
    code, out, err = run(capsys, ['explain', '--model', str(tiny_folder / 'llava'), '--prompt', '<image>The ice bear',
                                  '--image', str(tiny_folder / 'picture.png'), '--dtype', 'float64', '--method',
                                  'cplrp', '--output', str(output), '--quiet'])
    assert code == 0, err
    assert 'with 1 image(s)' in out and '[image 1]' in out and 'patch relevance' in out
    assert output.read_text(encoding='utf-8').count('data:image/png;base64,') == 1


def test_clip_end_to_end(capsys, tiny_folder):
    code, out, err = run(capsys, ['explain', '--model', str(tiny_folder / 'clip'), '--prompt', 'The ice bear',
                                  '--image', str(tiny_folder / 'picture.png'), '--dtype', 'float64', '--quiet'])
    assert code == 0, err
    assert 'CLIPModel' in out and 'similarity score' in out


def test_refusals(capsys, tmp_path):
    assert 'is not a file' in refused(capsys, ['explain', '--prompt', 'x', '--image', str(tmp_path / 'none.png')])
    picture = tmp_path / 'p.png'
    Image.fromarray(image()).save(picture)
    assert 'needs --model FOLDER' in refused(capsys, ['explain', '--prompt', 'x', '--image', str(picture)])
