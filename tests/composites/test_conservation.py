"""AttnLRP conserves exactly once its softmax rule's bias term is handed back, on real architectures
(:py:mod:`zennit_attn.workflows.architecture_check.softmax_bias`: on a bias-free model AttnLRP loses relevance only at
the softmax rule's Taylor bias term, Prop. 3.1).

CP-LRP's conservation (the zoo walk, ``tests/test_zoo.py``) checks the rules CP-LRP and AttnLRP share; this checks
those only AttnLRP applies: the shares of gates in products (Props. 3.2, 3.3), the identity rule behind them (Eq. 9),
and what a spelling makes of them (ESM's inline GELU lost a third of the logit under AttnLRP before commit 47927d4;
HY-V4's normaliser-returning ``UnweightedRMSNorm`` multiplied it by -796 before it was held constant). Models as the
architecture check builds them (float64, every weight initialised to zero drawn, biases and learned position tables
zero), with HY-V4's hyper-connection biases and attention sinks zeroed too (:py:data:`CONSTANTS`). The architectures
that do not conserve this way by design are named in ``tests/test_zoo.py`` (:py:data:`~tests.test_zoo.ATTNLRP_LOSSES`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings

import pytest
import torch

from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon
from zennit_attn.workflows.architecture_check import check
from zennit_attn.workflows.architecture_check.check import input_relevances
from zennit_attn.workflows.architecture_check.configs import model_class, tiny_config
from zennit_attn.workflows.architecture_check.softmax_bias import SoftmaxBias

#: Constants of models not named as biases, zeroed after the weights are drawn: HY-V4's hyper-connection biases and
#: the logits of attention sinks (zero-initialised: drawn, each absorbs relevance as a bias does).
CONSTANTS = ('_hc.base', 'hc_head.hc_base', 'self_attn.sinks')


def built(mapping: str, architecture: str) -> tuple[torch.nn.Module, dict]:
    """The model of ``architecture`` as the architecture check builds it (float64, every weight that is zero throughout
    drawn at random, zero biases), :py:data:`CONSTANTS` zeroed, and its inputs."""

    def build():
        architecture_class, config_class = model_class(mapping, architecture)
        return architecture_class, tiny_config(config_class)

    model, inputs, _ = check.built_model(mapping, build, 0, torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(CONSTANTS):
                parameter.zero_()
    return model, inputs


def explained(model: torch.nn.Module, inputs: dict, composite) -> float:
    """The sum of the input relevance for the relevance 1 at the explained logit."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter('ignore')
        sums, _ = input_relevances(model, inputs, composite)
    return sum(sums.values())


#: ``(mapping, architecture)``: dense and mixture-of-experts decoders (rotary, learned and no positions; LayerNorm and
#: RMSNorm; Gemma's soft-capping; parallel attention and MLP), state-space and hybrid models (recurrences whose gates
#: take the uniform rule), encoders (ESM's inline GELU), an encoder-decoder and a vision-language model (pixels).
ARCHITECTURES = [
    ('causal-lm', 'llama'),
    ('causal-lm', 'gpt2'),
    ('causal-lm', 'gemma2'),
    ('causal-lm', 'qwen3_moe'),
    ('causal-lm', 'phi3'),
    ('causal-lm', 'falcon'),
    ('causal-lm', 'gpt_neox'),
    ('causal-lm', 'opt'),
    ('causal-lm', 'doge'),
    ('causal-lm', 'xlstm'),
    ('causal-lm', 'falcon_h1'),
    ('causal-lm', 'jamba'),
    ('masked-lm', 'esm'),
    ('masked-lm', 'modernbert'),
    ('masked-lm', 'deberta-v2'),
    ('seq2seq-lm', 'bart'),
    ('causal-lm', 'gemma3_text'),
    ('causal-lm', 'mamba'),
    ('causal-lm', 'whisper'),
    ('image-text-to-text', 'qwen2_vl'),
    ('image-text-to-text', 'llava'),
    ('image-text-to-text', 'idefics3'),
    ('causal-lm', 'hy_v4'),
]


