"""Named composites for AttnLRP and its CP-LRP baseline, used like any zennit composite."""
from .attnlrp import AttnLRPComposite, AttnLRPEpsilon, CPLRPEpsilon
from .gamma import AttnLRPGamma, CPLRPGamma

__all__ = ['AttnLRPComposite', 'AttnLRPEpsilon', 'CPLRPEpsilon', 'AttnLRPGamma', 'CPLRPGamma']
