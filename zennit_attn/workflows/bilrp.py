"""Second-order relevance of similarity models: which token of one input matches which token (or image patch) of the
other (BiLRP: Eberle et al., TPAMI 2020; for transformers Vasileiou & Eberle, NAACL 2024).

A sentence encoder or CLIP scores a pair by the dot product of two embeddings, ``s = sum_k e_k(a) e_k(b)`` (the cosine
divides it by the norms, constants of the relevance pass: Prop. 3.4). Explaining each embedding dimension ``e_k`` of
each input with the composite's rules (initial relevance ``e_k``) gives token relevances ``R_a^(k)`` and ``R_b^(k)``
that sum to ``e_k(a)`` and ``e_k(b)`` (exactly for CP-LRP without biases), and the token-pair relevance

``R_ij = sum_k R_a^(k)_i R_b^(k)_j``  (divided by ``|e(a)| |e(b)|`` for the cosine)

sums to the score. Relevance is linear in the initial relevance, so only one input needs its ``d`` dimensions
explained one by one (:py:func:`dimension_relevance`); the other gets one backward pass per position ``j`` of the
first, with the initial relevance ``e_k R^(k)_j`` at its dimensions, which gives the column ``j`` of ``R`` at once
(:py:func:`seeded_relevance`). A pair costs ``d`` + (positions of the shorter input) backward passes, batched
``batch_size`` copies of the input at a time.

:py:func:`explain_similarity` explains a pair of texts of a sentence encoder (mean-pooled last hidden states, as
all-MiniLM-L6-v2's card says, or the first token's: ``pooling``) or of CLIP-like models (``get_text_features``,
``get_image_features``: text-image pairs give a token x patch matrix).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm
from zennit.core import Composite

from ..composites import AttnLRPEpsilon
from ..inputs.lookups import TokenLookups
from ..results.similarity import SimilarityExplanation

__all__ = [
    'POOLINGS',
    'SIMILARITIES',
    'TextEmbedding',
    'ImageEmbedding',
    'word_embeddings',
    'embedding_of',
    'seeded_relevance',
    'dimension_relevance',
    'explain_similarity',
]

#: How a text's embedding is read from the encoder: ``'mean'`` of the last hidden states over the attention mask,
#: the first token's (``'cls'``), or the model's ``get_text_features`` (``'features'``: CLIP-like models).
POOLINGS = ('mean', 'cls', 'features')
#: The similarity of two embeddings.
SIMILARITIES = ('cosine', 'dot')


def _features(output) -> torch.Tensor:
    """The embedding tensor of a ``get_*_features`` output (a tensor, or a model output with ``pooler_output``)."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class TextEmbedding(torch.nn.Module):
    """The embedding of a text by ``model`` (``[batch, d]``), as a module: the root of the composite's context, so
    that the relevance boundary is at the embedding.

    Parameters
    ----------
    model: torch.nn.Module
        A Hugging Face encoder (``last_hidden_state``) or a model with ``get_text_features``.
    pooling: str
        One of :py:data:`POOLINGS`.
    """

    def __init__(self, model: torch.nn.Module, pooling: str = 'mean'):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f'pooling must be one of {POOLINGS}, got {pooling!r}')
        if pooling == 'features' and not hasattr(model, 'get_text_features'):
            raise ValueError(f"pooling='features' needs a model with get_text_features, not {type(model).__name__}")
        self.model, self.pooling = model, pooling

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == 'features':
            return _features(self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask))
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == 'cls':
            return hidden[:, 0]
        mask = attention_mask[..., None].to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1)


class ImageEmbedding(torch.nn.Module):
    """The embedding of an image by a CLIP-like ``model`` (``get_image_features``), as a module (see
    :py:class:`TextEmbedding`)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        if not hasattr(model, 'get_image_features'):
            raise ValueError(f'{type(model).__name__} has no get_image_features: it does not embed images')
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return _features(self.model.get_image_features(pixel_values=pixel_values))


def embedding_of(embedding: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The embedding ``[d]`` of one input (batch 1) without gradients."""
    with torch.no_grad():
        return embedding(**inputs)[0]


