"""Named composites for AttnLRP and its CP-LRP baseline, used like any zennit composite."""
from .attnlrp import AttnLRPComposite, AttnLRPEpsilon, CPLRPEpsilon

__all__ = ['AttnLRPComposite', 'AttnLRPEpsilon', 'CPLRPEpsilon']