@pytest.mark.parametrize('mapping, architecture', ARCHITECTURES)
def test_attnlrp_conserves_with_the_softmax_bias_handed_back(mapping, architecture):
    """The relevance sums to the logit within 1e-6 (the zoo walk's tolerance for CP-LRP, which meets it on the same
    model: float64 rounding where relevances of opposite signs cancel, and the epsilon of a normaliser) while AttnLRP's
    own sum is further off wherever the model has a softmax (the softmax's bias term is what the check hands back),
    and as close where it has none."""
    model, inputs = built(mapping, architecture)
    handed = SoftmaxBias()
    assert explained(model, inputs, CPLRPEpsilon()) == pytest.approx(1, abs=1e-6)
    assert explained(model, inputs, handed.composite()) == pytest.approx(1, abs=1e-6)
    assert handed.stranded <= 1e-12
    assert (abs(explained(model, inputs, AttnLRPEpsilon()) - 1) > 1e-5) == (handed.softmaxes > 0)


def test_cplrp_conserves_ovis2_with_the_bias_of_its_value_softmax_handed_back():
    """Ovis2's visual tokenizer turns the vision tower's output into soft visual tokens, a softmax whose output weights
    an embedding table (a value, not attention weights): CP-LRP gives it the softmax rule (Prop. 3.1), which leaves out
    its bias term, so CP-LRP alone does not conserve; with that term handed back at ``softmax`` only (CP-LRP's attention
    probabilities stay constants) it does, and the architecture check says so instead of reporting a defect."""
    model, inputs = built('image-text-to-text', 'ovis2')
    handed = SoftmaxBias()
    assert abs(explained(model, inputs, CPLRPEpsilon()) - 1) > 1e-5
    assert explained(model, inputs, handed.cplrp_composite()) == pytest.approx(1, abs=1e-6)
    assert handed.softmaxes >= 1 and handed.stranded <= 1e-12
    result = check.check_architecture('image-text-to-text', 'ovis2')
    assert result.status == 'explained' and 'a softmax whose output is a value' in result.reason


def test_the_handed_back_softmax_conserves_and_keeps_its_value():
    """On one softmax: the value is the softmax's, the input relevance sums to the output's per row, and the gradient
    is the softmax rule's (the plain gradient, Prop. 3.1) plus a multiple of the logits."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 5, dtype=torch.float64)
    handed = SoftmaxBias()
    output = handed.softmax(torch.softmax, (logits, -1), {})
    (grad,) = torch.autograd.grad((output * weight).sum(), logits)
    plain = torch.softmax(logits, -1)
    (rule,) = torch.autograd.grad((plain * weight).sum(), logits)
    torch.testing.assert_close(output, plain, rtol=0, atol=0)
    torch.testing.assert_close((logits * grad).sum(-1), (plain * weight).sum(-1).detach())
    ratio = (grad - rule) / logits.detach()
    torch.testing.assert_close(ratio, ratio[:, :1].expand_as(ratio))
    assert not torch.allclose((logits * rule).sum(-1), (plain * weight).sum(-1))


@pytest.mark.slow
def test_attnlrp_conserves_on_smollm2_with_the_softmax_bias_handed_back(smollm2):
    """The real SmolLM2-135M-Instruct (30 layers of trained weights, no biases) in float64: CP-LRP's relevance and
    AttnLRP's with the softmax's bias term handed back (at 30 softmaxes, none stranded) both sum to the explained logit
    to 1e-12 of it, while AttnLRP's own keeps a third of it (4.37 of 12.84 on this prompt: the softmax rule's bias
    terms are most of what AttnLRP loses)."""
    model, tokenizer = smollm2
    model = copy.deepcopy(model).double()
    ids = tokenizer('The Eiffel Tower is located in the city of', return_tensors='pt').input_ids
    handed = SoftmaxBias()
    explained = explain(model, ids, composite=handed.composite())
    logit = float(explained.logit)
    assert float(explained.relevance.sum()) == pytest.approx(logit, rel=1e-12)
    assert (handed.softmaxes, handed.stranded) == (30, 0.0)
    assert float(explain(model, ids, composite=CPLRPEpsilon()).relevance.sum()) == pytest.approx(logit, rel=1e-12)
    assert float(explain(model, ids, composite=AttnLRPEpsilon()).relevance.sum()) < 0.5 * logit
