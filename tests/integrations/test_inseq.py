"""zennit_attn.integrations.inseq: the inseq methods 'attnlrp' and 'cplrp' equal explain() (in inseq's float32);
refusals. Skipped where inseq is not installed (pip install zennit-attn[inseq])."""

import pytest
import torch

inseq = pytest.importorskip('inseq', reason='inseq is not installed (optional extra: pip install zennit-attn[inseq])')

import zennit_attn.integrations.inseq  # noqa: E402,F401  registers 'attnlrp' and 'cplrp'
from tests.models import tiny_model  # noqa: E402
from tests.text_tokenizer import byte_level_tokenizer  # noqa: E402
from zennit_attn import explain  # noqa: E402
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config  # noqa: E402

PROMPT = 'The ice bear lives in the'
FULL = PROMPT + ' Arctic.'


@pytest.fixture(scope='module')
def model():
    return tiny_model('llama')


@pytest.fixture(scope='module')
def recurrent_gemma():
    """A model whose forward takes ``position_ids`` second: inseq's steps passed the attention mask as the second
    positional argument, which became its positions (relevance 39% off explain()'s); GPT-2's second is the cache."""
    model_type, config_type = model_class('causal-lm', 'recurrent_gemma')
    torch.manual_seed(0)
    return model_type(tiny_config(config_type)).eval()


@pytest.fixture(scope='module')
def tokenizer():
    return byte_level_tokenizer(bos=False)


def test_registered_through_inseqs_registry():
    assert {'attnlrp', 'cplrp'} <= set(inseq.list_feature_attribution_methods())


@pytest.mark.parametrize('family', ['model', 'recurrent_gemma', 'gpt2'])
@pytest.mark.parametrize('method', ['attnlrp', 'cplrp'])
def test_equals_explain(family, tokenizer, method, request):
    model = tiny_model('gpt2') if family == 'gpt2' else request.getfixturevalue(family)
    out = inseq.load_model(model, method, tokenizer=tokenizer).attribute(
        PROMPT, FULL, attributed_fn='logit', show_progress=False
    )
    attribution = out.sequence_attributions[0].target_attributions  # [target tokens, steps]
    ids = tokenizer(FULL, return_tensors='pt').input_ids
    start = len(tokenizer(PROMPT).input_ids)
    assert attribution.shape == (ids.shape[1], ids.shape[1] - start)
    for step, position in enumerate(range(start, ids.shape[1])):
        expected = explain(model, ids[:, :position], target=int(ids[0, position]), method=method).relevance[0]
        assert float(expected.abs().max()) > 0
        assert torch.equal(attribution[:position, step], expected.float())
        assert bool(attribution[position:, step].isnan().all())
    other = 'cplrp' if method == 'attnlrp' else 'attnlrp'
    assert not torch.equal(
        attribution[:start, 0],
        explain(model, ids[:, :start], target=int(ids[0, start]), method=other).relevance[0].float(),
    )


def test_refusals(model, tokenizer):
    attribution_model = inseq.load_model(model, 'attnlrp', tokenizer=tokenizer)
    with pytest.raises(ValueError, match="explains the logit.*pass attributed_fn='logit'"):
        attribution_model.attribute(PROMPT, FULL, show_progress=False)  # inseq's default: the probability
    with pytest.raises(TypeError, match=r"takes no argument\(s\) \['baselines', 'n_steps'\]"):
        attribution_model.attribute(PROMPT, FULL, attributed_fn='logit', baselines=0, n_steps=5, show_progress=False)
    t5 = tiny_model('t5')
    with pytest.raises(TypeError, match='is an encoder-decoder model'):
        inseq.load_model(t5, 'attnlrp', tokenizer=tokenizer)