def seeded_relevance(
    embedding: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    composite: Composite,
    seeds: torch.Tensor,
    batch_size: int = 64,
    progress: bool = False,
) -> torch.Tensor:
    """The relevance of one input's tokens (``[n, tokens]``) or pixels (``[n, height, width]``, summed over channels)
    for each row of ``seeds`` (``[n, d]``: the initial relevance at the embedding), by backward passes over
    ``batch_size`` copies of the input at a time.

    Relevance is linear in the initial relevance (every rule's backward pass is linear in the gradient it receives), so
    the rows of ``seeds`` may combine dimensions: ``diag(e)`` gives each dimension's own explanation
    (:py:func:`dimension_relevance`), ``e * R_b[:, j]`` the column ``j`` of the pair relevance at once.

    ``inputs`` are the keyword arguments of ``embedding`` for one input (batch 1): ``input_ids`` and
    ``attention_mask`` of a :py:class:`TextEmbedding` (the relevance read at the word embeddings, also of a model that
    takes no ``inputs_embeds``), ``pixel_values`` of an :py:class:`ImageEmbedding`.
    """
    text = 'input_ids' in inputs
    lookups = TokenLookups(embedding.model, word_embeddings(embedding.model)) if text else None
    relevance = _text_relevance if text else _image_relevance
    chunks = []
    for start in tqdm(range(0, len(seeds), batch_size), disable=not progress, desc='relevance'):
        seed = seeds[start : start + batch_size]
        batch = {key: value.expand(len(seed), *value.shape[1:]) for key, value in inputs.items()}
        chunks.append(relevance(embedding, batch, composite, seed, lookups))
    return torch.cat(chunks)


def dimension_relevance(
    embedding: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    composite: Composite,
    batch_size: int = 64,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The embedding ``e`` (``[d]``) of one input and the relevance of its tokens or pixels for each dimension
    ``e_k`` with initial relevance ``e_k`` (``[d, tokens]`` or ``[d, height, width]``; see
    :py:func:`seeded_relevance`)."""
    values = embedding_of(embedding, inputs)
    return values, seeded_relevance(embedding, inputs, composite, torch.diag(values), batch_size, progress)


def word_embeddings(model: torch.nn.Module) -> torch.nn.Module:
    """The word embedding module of ``model`` or of its text tower (``text_model``: CLIP-like models)."""
    for candidate in (model, getattr(model, 'text_model', None)):
        try:
            return candidate.get_input_embeddings()
        except (AttributeError, NotImplementedError):
            continue
    raise ValueError(f'{type(model).__name__}: no word embeddings found (get_input_embeddings of it or its text_model)')


def _text_relevance(embedding, batch: dict, composite: Composite, seed: torch.Tensor, lookups: TokenLookups):
    """``[batch, tokens]`` relevance of ``seed`` (the initial relevance at the embeddings) at the word embeddings and
    every other token table's lookup."""
    ids = batch['input_ids']
    with torch.enable_grad():
        words = lookups.word(ids).detach().requires_grad_(True)
        with composite.context(embedding) as modified:
            lookups.record()
            with lookups.substituting(ids, words):
                output = modified(**batch)
            leaves = [words, *lookups.recorded()]
            gradients = torch.autograd.grad(output, leaves, grad_outputs=seed, allow_unused=True)
    sums = [gradient.flatten(2).sum(-1) for gradient in gradients if gradient is not None]
    return sum(sums[1:], sums[0])


def _image_relevance(embedding, batch: dict, composite: Composite, seed: torch.Tensor, lookups=None):
    """``[batch, height, width]`` relevance of ``seed`` at the pixels (summed over channels)."""
    pixels = batch['pixel_values'].detach().clone().requires_grad_(True)
    with torch.enable_grad(), composite.context(embedding) as modified:
        output = modified(pixel_values=pixels)
        (gradient,) = torch.autograd.grad(output, [pixels], grad_outputs=seed)
    return gradient.sum(1)


def _check_arguments(a, b, batch_size) -> None:
    """Refuse what :py:func:`explain_similarity` cannot compare (no input, several inputs for one side) and a
    ``batch_size`` that is not a positive integer, each naming the argument."""
    for name, item in (('a', a), ('b', b)):
        if item is None:
            raise ValueError(f'{name}= is None: explain_similarity compares two inputs, a text or an image each')
        if isinstance(item, (list, tuple)):
            raise ValueError(
                f'{name}= is a {type(item).__name__} of {len(item)} items: explain_similarity compares one input with '
                'one other (a text or an image each); call it once per pair'
            )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f'batch_size must be a positive integer (embedding dimensions per backward pass), got {batch_size!r}'
        )


