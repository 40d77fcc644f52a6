"""Inside the model (paper section 3.5 and Q3): latent relevance, neuron explanations, reference samples, vocabulary
projection and steering, for every model whose sites its structure shows (:py:mod:`~zennit_attn.latent.sites`).

- ``explain(model, ids, latent=('mlp', 'attention', 'residual'))`` records latent relevance in the same backward
  pass (:py:class:`Latent`, sites in :py:mod:`~zennit_attn.latent.sites`); :py:func:`top_neurons` ranks it;
- ``explain(model, ids, target=Neuron('mlp', 15, 104))`` explains a neuron's activation;
- ``explain(model, ids, condition=[Neuron(...)])`` conditional relevance (CRP);
- :py:func:`reference_samples` (ActMax / RelMax over a stream of texts), :py:func:`vocabulary_projection`,
  :py:func:`steer`.

Relation to ``zennit-crp`` (Achtibat et al. 2023, built for CNNs on zennit <= 0.4.6, which conflicts with zennit
0.5.1): a condition ``{'layer name': [3948]}`` of its ``CondAttribution`` is ``Neuron(site, layer, 3948)`` here;
its ``FeatureVisualization`` with ActMax and RelMax is :py:func:`reference_samples` with ``by='activation'`` and
``by='relevance'``.
"""

from .recording import Latent, RankedNeuron, top_neurons
from .references import Reference, References, reference_samples
from .sites import SITES, Neuron, find_sites
from .steering import steer
from .vocabulary import VocabularyProjection, vocabulary_projection

__all__ = [
    'Neuron',
    'SITES',
    'Latent',
    'RankedNeuron',
    'top_neurons',
    'reference_samples',
    'References',
    'Reference',
    'vocabulary_projection',
    'VocabularyProjection',
    'steer',
    'find_sites',
]
