"""Will a model work? The architecture check: build a tiny random model of an architecture, check that CP-LRP
conserves relevance exactly in float64 with zero biases and that AttnLRP runs, and give the verdict (explained,
refused with the reason, not built with why); for an explained model also whether AttnLRP with the softmax rule's
bias term handed back conserves.

- :py:mod:`~zennit_attn.workflows.architecture_check.check`: the check and its verdict (:py:func:`check_architecture`
  for an architecture of transformers' auto mappings, :py:func:`check_config` for a model's own configuration;
  ``zennit-attn check --model FOLDER_OR_MODEL_TYPE`` on the command line);
- :py:mod:`~zennit_attn.workflows.architecture_check.configs`: the tiny configurations and the model class of an
  architecture;
- :py:mod:`~zennit_attn.workflows.architecture_check.processors`: an architecture's own processor, built offline from
  transformers' classes and fitted to the tiny configuration;
- :py:mod:`~zennit_attn.workflows.architecture_check.pixels`: the pixels a vision tower of a tiny configuration takes
  (its processor's outputs, else a layout guessed from the configuration);
- :py:mod:`~zennit_attn.workflows.architecture_check.softmax_bias`: AttnLRP with the softmax rule's bias term handed
  back, the check of the rules only AttnLRP applies.

The walk over every architecture of the installed transformers, which writes the documentation's supported-models
page, is a tool of the repository (``tools/supported_models.py``, ``make supported-models``), not part of the package.
"""

from .check import STATUSES, Result, check_architecture, check_config

__all__ = ['STATUSES', 'Result', 'check_architecture', 'check_config']
