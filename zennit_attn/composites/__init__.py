"""Named composites for AttnLRP and its CP-LRP baseline, used like any zennit composite."""

from .attnlrp import (
    AttnLRPComposite,
    AttnLRPEpsilon,
    AttnLRPLateEpsilon,
    CompiledModelError,
    CPLRPEpsilon,
    MLPRules,
    RelPEpsilon,
    refuse_compiled,
    rule_hooks,
)
from .gamma import AttnLRPGamma, CPLRPGamma, rule_repr

__all__ = [
    'AttnLRPComposite',
    'AttnLRPEpsilon',
    'AttnLRPLateEpsilon',
    'CPLRPEpsilon',
    'RelPEpsilon',
    'MLPRules',
    'AttnLRPGamma',
    'CPLRPGamma',
    'CompiledModelError',
    'refuse_compiled',
    'rule_hooks',
    'rule_repr',
]
