"""Models larger than memory: a model loaded with accelerate's ``device_map`` (disk offload) or wrapped by
``accelerate.cpu_offload`` (weights on the meta device, loaded by accelerate's hooks for each forward) gives the
relevance of the same model on one device, with and without checkpointing, and the same generation explanations,
reference samples and vocabulary projections (whose inputs go to the device the model computes on, not to that of
its first, meta, parameter); the model check still refuses meta weights that nothing loads."""

import pytest
import torch

from tests.models import ENCODER_DECODERS, decoder_ids, tiny_model, token_ids
from tests.text_tokenizer import byte_level_tokenizer
from zennit_attn import explain, explain_generation
from zennit_attn.latent import Neuron, reference_samples, vocabulary_projection

accelerate = pytest.importorskip('accelerate')
transformers = pytest.importorskip('transformers')

#: family -> Auto class of its head
HEADS = {
    'llama': 'AutoModelForCausalLM',
    'gpt2': 'AutoModelForCausalLM',
    'mixtral': 'AutoModelForCausalLM',
    't5': 'AutoModelForSeq2SeqLM',
    'bert': 'AutoModelForMaskedLM',
}


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


def trainable(model) -> dict[str, bool]:
    return {name: parameter.requires_grad for name, parameter in model.named_parameters()}


@pytest.mark.parametrize('method', ['cplrp', 'attnlrp'])
def test_offloaded_parameters_are_left_trainable(saved, tmp_path, method):
    """The engine freezes the parameters for the context and unfreezes them after: also where accelerate's hooks
    replace them by new parameters in every forward (which took the frozen flag). Before, explaining a
    ``cpu_offload``-ed tiny Llama left 20 of its 21 parameters frozen (``requires_grad`` False) for good."""
    family, folder = saved
    ids, extra = inputs(family)
    offloaded = load(folder, family)
    accelerate.cpu_offload(offloaded, execution_device=torch.device('cpu'))
    for model in (offloaded, disk_offloaded(folder, family, load(folder, family), tmp_path)):
        before = trainable(model)
        assert all(before.values())
        explain(model, ids, method=method, **extra)
        assert trainable(model) == before


def disk_offloaded(folder, family, reference_model, tmp_path, rest='cpu'):
    """Every second transformer block on disk, the other blocks on the CPU, every module with weights outside them
    on ``rest``."""
    from zennit_attn.core import transformer_blocks

    names = {id(module): name for name, module in reference_model.named_modules()}
    blocks = [names[id(block)] for block in transformer_blocks(reference_model)]
    device_map = {name: 'disk' if index % 2 else 'cpu' for index, name in enumerate(blocks)}
    for name, module in reference_model.named_modules():
        inside = any(name == block or name.startswith(block + '.') for block in blocks)
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        if own and not inside:
            device_map[name] = rest
    model = load(folder, family, device_map=device_map, offload_folder=str(tmp_path / 'offload'))
    assert any(parameter.is_meta for parameter in model.parameters())
    return model


def test_disk_offload_device_map_equals_one_device(saved, tmp_path):
    family, folder = saved
    ids, extra = inputs(family)
    reference_model = load(folder, family)
    reference = explain(reference_model, ids, **extra)
    check(disk_offloaded(folder, family, reference_model, tmp_path), reference, family)


@pytest.fixture(
    scope='module',
    params=[(family, offload) for family in ('llama', 'gpt2') for offload in ('cpu_offload', 'disk')],
    ids=lambda param: '-'.join(param),
)
def offloaded(request, tmp_path_factory):
    """``(offloaded model, the same model on one device)``: wrapped by ``cpu_offload``, or loaded with a device map
    that puts the embeddings and every second block on disk; either way the first parameter is on the meta device."""
    family, offload = request.param
    folder = tmp_path_factory.mktemp(family)
    tiny_model(family).save_pretrained(folder)
    reference_model = load(folder, family)
    if offload == 'cpu_offload':
        model = load(folder, family)
        accelerate.cpu_offload(model, execution_device=torch.device('cpu'))
    else:
        model = disk_offloaded(folder, family, reference_model, tmp_path_factory.mktemp('disk'), rest='disk')
    assert next(model.parameters()).is_meta
    yield model, reference_model
    assert next(model.parameters()).is_meta  # still offloaded afterwards


def test_explain_generation_equals_one_device(offloaded):
    model, reference_model = offloaded
    tokenizer = byte_level_tokenizer()
    options = dict(max_new_tokens=3, generate_kwargs={'suppress_tokens': [0, 1, 2, 3]})
    generated = explain_generation(model, tokenizer, 'Where does the ice bear live?', **options)
    expected = explain_generation(reference_model, tokenizer, 'Where does the ice bear live?', **options)
    assert torch.equal(generated.input_ids, expected.input_ids)
    assert relative_error(generated.relevance, expected.relevance) <= 1e-12
    assert relative_error(generated.answer_relevance, expected.answer_relevance) <= 1e-12


@pytest.mark.parametrize('by', ['activation', 'relevance'])
def test_reference_samples_equal_one_device(offloaded, by):
    model, reference_model = offloaded
    tokenizer = byte_level_tokenizer()
    texts = ['The ice bear lives in the Arctic.', 'seals and fish', 'the penguin lives in the south', 'bear']
    neurons = [Neuron('mlp', 1, 5), Neuron('attention', 0, 2)]
    options = dict(k=2, by=by, batch_size=3, max_length=16, progress=False)
    refs = reference_samples(model, tokenizer, texts, neurons, **options)
    plain = reference_samples(reference_model, tokenizer, texts, neurons, **options)
    for neuron in neurons:
        assert [(entry.text, entry.position) for entry in refs[neuron]] == [
            (entry.text, entry.position) for entry in plain[neuron]
        ]
        for entry, other in zip(refs[neuron], plain[neuron]):
            assert entry.score == pytest.approx(other.score, rel=1e-12, abs=1e-15)
            assert relative_error(entry.explanation.relevance, other.explanation.relevance) <= 1e-12


def test_vocabulary_projection_equals_one_device(offloaded):
    model, reference_model = offloaded
    for neuron in (Neuron('mlp', 0, 3), Neuron('mlp', 1, 60), Neuron('residual', 1, 7)):
        projection = vocabulary_projection(model, neuron, k=5)
        assert torch.equal(projection.scores, vocabulary_projection(reference_model, neuron, k=5).scores)


def test_meta_weights_without_offloading_are_refused():
    with torch.device('meta'):
        model = transformers.LlamaForCausalLM(tiny_model('llama').config).eval()
    with pytest.raises(ValueError, match='meta device'):
        explain(model, token_ids('llama', 4))