def _prepared(model, item, tokenizer, processor, pooling: str, name: str) -> tuple[torch.nn.Module, dict, list[str]]:
    """The embedding module, its inputs and the labels of the relevance's positions for one input ``name`` (a text,
    or an image for a CLIP-like model with ``processor``)."""
    if isinstance(item, str):
        if tokenizer is None:
            raise ValueError(
                f'{name}= is a text, which needs its tokenizer (tokenizer=..., or processor=... for CLIP-like models)'
            )
        encoded = tokenizer(item, return_tensors='pt')
        if encoded['input_ids'].shape[-1] == 0:
            raise ValueError(f'{name}={item!r} gives no tokens: nothing to explain')
        inputs = {'input_ids': encoded['input_ids'], 'attention_mask': encoded['attention_mask']}
        labels = tokenizer.convert_ids_to_tokens(encoded['input_ids'][0].tolist())
        return TextEmbedding(model, pooling), inputs, labels
    if not torch.is_tensor(item) and processor is None:
        raise ValueError(
            f'{name}= is an image ({type(item).__name__}), which needs the processor of its model (processor=...), or '
            'pass its pixel_values'
        )
    pixels = item if torch.is_tensor(item) else processor(images=item, return_tensors='pt')['pixel_values']
    dtype = next(model.parameters()).dtype
    return ImageEmbedding(model), {'pixel_values': pixels.to(dtype)}, []


