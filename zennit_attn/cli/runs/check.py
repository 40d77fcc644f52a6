"""The run step of ``zennit-attn check`` (:py:mod:`zennit_attn.cli.check`): read the configuration of the model
folder, or take the defaults of the ``model_type``, run the architecture check
(:py:mod:`zennit_attn.workflows.architecture_check`) and print the verdict."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import math
from collections.abc import Iterator

import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from transformers.utils import logging as hf_logging

from ...composites import AttnLRPEpsilon, CPLRPEpsilon
from ...workflows.architecture_check.check import Result, check_architecture, check_config
from ...workflows.architecture_check.configs import MAPPINGS, mappings_of
from ..check import Architecture
from ..errors import CommandError, UsageError, one_line
from ..progress import status

__all__ = [
    'run',
    'quiet_transformers',
    'check_model_type',
    'model_type_result',
    'load_config',
    'verdict',
    'attnlrp_line',
    'RULE_COMPOSITES',
]

#: The composite whose rules ``--rules`` prints, by method (:py:data:`zennit_attn.cli.check.RULE_METHODS`).
RULE_COMPOSITES = {'attnlrp': AttnLRPEpsilon, 'cplrp': CPLRPEpsilon}
#: What each verdict means, after its reason.
MEANINGS = {
    'not built': (
        'the tiny random model could not be built or run: a limit of the check, not necessarily of zennit-attn'
    ),
    'failed': 'a defect of zennit-attn: please report it with this line',
}


def run(args: argparse.Namespace) -> int:
    """Check the architecture of ``args.architecture`` and print the verdict; returns the exit status: 0 explained,
    1 refused, not built or failed."""
    architecture: Architecture = args.architecture
    if architecture.model_type is not None:
        check_model_type(architecture.model_type)
    rules = RULE_COMPOSITES[args.rules]() if getattr(args, 'rules', None) else None
    with status(f'checking {architecture.label} on a tiny random model', not args.quiet), quiet_transformers():
        if architecture.folder is not None:
            result = check_config(load_config(architecture), rules=rules)
        else:
            result = model_type_result(architecture.model_type, rules)
    print('\n'.join(verdict(architecture, result)))
    if rules is not None:
        print(f'\n{result.rules}' if result.rules is not None else '\nno rules: the tiny model was not built')
    return 0 if result.status == 'explained' else 1


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hide transformers' warnings (slow reference kernels, settings it corrects) while the block runs: the check
    builds models of tiny configurations, whose warnings say nothing about the user's model. The verbosity is put
    back on exit."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def check_model_type(model_type: str) -> None:
    """A :py:class:`~zennit_attn.cli.errors.UsageError` (exit status 2) for a ``model_type`` that the installed
    transformers does not know, naming the closest it knows."""
    if model_type in CONFIG_MAPPING_NAMES:
        return
    close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING_NAMES), n=3)
    hint = f'; did you mean {", ".join(close)}?' if close else ''
    raise UsageError(
        f'--model {model_type!r} is no model folder here, nor a model_type of transformers {transformers.__version__}'
        f'{hint}',
        command='check',
    )


def model_type_result(model_type: str, rules=None) -> Result:
    """The verdict on ``model_type``: checked as the first mapping that holds it (as the supported-models page lists
    it); a type in none of them is checked from its configuration's defaults, which says that it is not built. With
    a composite ``rules``, also the rule table of the tiny model under it."""
    mappings = mappings_of(model_type)
    if mappings:
        return check_architecture(mappings[0], model_type, rules=rules)
    try:
        config = transformers.AutoConfig.for_model(model_type)
    except (ValueError, TypeError, KeyError) as error:
        raise CommandError(f'cannot make the configuration of model_type {model_type!r}: {one_line(error)}') from error
    return check_config(config, rules=rules)


def load_config(architecture: Architecture):
    """The configuration in the model folder (:py:class:`~zennit_attn.cli.errors.CommandError` where
    transformers cannot read it)."""
    try:
        return transformers.AutoConfig.from_pretrained(architecture.folder)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CommandError(f'cannot read the configuration of {architecture.label}: {one_line(error)}') from error


def verdict(architecture: Architecture, result: Result) -> list[str]:
    """The printout of ``result``: the model and how it was checked, what was fed (for a model with a vision tower)
    and the verdict with its reason."""
    model = (
        f'{architecture.folder} (model_type {result.architecture})'
        if architecture.folder is not None
        else f'{result.architecture} (a model_type of transformers {transformers.__version__})'
    )
    checked = f'checked as {result.mapping}' if result.mapping else f'in none of the mappings {", ".join(MAPPINGS)}'
    lines = [f'model: {model}, {checked}, on a tiny random model in float64 with zero biases']
    if result.inputs:
        lines.append(f'inputs: {result.inputs}')
    if result.status == 'explained' and not result.reason:
        reason = (
            f"CP-LRP's relevance at the inputs sums to the explained logit (ratio {result.ratio:.12f}) and AttnLRP "
            'runs: zennit-attn explains this architecture'
        )
    else:
        reason = '; '.join(filter(None, (result.reason, MEANINGS.get(result.status))))
    lines.append(f'verdict: {result.status}: {reason}')
    if not math.isnan(result.attnlrp):
        lines.append(attnlrp_line(result))
    return lines


def attnlrp_line(result: Result) -> str:
    """The printout of AttnLRP's own check (:py:attr:`~zennit_attn.workflows.architecture_check.check.Result.attnlrp`):
    with the softmax rule's bias term handed back, does its relevance sum to the logit?"""
    head = f"AttnLRP: with the softmax rule's bias term handed back, its relevance / logit = {result.attnlrp:.12f}"
    if result.attnlrp_exact:
        return f'{head}: its other rules lose nothing'
    note = f' ({result.attnlrp_note})' if result.attnlrp_note else ''
    return (
        f'{head}{note}: relevance is lost to a constant of the model, to a softmax spelled otherwise than a softmax '
        'call, or to inputs of zero in the tiny random model (docs: Rules, where AttnLRP loses relevance); anything '
        'else is a defect'
    )
