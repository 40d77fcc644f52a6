"""What an explanation is (:py:mod:`~zennit_attn.results.explanation`), sums of its relevance over parts of the
text (:py:mod:`~zennit_attn.results.segments`) and how it is shown (:py:mod:`~zennit_attn.results.render`)."""
