"""The AttnLRP rules (Achtibat et al., ICML 2024) as zennit hooks.

Convention
----------
zennit's own rules pass *relevance* backward through every hooked module, which forces every operation
between two hooked modules (residual additions, rotary embeddings, scalings) to be a module too. The rules
here follow the gradient-times-input formulation of the paper (Sec. 3.1, "this formula can be efficiently
implemented in automatic differentiation libraries"): what flows backward is a *modified gradient* ``g``, and
the relevance of any tensor ``x`` is ``R = x * g``. Linear operations without bias, residual additions,
reshapes and rotary embeddings then need no rule at all (the epsilon rule, Eq. 8, with epsilon -> 0 is the
plain gradient times input), and only the non-linear operations change their backward pass:

============================  =========================================  =====================================
operation                     rule                                       class
============================  =========================================  =====================================
linear layer                  epsilon rule, Eq. 8                        :py:class:`Epsilon`
element-wise non-linearity    identity rule, Eq. 9                       :py:class:`Identity`
LayerNorm / RMSNorm           identity rule on ``x / g(x)``, Prop. 3.4   :py:class:`NormIdentity`
product of N factors          uniform rule, Prop. 3.2 and 3.3            :py:class:`Uniform`
CP-LRP (Ali et al. 2022)      softmax outputs and gates constant         :py:class:`ConstantGates`
RelP (Rezaei Jafari 2025)     softmax outputs constant, gates 1/2        :py:class:`ConstantAttention`
relevance patching variant    gates 1/2, other products plain gradient   :py:class:`HalfGates`
linear / convolution in ViTs  gamma, z+, alpha-beta (app. A.2.3)         :py:class:`Gamma`, :py:class:`ZPlus`,
                                                                         :py:class:`AlphaBeta`
any zennit relevance rule     converted at the module boundary           :py:class:`RelevanceRule`
============================  =========================================  =====================================

The rules of modules are zennit hooks that a composite maps to modules; the product rules
(:py:mod:`~zennit_attn.rules.products`) are not hooks: the engine (:py:mod:`zennit_attn.operations`)
applies a composite's product rule to every product a model computes, and its activation rule (:py:class:`Identity`)
also to the element-wise functions a model calls inline. The softmax rule (Prop. 3.1) is the plain gradient of the
softmax in this formulation: the engine leaves it as it is.

:py:class:`RelevanceBoundary`, registered on the root module by the composites, converts at the model's
boundary so that the outward contract stays zennit's: relevance goes in at the output (``grad_outputs``
of :py:class:`zennit.attribution.Gradient`) and relevance comes out at the floating-point inputs.
"""

from .base import (
    GradientRule,
    contiguous_gradient,
    elementwise_identity,
    gradient_map,
    layer_norm_identity,
    scaled_gradient,
)
from .boundary import OUTPUT_FIELDS, RelevanceBoundary
from .gradient import FUNCTIONAL_EPSILON, Epsilon, Identity, NormIdentity, epsilon_gradient, plain_stands_for
from .products import ConstantAttention, ConstantGates, HalfGates, ProductRule, Uniform
from .relevance import AlphaBeta, Gamma, RelevanceRule, ZPlus

__all__ = [
    'GradientRule',
    'elementwise_identity',
    'gradient_map',
    'scaled_gradient',
    'contiguous_gradient',
    'layer_norm_identity',
    'Epsilon',
    'FUNCTIONAL_EPSILON',
    'plain_stands_for',
    'epsilon_gradient',
    'Identity',
    'NormIdentity',
    'ProductRule',
    'Uniform',
    'ConstantGates',
    'ConstantAttention',
    'HalfGates',
    'RelevanceBoundary',
    'OUTPUT_FIELDS',
    'RelevanceRule',
    'Gamma',
    'ZPlus',
    'AlphaBeta',
]
