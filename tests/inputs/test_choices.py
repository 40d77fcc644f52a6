"""Multiple-choice heads (:py:mod:`zennit_attn.inputs.choices`), float64.

1. A tiny BERT ``ForMultipleChoice`` without biases: CP-LRP conserves each row's explained choice score exactly; the
   other choices' tokens get exactly 0 (a choice's score reads its own tokens only), a contrast of two choices gives
   the target's relevance minus the contrast's; a row of a padded batch is explained as the row alone; the token types
   and the mask of the model's ``[batch, choices, seq]`` layout reach the model (from a mapping as the tokenizer's).
2. The perturbation methods attribute only the tokens of the choices the value reads.
3. The perturbation curves and leave-one-out by zeroing read the choices; deletion is refused.
4. Ids that are not ``[batch, choices, seq]``, the methods that read the model's own sequences (attention maps,
   AtMan, PA-LRP) and a head that reads the pads of a right-padded choice (RoFormer's summarises the last token) are
   refused, each naming why.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.models import tiny_config
from zennit_attn import explain
from zennit_attn.composites import CPLRPEpsilon
from zennit_attn.inputs.objectives import Contrast, OutputFunction
from zennit_attn.inputs.task import TokenTask
from zennit_attn.workflows.architecture_check.configs import tiny_config as hf_tiny_config
from zennit_attn.workflows.evaluation import explanation_curves, leave_one_out, token_drops

CHOICES, LENGTH = 3, 6


def multiple_choice(config=None, model_class=transformers.BertForMultipleChoice, zero: bool = True) -> torch.nn.Module:
    """The tiny multiple-choice head (default BERT's), float64; ``zero``: biases and position and type tables zeroed
    (they absorb relevance)."""
    torch.manual_seed(0)
    model = model_class(tiny_config('bert') if config is None else config).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if zero and (name.endswith('bias') or 'position' in name or 'token_type' in name):
                parameter.zero_()
    return model


@pytest.fixture(scope='module')
def model():
    return multiple_choice()


@pytest.fixture(scope='module')
def encoding():
    """Two rows of three choices of six tokens; row 1's choice 0 is right-padded; segment 1 from the fourth token."""
    ids = torch.randint(5, 90, (2, CHOICES, LENGTH), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 0, 4:] = 0
    ids[1, 0, 4:] = 0
    types = torch.zeros_like(ids)
    types[..., 3:] = 1
    return {'input_ids': ids, 'attention_mask': mask, 'token_type_ids': types}


def test_a_choice_is_explained_and_conserved(model, encoding):
    with torch.no_grad():
        scores = model(**encoding).logits
    explanation = explain(model, encoding, target=[2, 0], method='cplrp', composite=CPLRPEpsilon())
    torch.testing.assert_close(explanation.logit, scores[[0, 1], [2, 0]], rtol=1e-12, atol=0)
    assert explanation.choices == CHOICES and explanation.relevance.shape == (2, CHOICES * LENGTH)
    per_choice = explanation.choice_relevance.sum(-1)
    torch.testing.assert_close(per_choice.sum(-1), explanation.logit, rtol=1e-9, atol=0)
    assert per_choice[0, :2].abs().max() == 0 and per_choice[1, 1:].abs().max() == 0  # other choices: exactly 0
    assert explanation.choice_relevance[1, 0, 4:].abs().max() == 0  # the pads
    contrast = explain(model, encoding, target=2, contrast=1, method='cplrp', composite=CPLRPEpsilon())
    alone = [explain(model, encoding, target=t, method='cplrp', composite=CPLRPEpsilon()) for t in (2, 1)]
    torch.testing.assert_close(contrast.relevance, alone[0].relevance - alone[1].relevance, rtol=1e-10, atol=1e-18)
    row = explain(
        model,
        {key: value[1:, :, :4] for key, value in encoding.items()},
        target=0,
        method='cplrp',
        composite=CPLRPEpsilon(),
    )
    torch.testing.assert_close(
        row.choice_relevance[0],
        explanation.choice_relevance[1, :, :4],
        rtol=1e-9,
        atol=1e-12 * explanation.logit.abs().max(),
    )


def test_token_types_reach_the_model(encoding):
    """Without the token types the model scores otherwise: the explained value is the one of the types given."""
    model = multiple_choice(zero=False)
    with torch.no_grad():
        plain = model(input_ids=encoding['input_ids'], attention_mask=encoding['attention_mask']).logits
    explanation = explain(model, encoding, target=1, method='input_x_gradient')
    with torch.no_grad():
        typed = model(**encoding).logits
    assert not torch.allclose(plain[:, 1], typed[:, 1])
    torch.testing.assert_close(explanation.logit, typed[:, 1], rtol=1e-12, atol=0)


def test_perturbations_attribute_the_choices_the_value_reads(model, encoding):
    task = TokenTask(model, encoding)
    task.resolve_plain(target=1)
    valid = task.attributable_tokens().reshape(2, CHOICES, LENGTH)
    assert valid[:, 1].all() and not valid[:, [0, 2]].any()
    contrast = TokenTask(model, encoding).with_objective(Contrast(0))
    contrast.resolve_plain(target=1)
    valid = contrast.attributable_tokens().reshape(2, CHOICES, LENGTH)
    assert valid[0, :2].all() and not valid[:, 2].any() and not valid[1, 0, 4:].any()  # the pads never
    function = TokenTask(model, encoding).with_objective(OutputFunction(lambda scores: scores.log_softmax(-1)[:, 1]))
    function.resolve_plain()  # a log-probability reads every choice
    assert function.attributable_tokens().reshape(2, CHOICES, LENGTH)[0].all()


@pytest.mark.parametrize(
    'call, error, match',
    [
        (lambda m, e: explain(m, e['input_ids'][0]), ValueError, r'input_ids must be \[batch, choices, seq\]'),
        (lambda m, e: explain(m, e, method='atman', score='logit'), NotImplementedError, 'AtMan reads the sequences'),
        (lambda m, e: explain(m, e, method='attention_rollout'), NotImplementedError, 'attention-map methods'),
        (lambda m, e: explain(m, e, method='palrp'), NotImplementedError, "PA-LRP's relevance of the positions"),
    ],
    ids=['two-dimensional-ids', 'atman', 'rollout', 'palrp'],
)
def test_what_the_choices_do_not_allow_is_refused(model, encoding, call, error, match):
    with pytest.raises(error, match=match):
        call(model, encoding)


def test_a_head_that_reads_the_pads_of_a_choice_is_refused(encoding):
    """RoFormer's head summarises each choice's last token: a pad in a right-padded choice."""
    config = hf_tiny_config(transformers.RoFormerConfig)
    config.pad_token_id = 0
    roformer = multiple_choice(config, transformers.RoFormerForMultipleChoice)
    with pytest.raises(ValueError, match='pads rows on the right, and RoFormerForMultipleChoice gives'):
        explain(roformer, {key: value for key, value in encoding.items() if key != 'token_type_ids'})


def test_evaluations_read_the_choices(model, encoding):
    """The perturbation curves and leave-one-out rebuild the task from the explanation in the model's layout; deletion
    (which would shorten one choice) is refused."""
    explanation = explain(model, encoding, target=1, method='cplrp', composite=CPLRPEpsilon())
    types = {'token_type_ids': encoding['token_type_ids']}
    curves = explanation_curves(model, explanation, steps=LENGTH, progress=False, model_kwargs=types)
    with torch.no_grad():
        scores = model(**encoding).logits
        embeddings = model.get_input_embeddings()(encoding['input_ids'])
        embeddings[0, 1, 2] = 0.0  # row 0, the explained choice's third token
        zeroed = model(inputs_embeds=embeddings, attention_mask=encoding['attention_mask'], **types).logits
    torch.testing.assert_close(curves[0].morf[0], scores[0, 1], rtol=1e-12, atol=0)
    drops = token_drops(model, explanation, modes=('zeroed',), progress=False, model_kwargs=types)
    torch.testing.assert_close(drops[0].drops['zeroed'][LENGTH + 2], scores[0, 1] - zeroed[0, 1], rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match='scores choices of one length'):
        leave_one_out(model, explanation, modes=('deleted',), progress=False, model_kwargs=types)