def explain_similarity(
    model: torch.nn.Module,
    a,
    b,
    tokenizer=None,
    processor=None,
    pooling: str | None = None,
    similarity: str = 'cosine',
    composite: Composite | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> SimilarityExplanation:
    """Explain the similarity of ``a`` and ``b`` (texts, or a text and an image of a CLIP-like model) by the
    relevance of every token pair (see the module's description).

    Parameters
    ----------
    model: torch.nn.Module
        A sentence encoder (e.g. all-MiniLM-L6-v2's ``BertModel``) or a CLIP-like model, in eval mode.
    a, b: str or image
        The two inputs: texts (tokenized with ``tokenizer``, or ``processor.tokenizer``), or images (a PIL image or
        array prepared by ``processor``, or ``pixel_values`` of batch 1); one each (a list is refused: call it per
        pair).
    tokenizer, processor: optional
        The model's tokenizer; the processor of a CLIP-like model (its tokenizer is used for texts).
    pooling: str, optional
        How a text's embedding is read (:py:data:`POOLINGS`); default ``'features'`` for models with
        ``get_text_features``, else ``'mean'``.
    similarity: str
        ``'cosine'`` (default) or ``'dot'``.
    composite: zennit Composite, optional
        The rules (default :py:class:`~zennit_attn.composites.AttnLRPEpsilon`; ``CPLRPEpsilon()`` conserves
        exactly without biases).
    batch_size: int
        Embedding dimensions explained per backward pass (a positive integer).
    progress: bool
        Show a progress bar over the dimensions.

    Returns
    -------
    SimilarityExplanation
        ``relevance[i, j]`` of token (or patch) ``i`` of ``a`` and ``j`` of ``b``, the score, the labels.

    Raises
    ------
    ValueError
        For ``a`` or ``b`` None or a list, a text without tokenizer or that gives no tokens, an image without
        processor, ``batch_size`` not a positive integer, an unknown ``similarity``, a model in training mode, a
        composite with PA-LRP's positions (``positions=True``).
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f'similarity must be one of {SIMILARITIES}, got {similarity!r}')
    _check_arguments(a, b, batch_size)
    if model.training:
        raise ValueError('explain_similarity() needs the model in eval mode (model.eval())')
    pooling = pooling or ('features' if hasattr(model, 'get_text_features') else 'mean')
    tokenizer = tokenizer if tokenizer is not None else getattr(processor, 'tokenizer', None)
    composite = composite if composite is not None else AttnLRPEpsilon()
    if getattr(composite, 'positions', False):
        raise ValueError(
            "explain_similarity() reads the relevance of each input's tokens (or pixels): PA-LRP's positions (a "
            'composite with positions=True) would take a share that no pair holds; use a composite without them'
        )
    prepared = [_prepared(model, item, tokenizer, processor, pooling, name) for name, item in (('a', a), ('b', b))]
    values = [embedding_of(embedding, inputs) for embedding, inputs, _ in prepared]
    # every dimension explained on the input of fewer positions, its columns of the pair relevance on the other
    full = 0 if _positions(prepared[0], model) <= _positions(prepared[1], model) else 1
    other = 1 - full
    embedding, inputs, _ = prepared[full]
    per_dimension = seeded_relevance(embedding, inputs, composite, torch.diag(values[full]), batch_size, progress)
    per_dimension = _per_position(per_dimension, model)  # [d, positions of the full side]
    embedding, inputs, _ = prepared[other]
    seeds = values[other][:, None] * per_dimension  # [d, positions]: column j of the pair relevance, as seeds
    pairs = _per_position(seeded_relevance(embedding, inputs, composite, seeds.T, batch_size, progress), model)
    scale = 1.0 if similarity == 'dot' else 1 / float(values[0].norm() * values[1].norm())
    relevance = pairs.T if full == 1 else pairs  # [positions of a, positions of b]
    return SimilarityExplanation(
        relevance=relevance.detach() * scale,
        score=float(values[0] @ values[1]) * scale,
        labels_a=_labels(prepared[0], model),
        labels_b=_labels(prepared[1], model),
        similarity=similarity,
    )


def _positions(prepared: tuple, model: torch.nn.Module) -> int:
    """The number of positions (tokens or patches) of a prepared input."""
    _, inputs, labels = prepared
    if 'input_ids' in inputs:
        return len(labels)
    height, width = inputs['pixel_values'].shape[-2:]
    return (height // _patch_size(model)) * (width // _patch_size(model))


def _per_position(relevance: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    """Token relevance as it is, pixel relevance summed per patch of the vision tower (``[n, patches]``)."""
    if relevance.dim() == 2:
        return relevance
    patch = _patch_size(model)
    return (torch.nn.functional.avg_pool2d(relevance[:, None], patch) * patch * patch).flatten(1)


def _labels(prepared: tuple, model: torch.nn.Module) -> list[str]:
    """The tokens of a text, ``'patch (row, column)'`` of an image."""
    _, inputs, labels = prepared
    if 'input_ids' in inputs:
        return labels
    patch = _patch_size(model)
    rows, columns = (size // patch for size in inputs['pixel_values'].shape[-2:])
    return [f'patch ({row}, {column})' for row in range(rows) for column in range(columns)]


def _patch_size(model: torch.nn.Module) -> int:
    config = getattr(getattr(model, 'config', None), 'vision_config', None)
    size = getattr(config, 'patch_size', None)
    if not isinstance(size, int):
        raise ValueError(f'{type(model).__name__}: no vision_config.patch_size to sum pixel relevance per patch')
    return size
