"""Models larger than memory: a model loaded with accelerate's ``device_map`` (disk offload) or wrapped by
``accelerate.cpu_offload`` (weights on the meta device, loaded by accelerate's hooks for each forward) gives the
relevance of the same model on one device, with and without checkpointing; the model check still refuses meta
weights that nothing loads."""
import pytest
import torch

from tests.conftest import ENCODER_DECODERS, decoder_ids, tiny_model, token_ids
from zennit_attn import explain

accelerate = pytest.importorskip('accelerate')
transformers = pytest.importorskip('transformers')

#: family -> Auto class of its head
HEADS = {'llama': 'AutoModelForCausalLM', 'gpt2': 'AutoModelForCausalLM', 'mixtral': 'AutoModelForCausalLM',
         't5': 'AutoModelForSeq2SeqLM', 'bert': 'AutoModelForMaskedLM'}


def relative_error(actual, expected):
    return float((actual - expected).abs().max()) / float(expected.abs().max())


def load(folder, family, **kwargs):
    extra = {'experts_implementation': 'eager'} if family == 'mixtral' else {}
    cls = getattr(transformers, HEADS[family])
    return cls.from_pretrained(folder, dtype=torch.float64, attn_implementation='eager', **extra, **kwargs).eval()


@pytest.fixture(scope='module', params=list(HEADS))
def saved(request, tmp_path_factory):
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    tiny_model(family, 'masked_lm' if family == 'bert' else None).save_pretrained(folder)
    return family, folder


def inputs(family):
    extra = {'decoder_input_ids': decoder_ids(family, 3, 2)} if family in ENCODER_DECODERS else {}
    return token_ids(family, 12, 2), extra


def check(model, reference, family):
    ids, extra = inputs(family)
    for checkpointing in (False, True):
        explanation = explain(model, ids, checkpointing=checkpointing, **extra)
        assert relative_error(explanation.relevance, reference.relevance) <= 1e-12
        assert relative_error(explanation.logit, reference.logit) <= 1e-12
        if reference.decoder_relevance is not None:
            assert relative_error(explanation.decoder_relevance, reference.decoder_relevance) <= 1e-12


def test_cpu_offload_equals_one_device(saved):
    family, folder = saved
    ids, extra = inputs(family)
    reference = explain(load(folder, family), ids, **extra)
    model = load(folder, family)
    accelerate.cpu_offload(model, execution_device=torch.device('cpu'))
    assert any(parameter.is_meta for parameter in model.parameters())
    check(model, reference, family)
    assert any(parameter.is_meta for parameter in model.parameters())  # still offloaded afterwards


def test_disk_offload_device_map_equals_one_device(saved, tmp_path):
    family, folder = saved
    ids, extra = inputs(family)
    reference_model = load(folder, family)
    reference = explain(reference_model, ids, **extra)
    # every second transformer block on disk, the other blocks and every module with weights outside them on the CPU
    from zennit_attn.checkpointing import transformer_blocks
    names = {id(module): name for name, module in reference_model.named_modules()}
    blocks = [names[id(block)] for block in transformer_blocks(reference_model)]
    device_map = {name: 'disk' if index % 2 else 'cpu' for index, name in enumerate(blocks)}
    for name, module in reference_model.named_modules():
        inside = any(name == block or name.startswith(block + '.') for block in blocks)
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        if own and not inside:
            device_map[name] = 'cpu'
    model = load(folder, family, device_map=device_map, offload_folder=str(tmp_path / 'offload'))
    assert any(parameter.is_meta for parameter in model.parameters())
    check(model, reference, family)


def test_meta_weights_without_offloading_are_refused():
    with torch.device('meta'):
        model = transformers.LlamaForCausalLM(tiny_model('llama').config).eval()
    with pytest.raises(ValueError, match='meta device'):
        explain(model, token_ids('llama', 4))
