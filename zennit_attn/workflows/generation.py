"""Why did the model answer this: explain every token of a generated answer, and the answer as a whole.

:py:func:`explain_generation` lets the model generate (greedy by default), then explains each generated token by
:py:func:`~zennit_attn.explain` on exactly the prefix it was generated from, and the whole answer by one backward
pass from the sum of all generated tokens' logits (as the paper does for Mixtral). The result, a
:py:class:`GenerationExplanation`, shows itself in the terminal, as an interactive HTML page (click or hover a
generated token to see its heatmap) and as figures. With ``images`` and the model's processor, a vision-language model
(LLaVA, Qwen2-VL) answers a text about images, and every row is explained at the text tokens and the pixels.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import torch
from tqdm.auto import tqdm
from zennit.core import Composite

from ..core.devices import input_device
from ..core.modules import is_encoder_decoder
from ..explain import explain
from ..inputs.chat import is_conversation, prompt_ids
from ..inputs.checks import as_integer, check_model, token_ids
from ..inputs.objectives import RUNNER_UP
from ..inputs.vision_language import (
    encode_multimodal,
    extend_encoding,
    has_pixels,
    is_processor,
    is_similarity_model,
    placeholder_tokens,
)
from ..methods.declarations import positive
from ..methods.propagation import method_of
from ..methods.registry import METHODS
from ..results.render import multimodal as multimodal_views
from ..results.render import views
from ..results.render.html import page
from ..results.render.layout import ScaleLike

__all__ = ['explain_generation', 'GenerationExplanation', 'generate_answer']


@dataclass
class GenerationExplanation:
    """What :py:func:`explain_generation` returns: relevance of every generated token, and of the whole answer.

    Layout: the columns are the tokens of ``input_ids``. For a decoder-only model (causal LM) they are the prompt
    (``prompt_length`` tokens) followed by the generated tokens. For an encoder-decoder model (T5) they are the
    encoder input (the prompt, ``prompt_length`` tokens), the decoder start token, then the generated tokens; the
    generated tokens start at column ``answer_start`` (``prompt_length`` for decoder-only models,
    ``prompt_length + 1`` for encoder-decoders).

    Attributes
    ----------
    relevance: torch.Tensor
        ``[generated, columns]``: row ``i`` explains generated token ``i`` (its logit when it was generated) over
        everything it was generated from, i.e. the columns before ``answer_start + i``; it is 0 from that column on.
        Row ``i`` equals ``explain()`` on that prefix (see :py:func:`explain_generation`).
    answer_relevance: torch.Tensor
        ``[columns]``: the relevance of the sum of all generated tokens' logits, from one backward pass (0 at the last
        generated token, which no token was generated from). LRP is linear in its initial relevance, so it equals
        ``relevance.sum(0)`` up to rounding.
    input_ids: torch.Tensor
        ``[columns]`` the token id of each column.
    prompt_length: int
        Number of prompt tokens (encoder tokens for encoder-decoders).
    answer_start: int
        Column of the first generated token.
    target: torch.Tensor
        ``[generated]`` the generated token ids (the explained outputs).
    logit: torch.Tensor
        ``[generated]`` each generated token's logit when it was generated (its initial relevance).
    position: torch.Tensor
        ``[generated]`` the column whose output predicted each token (``answer_start + i - 1``).
    method: str
        The attribution method.
    encoder_decoder: bool
        Whether the model is an encoder-decoder (T5).
    tokenizer
        The tokenizer (not compared, not shown in ``repr``).
    contrast: torch.Tensor or None
        ``[generated]`` with ``explain_generation(..., contrast=...)``: each generated token's contrast token;
        ``logit`` then holds the differences.
    pixel_relevance: torch.Tensor or None
        With ``images``: ``[generated, *pixels]`` row ``i``'s relevance at the processor's ``pixel_values`` (its
        layout, see :py:class:`~zennit_attn.results.explanation.MultimodalExplanation`); ``relevance[i]`` plus
        ``pixel_relevance[i]`` is, for LRP, row ``i``'s logit minus what biases absorb.
    answer_pixel_relevance: torch.Tensor or None
        With ``images``: ``[*pixels]`` the whole answer's pixel relevance.
    images: list of ImageRelevance
        With ``images``: every image with the whole answer's relevance per pixel and per patch
        (:py:class:`~zennit_attn.results.explanation.ImageRelevance`); empty for a text prompt.
    token_images: list of list of ImageRelevance
        With ``images``: ``token_images[i]`` the images with row ``i``'s relevance.
    image_tokens: torch.Tensor or None
        With ``images``: ``[columns]`` True at the image placeholder tokens (their embeddings are replaced by the
        image features, so their own relevance is 0); the views show each run of them as ``[image k]``.
    position_relevance: torch.Tensor or None
        With PA-LRP (``method='palrp'``, a composite with ``positions=True``): ``[generated, columns]`` row ``i``'s
        relevance of the positions of its prefix (explain()'s ``position_relevance``, for encoder-decoders the
        encoder's then the decoder's ``decoder_position_relevance``), laid out as ``relevance``; zeros after the
        prefix. :py:meth:`with_positions` adds it to the tokens' and :py:meth:`total` counts it.
    answer_position_relevance: torch.Tensor or None
        With PA-LRP: ``[columns]`` the whole answer's relevance of the positions.
    """

    relevance: torch.Tensor
    answer_relevance: torch.Tensor
    input_ids: torch.Tensor
    prompt_length: int
    answer_start: int
    target: torch.Tensor
    logit: torch.Tensor
    position: torch.Tensor
    method: str = 'attnlrp'
    encoder_decoder: bool = False
    tokenizer: object = field(default=None, repr=False, compare=False)
    contrast: torch.Tensor | None = None
    pixel_relevance: torch.Tensor | None = None
    answer_pixel_relevance: torch.Tensor | None = None
    images: list = field(default_factory=list, compare=False)
    token_images: list = field(default_factory=list, repr=False, compare=False)
    image_tokens: torch.Tensor | None = None
    position_relevance: torch.Tensor | None = None
    answer_position_relevance: torch.Tensor | None = None

    def with_positions(self) -> GenerationExplanation:
        """The explanation of position-token pairs (PA-LRP): each column's relevance plus its position's, in
        ``relevance`` and ``answer_relevance`` (the position fields then None), for every view.

        Raises
        ------
        ValueError
            Without position relevance (an explanation by another method than PA-LRP).
        """
        if self.position_relevance is None:
            raise ValueError(
                "no position relevance: explain_generation(..., method='palrp') (or a composite with positions=True) "
                'gives it'
            )
        return dataclasses.replace(
            self,
            relevance=self.relevance + self.position_relevance,
            answer_relevance=self.answer_relevance + self.answer_position_relevance,
            position_relevance=None,
            answer_position_relevance=None,
        )

    def image_relevance(self, token: int | None = None) -> float:
        """The relevance of all pixels of all images for generated token ``token`` (None: the whole answer); 0.0
        for an answer to a text prompt."""
        if self.pixel_relevance is None:
            return 0.0
        if token is None:
            return float(self.answer_pixel_relevance.sum())
        return float(self.pixel_relevance[views.check_row(token, self.relevance.shape[0], 'generated token')].sum())

    def total(self, token: int | None = None) -> float:
        """Text plus image relevance of generated token ``token`` (None: the whole answer), and with PA-LRP its
        positions': for LRP its logit (the sum of all generated logits) minus what biases absorb."""
        fields = [(self.answer_relevance, self.relevance)]
        if self.position_relevance is not None:
            fields.append((self.answer_position_relevance, self.position_relevance))
        total = 0.0
        for answer, rows in fields:
            total += float(
                (answer if token is None else rows[views.check_row(token, rows.shape[0], 'generated token')]).sum()
            )
        return total + self.image_relevance(token)

    @property
    def generated_ids(self) -> torch.Tensor:
        """``[generated]`` the generated token ids."""
        return self.input_ids[self.answer_start :]

    def answer(self, tokenizer=None) -> str:
        """The generated text."""
        tokenizer = views.resolve_tokenizer(tokenizer, self)
        return tokenizer.decode(self.generated_ids.tolist(), skip_special_tokens=False)

    def tokens(self, tokenizer=None, words: bool = False) -> list[str]:
        """The texts of the columns (prompt, for T5 the decoder start, answer), as the tokenizer writes them;
        ``words=True`` merges them into words (never across the prompt/answer boundary)."""
        parts, _ = views.generation_columns(self, tokenizer, words)
        return [text for _, texts, _ in parts for text in texts]

    def heatmap(self, token: int | None = None, words: bool = False, tokenizer=None):
        """The :py:class:`~zennit_attn.results.render.layout.Heatmap` of the whole answer (``token=None``) or of
        generated token ``token`` (prompt and answer as its two segments)."""
        return views.generation_heatmap(self, token, words, tokenizer)

    def show(
        self,
        token: int | str | None = None,
        words: bool = False,
        scale: ScaleLike = None,
        color: bool | None = None,
        tokenizer=None,
        stream: IO | None = None,
    ) -> None:
        """Print the heatmap of the whole answer (``token=None``), of generated token ``token`` (an index, negative
        from the end) or of every generated token (``token='all'``), in colour on a terminal.

        Parameters
        ----------
        token: int, 'all' or None
        words: bool
            Merge tokens into words (relevance summed).
        scale: None, 'shared' or float
            Colour scale: each heatmap its own largest absolute relevance (None), one for all heatmaps printed
            (``'shared'``), or a number.
        color: bool, optional
            Force colour on or off (default: on for a terminal unless ``NO_COLOR`` is set).
        tokenizer: optional
            Default: the stored one.
        stream: file-like, optional
            Default ``sys.stdout``.
        """
        if isinstance(token, str):
            if token != 'all':
                raise ValueError(f"token must be an index, 'all' or None, got {token!r}")
            heatmaps = [self.heatmap(index, words, tokenizer) for index in range(self.relevance.shape[0])]
        else:
            heatmaps = [self.heatmap(token, words, tokenizer)]
        views.show_heatmaps(heatmaps, scale, color, stream)
        if self.images and isinstance(token, str):
            for index in range(self.relevance.shape[0]):
                totals = ', '.join(
                    f'image {number + 1} {float(image.relevance.sum()):+.4g}'
                    for number, image in enumerate(self.token_images[index])
                )
                print(f'generated token {index + 1}, pixel relevance: {totals}', file=stream)
        elif self.images:
            multimodal_views.show_images(self._image_views(None if token is None else [token]), color, stream)

    def to_html(self, words: bool = False, scale: ScaleLike = None, tokenizer=None, **options) -> str:
        """The interactive page: prompt and answer as one text; click or hover a generated token to see what it was
        generated from, or "whole answer" for the heatmap of all generated logits together. Standalone (inline
        script and style). An answer to images shows the overlay of each image beside the text, switched with the
        selected token.

        Parameters
        ----------
        words: bool
            Merge tokens into words; a generated word then shows the sum of its tokens' rows.
        scale: None, 'shared' or float
            Colour scale of each view: its own largest absolute relevance (None), one for all views (``'shared'``),
            or a number.
        tokenizer: optional
        **options
            For an answer to images, the overlay options ``alpha``, ``cmap``, ``level``, ``vmax``
            (:py:data:`~zennit_attn.results.render.multimodal.IMAGE_OPTIONS`).

        Returns
        -------
        str
        """
        body = views.generation_views(self, words, scale, tokenizer, self._figures(options))
        return page(
            body,
            title='Why did the model answer this?',
            subtitle=f'{self.relevance.shape[0]} generated tokens explained by {self.method}',
        )

    def _repr_html_(self) -> str:
        return views.generation_views(self, images=self._figures({}))

    def _figures(self, options: dict):
        """The overlays of a view as :py:func:`~zennit_attn.results.render.html.generation_fragment` takes them (None
        without images)."""
        if not self.images:
            if options:
                raise TypeError(f'unknown option(s) {sorted(options)}: the image options apply to an answer to images')
            return None
        return lambda generated: multimodal_views.overlay_figures(self._image_views(generated), **options)

    def _image_views(self, generated) -> list[tuple]:
        """``[(caption, pixels, relevance, patch relevance, mean, std)]`` of each image for the generated tokens
        ``generated`` (their rows summed; None: the whole answer)."""
        shown = []
        for number, image in enumerate(self.images):
            relevance, patches, which = image.relevance, image.patch_relevance, 'the whole answer'
            if generated is not None:
                rows = [
                    self.token_images[views.check_row(index, len(self.token_images), 'generated token')][number]
                    for index in generated
                ]
                relevance, patches = sum(row.relevance for row in rows), sum(row.patch_relevance for row in rows)
                which = 'generated token ' + '+'.join(str(index % len(self.token_images) + 1) for index in generated)
            caption = f'image {number + 1}: relevance {float(relevance.sum()):.4g} for {which}'
            shown.append((caption, image.pixels, relevance, patches, image.mean, image.std))
        return shown

    def save(
        self,
        path: str | os.PathLike,
        words: bool = False,
        scale: ScaleLike = None,
        token: int | None = None,
        tokenizer=None,
        **options,
    ) -> Path:
        """Write the explanation in the format of the suffix of ``path``.

        ``.html``: the interactive page (:py:meth:`to_html`); ``.png``, ``.svg``, ``.pdf``, ``.tex``: the heatmap of
        the whole answer (or of generated token ``token``) as a figure or LaTeX snippet (options as for
        :py:func:`zennit_attn.results.render.views.save_heatmaps`). An answer to images is drawn with the overlay of
        each image (of the whole answer, or of token ``token``), as
        :py:func:`zennit_attn.results.render.multimodal.save_multimodal` does, which also takes the overlay options.

        Returns
        -------
        pathlib.Path
        """
        heatmaps = [self.heatmap(token, words, tokenizer)]
        document = None
        if str(views.check_output(path)).lower().endswith('.html'):
            image_options = {key: options.pop(key) for key in multimodal_views.IMAGE_OPTIONS if key in options}
            document = self.to_html(words, scale, tokenizer, **image_options)
            options.update(image_options)
        if self.images:
            return multimodal_views.save_multimodal(
                heatmaps, self._image_views(None if token is None else [token]), path, scale, html=document, **options
            )
        return views.save_heatmaps(heatmaps, path, scale, html=document, **options)


def _prompt_ids(tokenizer, prompt) -> torch.Tensor:
    """``[1, seq]`` ids of one prompt (text, ids, the tokenizer's output or a conversation)."""
    prompt, mask = _ids_and_mask(_tokenized(tokenizer, prompt))
    ids = _one_sequence(prompt)
    if mask is not None and not bool((torch.as_tensor(mask) != 0).all()):
        raise ValueError('the prompt has padding (attention_mask has zeros): pass the one prompt unpadded')
    return ids


def _tokenized(tokenizer, prompt):
    """``prompt`` with a text tokenised and a conversation put into the chat template (with its generation prompt);
    ids and the tokenizer's output as they are. A list of texts (several prompts) and an empty prompt are refused."""
    prompt = prompt_ids(tokenizer, prompt) if is_conversation(prompt) else prompt
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(item, str) for item in prompt):
        raise ValueError(
            f'explain_generation explains one prompt at a time, got a list of {len(prompt)} texts: call '
            'it once per prompt'
        )
    if isinstance(prompt, (list, tuple)) and not prompt:
        raise ValueError('the prompt has no tokens: give the text the model should answer')
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError('the prompt is empty: give the text the model should answer')
        prompt = tokenizer(prompt, return_tensors='pt')
    return prompt


def _ids_and_mask(prompt) -> tuple:
    """``(ids, attention mask or None)`` of a tokenised prompt: the fields of a mapping (the tokenizer's output), or
    the ids themselves without a mask."""
    if not isinstance(prompt, Mapping):
        return prompt, None
    if 'input_ids' not in prompt:
        raise ValueError(f'the prompt mapping has no input_ids (keys: {sorted(prompt)})')
    return prompt['input_ids'], prompt.get('attention_mask')


def _one_sequence(prompt) -> torch.Tensor:
    """``[1, seq]`` long ids of one non-empty sequence given as ``[seq]`` or ``[1, seq]`` integers."""
    ids = torch.as_tensor(prompt)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f'the prompt must be a text or the ids of one sequence ([seq] or [1, seq] integers), got '
            f'{ids.dtype} of shape {tuple(ids.shape)}'
        )
    if ids.shape[1] == 0:
        raise ValueError('the prompt has no tokens: give the text the model should answer')
    return ids.long()


def _batched(value) -> int | None:
    """Rows per explain() call of ``batched``: None (one call per generated token on its own prefix), 0 (all rows in
    one call) or a positive number."""
    if value is False or value is None:
        return None
    if value is True:
        return 0
    if isinstance(value, numbers.Integral) and value >= 1:
        return int(value)
    raise ValueError(f'batched must be False, True or a positive number of rows per call, got {value!r}')


@dataclass
class _Answer:
    """An answer that ``model.generate`` returned, laid out in the columns of :py:class:`GenerationExplanation`, and
    the arguments of :py:func:`~zennit_attn.explain` for the prefix each generated token was generated from.

    For a decoder-only model the columns are the prompt and the generated tokens; for an encoder-decoder model the
    encoder input (the prompt), the decoder start token and the generated tokens (``decoder_ids``: the decoder start
    token and the answer).
    """

    prompt_ids: torch.Tensor
    columns: torch.Tensor
    generated: torch.Tensor
    answer_start: int
    encoder_decoder: bool = False
    decoder_ids: torch.Tensor | None = None
    encoding: dict | None = None
    processor: object = None

    @classmethod
    def from_sequences(
        cls, model: torch.nn.Module, prompt_ids: torch.Tensor, sequences: torch.Tensor, encoding: dict | None, processor
    ) -> _Answer:
        """The answer in ``sequences`` (what ``model.generate`` returned for ``prompt_ids``); a sequence that does
        not start with the prompt, and an answer without tokens, are refused."""
        prompt_length = prompt_ids.shape[1]
        encoder_decoder = is_encoder_decoder(model)
        if encoder_decoder:
            decoder_ids = sequences[:1]
            columns, generated = torch.cat([prompt_ids[0], decoder_ids[0]]), decoder_ids[0, 1:]
            answer_start = prompt_length + 1
        else:
            if not torch.equal(sequences[0, :prompt_length], prompt_ids[0]):
                raise RuntimeError('model.generate returned a sequence that does not start with the prompt')
            decoder_ids, columns, generated = None, sequences[0], sequences[0, prompt_length:]
            answer_start = prompt_length
        if generated.shape[0] == 0:
            raise RuntimeError(
                'the model generated no token: nothing to explain (check max_new_tokens and generate_kwargs)'
            )
        return cls(prompt_ids, columns, generated, answer_start, encoder_decoder, decoder_ids, encoding, processor)

    @property
    def prompt_length(self) -> int:
        """Number of prompt tokens (encoder tokens for encoder-decoders)."""
        return self.prompt_ids.shape[1]

    @property
    def count(self) -> int:
        """Number of generated tokens."""
        return self.generated.shape[0]

    @property
    def first(self) -> int:
        """The position that predicted the first generated token (a decoder position for encoder-decoders)."""
        return 0 if self.encoder_decoder else self.answer_start - 1

    def target(self, index: int) -> int:
        """Generated token ``index``."""
        return int(self.generated[index])

    def inputs(self, index: int) -> dict:
        """The arguments of explain() for the prefix that generated token ``index`` was generated from."""
        if self.encoder_decoder:
            return {'input_ids': self.prompt_ids, 'decoder_input_ids': self.decoder_ids[:, : index + 1]}
        ids = self.columns[None, : self.prompt_length + index]
        if self.encoding is None:
            return {'input_ids': ids}
        return {'input_ids': extend_encoding(self.encoding, ids), 'processor': self.processor}


class _Rows:
    """The rows of a :py:class:`GenerationExplanation` as the explain() calls fill them in: each generated token's
    relevance over the columns (zeros after its prefix), its explained logit, its contrast token and, for an answer
    to images, its pixel relevance and images."""

    def __init__(self, count: int, columns: int):
        self.relevance = torch.zeros(count, columns, dtype=torch.float64)
        self.logits = torch.zeros(count, dtype=torch.float64)
        self.contrasts = torch.zeros(count, dtype=torch.long)
        self.pixels = [None] * count
        self.token_images = [None] * count
        #: PA-LRP's relevance of the positions, laid out as :py:attr:`relevance` (None without positions)
        self.positions: torch.Tensor | None = None

    def place(self, index: int, explanation, row: int) -> None:
        """Row ``row`` of ``explanation`` as generated token ``index``'s row (encoder then decoder relevance)."""
        parts = [explanation.relevance[row]]
        if explanation.decoder_relevance is not None:
            parts.append(explanation.decoder_relevance[row])
        values = torch.cat(parts).detach()
        self.relevance[index, : values.shape[0]] = values.to('cpu', torch.float64)
        positions = _positions(explanation, row)
        if positions is not None:
            if self.positions is None:
                self.positions = torch.zeros_like(self.relevance)
            self.positions[index, : positions.shape[0]] = positions.to('cpu', torch.float64)
        self.logits[index] = float(explanation.logit[row])
        if explanation.contrast is not None:
            self.contrasts[index] = int(explanation.contrast[row])
        if getattr(explanation, 'pixel_relevance', None) is not None:
            self.pixels[index] = explanation.pixel_relevance.detach().cpu()
            self.token_images[index] = [image.cpu() for image in explanation.images]


def _positions(explanation, row: int) -> torch.Tensor | None:
    """Row ``row``'s relevance of the positions (PA-LRP), encoder then decoder positions as the tokens; None
    without."""
    if getattr(explanation, 'position_relevance', None) is None:
        return None
    parts = [explanation.position_relevance[row]]
    if explanation.decoder_relevance is not None:
        decoder = explanation.decoder_position_relevance
        parts.append(torch.zeros_like(explanation.decoder_relevance[row]) if decoder is None else decoder[row])
    return torch.cat(parts).detach()


def explain_generation(
    model: torch.nn.Module,
    tokenizer,
    prompt,
    max_new_tokens: int = 20,
    method: str | None = None,
    composite: Composite | None = None,
    generate_kwargs: dict | None = None,
    batched: bool | int = False,
    progress: bool = False,
    contrast=None,
    images=None,
    **params,
) -> GenerationExplanation:
    """Generate an answer to ``prompt`` and explain every generated token and the whole answer.

    The model generates with ``model.generate`` (greedy unless ``generate_kwargs`` say otherwise). Then generated
    token ``i`` is explained over the prefix it was generated from: for a decoder-only model ``explain(model,
    ids[:, :P + i], target=ids[0, P + i])`` (``P`` prompt tokens, ``ids`` prompt and answer), for an encoder-decoder
    ``explain(model, prompt_ids, decoder_input_ids=decoder_ids[:, :i + 1], target=decoder_ids[0, i + 1])``
    (``decoder_ids`` the decoder start token and the answer); each row of ``relevance`` is that call's relevance (for
    encoder-decoders encoder then decoder relevance), padded with zeros. The whole answer is explained by one more
    call with ``target=[(position, token), ...]`` over all generated tokens on the full sequence.

    Cost: by default (``batched=False``) one ``explain`` call per generated token on its own prefix, plus one for the
    answer: ``generated + 1`` forward and backward passes over sequences of ``P`` to ``P + generated`` tokens (for
    LRP). The rows are then bit for bit what ``explain`` gives on each prefix. ``batched=True`` explains all rows in
    one call on ``generated`` copies of the full sequence (the explained position and token set per row), and
    ``batched=k`` in calls of ``k`` rows: fewer, larger passes (faster on a GPU, ``k`` times the memory of one
    call), equal to the per-prefix rows only up to rounding, because the model computes on a longer sequence: in
    float64 about 1e-16 relative from the changed order of sums inside attention, and up to about 1e-8 for models
    whose rotary position embeddings transformers computes in float32 (Llama and its kin, where the model's own
    logits at a position differ by that much between a prefix and the full sequence).

    Images: ``explain_generation(vlm, processor, text, images=[...])``: a vision-language model (LLaVA, Qwen2-VL)
    answers ``text`` (holding the processor's image token once per image, as for :py:func:`~zennit_attn.explain`)
    about the images; the second argument is then the model's processor. ``model.generate`` gets the processor's
    output (the image placeholder tokens suppressed: a generated one would stand for no image), and row ``i`` is
    ``explain(vlm, prefix, processor=processor, target=...)`` on that output with ``input_ids`` the prompt and the
    first ``i`` generated tokens (the per-token fields extended as ``model.generate`` does:
    :py:func:`~zennit_attn.inputs.vision_language.extend_encoding`), with pixel relevance for every row and the whole
    answer; for LRP, a row's text plus pixel relevance is its logit minus what biases absorb. LRP methods only; not
    with ``batched`` or ``contrast``.

    Parameters
    ----------
    model: torch.nn.Module
        A generative Hugging Face model in eval mode (``...ForCausalLM``, ``...ForConditionalGeneration``, a
        vision-language model with ``images``).
    tokenizer
        Its tokenizer (used to tokenise a text prompt, for the pad token and to show the tokens); with ``images`` the
        model's processor (whose tokenizer is then used).
    prompt: str, sequence of int, tensor, BatchEncoding or list of dict
        One prompt: text, or its ids (``[seq]`` or ``[1, seq]``), or what the tokenizer returns (unpadded), or a
        conversation (:py:func:`~zennit_attn.inputs.chat.prompt_ids`: with the template's generation prompt); for a
        vision-language model the text holding the image tokens, or what the processor returned for text and images
        (a mapping with ``pixel_values``, e.g. from ``processor.apply_chat_template(..., tokenize=True,
        return_dict=True)``; ``images`` is then left out).
    max_new_tokens: int
        Most tokens to generate (fewer if the model ends the answer).
    method: str, optional
        Attribution method (a key of :py:data:`zennit_attn.methods.registry.METHODS`); default the composite's LRP
        method, ``'attnlrp'`` without one (as for :py:func:`~zennit_attn.explain`).
    composite: zennit.core.Composite, optional
        For the LRP methods (see :py:func:`~zennit_attn.explain`).
    generate_kwargs: dict, optional
        Passed to ``model.generate`` (e.g. ``{'do_sample': True, 'top_p': 0.9}``, ``suppress_tokens``); one sequence
        only, and not ``input_ids``, ``max_new_tokens`` or ``attention_mask``, which explain_generation sets.
    batched: bool or int
        See *Cost* above.
    progress: bool
        Show a progress bar (tqdm, on stderr) over the explanation calls.
    contrast: 'runner-up', int, str or sequence, optional
        Explain each generated token against a contrast token (its logit minus the contrast's, see
        :py:func:`~zennit_attn.explain`): ``'runner-up'``, at each step the most likely token other than the
        generated one (why this token rather than the next best?); a token id or one-token text for every step; or
        one id per generated token (its length is checked once the answer is generated). The whole answer is then
        the sum of these differences.
    images: image or list of images, optional
        For a vision-language model: the images of ``prompt`` (PIL images, arrays or tensors, as the processor takes
        them), see *Images* above.
    **params
        Hyperparameters of the method.

    Returns
    -------
    GenerationExplanation

    Raises
    ------
    TypeError
        For images without the model's processor, or a model that cannot generate text (e.g. CLIP, which scores
        image-text pairs: see :py:func:`~zennit_attn.explain`).
    ValueError
        For images with ``batched``, ``contrast``, a method that is not LRP or an encoder-decoder model, and for a
        bad prompt or argument.
    """
    check_model(model)
    method = method_of(method, composite)
    processor, tokenizer = _processor_and_tokenizer(model, tokenizer, prompt, images, method, batched, contrast)
    positive(max_new_tokens, 'max_new_tokens')
    rows_per_call = _batched(batched)
    if not (isinstance(contrast, str) and contrast == RUNNER_UP):
        contrast = token_ids(tokenizer, contrast, 'contrast')  # a text that is not one token: refused before generating
    _check_can_generate(model)
    encoding = None if processor is None else _encode(model, processor, prompt, images)
    prompt_ids = _prompt_ids(tokenizer, prompt if encoding is None else encoding).to(input_device(model))
    settings = _generate_settings(model, tokenizer, max_new_tokens, generate_kwargs, encoding)
    sequences = _generate(model, prompt_ids, encoding, settings)
    answer = _Answer.from_sequences(model, prompt_ids, sequences, encoding, processor)
    options = dict(method=method, composite=composite, **params)
    contrasts = _contrasts(contrast, tokenizer, answer.count)
    rows = _Rows(answer.count, answer.columns.shape[0])
    size = rows_per_call or answer.count
    calls = answer.count if rows_per_call is None else -(-answer.count // size)
    with tqdm(total=calls + 1, desc='explaining the answer', unit='call', disable=not progress, leave=False) as bar:
        if rows_per_call is None:
            _explain_each_prefix(model, answer, rows, contrasts, options, bar)
        else:
            _explain_in_batches(model, answer, rows, contrasts, size, options, bar)
        if contrasts is not None:
            options['contrast'] = rows.contrasts.tolist()
        whole = _explain_whole_answer(model, answer, options)
        bar.update()
    return _generation_explanation(answer, rows, whole, method, tokenizer, contrasts is not None)


def _processor_and_tokenizer(model, tokenizer, prompt, images, method: str, batched, contrast) -> tuple:
    """``(processor, tokenizer)`` of an :py:func:`explain_generation` call: with images (or the processor's output as
    the prompt) the model's processor and its tokenizer, else None and the tokenizer (a processor's own for a text
    prompt); anything that cannot decode tokens is refused."""
    processor = None
    if images is not None or has_pixels(prompt):
        processor = _check_images_request(model, tokenizer, method, batched, contrast)
        tokenizer = processor.tokenizer
    elif is_processor(tokenizer):  # a text prompt: the processor's tokenizer
        tokenizer = tokenizer.tokenizer
    if tokenizer is None or not callable(getattr(tokenizer, 'decode', None)):
        raise TypeError(
            "explain_generation(model, tokenizer, prompt): the second argument must be the model's "
            f'tokenizer, got {type(tokenizer).__name__}'
        )
    return processor, tokenizer


def generate_answer(
    model: torch.nn.Module,
    tokenizer,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    generate_kwargs: dict | None = None,
) -> torch.Tensor:
    """The tokens a decoder-only model generates after ``prompt_ids`` as :py:func:`explain_generation` lets it
    generate (greedy unless ``generate_kwargs`` say otherwise, the tokenizer's pad or end-of-sequence token for
    padding), without the prompt.

    Parameters
    ----------
    model: torch.nn.Module
        A ``...ForCausalLM`` model.
    tokenizer
        Its tokenizer.
    prompt_ids: torch.Tensor
        ``[1, seq]`` the prompt's ids (one unpadded prompt).
    max_new_tokens: int
    generate_kwargs: dict, optional
        Further arguments of ``model.generate`` (not the prompt, its mask or ``max_new_tokens``).

    Returns
    -------
    torch.Tensor
        ``[generated]`` the generated ids (the end-of-sequence token included where the model generated it).

    Raises
    ------
    TypeError
        For a model that cannot generate.
    """
    _check_can_generate(model)
    settings = _generate_settings(model, tokenizer, max_new_tokens, generate_kwargs, None)
    prompt_ids = prompt_ids.to(input_device(model))
    return _generate(model, prompt_ids, None, settings)[0, prompt_ids.shape[-1] :]


def _check_can_generate(model: torch.nn.Module) -> None:
    """Refuse a model without ``generate``, or one whose ``can_generate()`` says no (e.g. a classifier)."""
    can_generate = getattr(model, 'can_generate', None)
    if not callable(getattr(model, 'generate', None)) or (callable(can_generate) and not can_generate()):
        raise TypeError(
            f'{type(model).__name__} cannot generate text: use a ...ForCausalLM or '
            '...ForConditionalGeneration model (or explain() for a single output)'
        )


def _check_generate_kwargs(generate_kwargs: dict | None, encoding: dict | None) -> dict:
    """A copy of ``generate_kwargs``, after refusing what :py:func:`explain_generation` passes itself (the prompt,
    its mask, ``max_new_tokens``, the processor's fields) and more than one returned sequence."""
    generate_kwargs = dict(generate_kwargs or {})
    for key in ('max_new_tokens', 'input_ids', 'inputs') + tuple(set(encoding or ()) - {'attention_mask'}):
        if key in generate_kwargs:
            raise ValueError(f'generate_kwargs must not hold {key!r}: it is an argument of explain_generation')
    if 'attention_mask' in generate_kwargs:
        raise ValueError(
            "generate_kwargs must not hold 'attention_mask': explain_generation explains one unpadded "
            'prompt and passes its all-ones mask itself; to give the mask with the prompt, pass the '
            "tokenizer's output as the prompt (padding is refused there)"
        )
    if generate_kwargs.get('num_return_sequences', 1) != 1:
        raise ValueError('explain_generation explains one generated sequence: num_return_sequences must be 1')
    return generate_kwargs


def _generate_settings(model, tokenizer, max_new_tokens: int, generate_kwargs: dict | None, encoding) -> dict:
    """The arguments of ``model.generate`` besides the prompt: greedy, ``max_new_tokens``, the tokenizer's pad token
    (else its end-of-sequence token), then ``generate_kwargs``; for an answer to images the image placeholder tokens
    are suppressed (a generated one would stand for no image)."""
    generate_kwargs = _check_generate_kwargs(generate_kwargs, encoding)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    settings = {'do_sample': False, 'max_new_tokens': int(max_new_tokens)}
    if pad is not None:
        settings['pad_token_id'] = pad
    settings.update(generate_kwargs)
    if encoding is not None:
        suppressed = set(settings.get('suppress_tokens') or ()) | set(placeholder_tokens(model))
        settings['suppress_tokens'] = sorted(suppressed)
    return settings


def _generate(model: torch.nn.Module, prompt_ids: torch.Tensor, encoding: dict | None, settings: dict) -> torch.Tensor:
    """The sequences ``model.generate`` returns (without gradients) for the prompt's ids with an all-ones mask, or
    for the processor's output of a prompt with images."""
    if encoding is None:
        given = {'input_ids': prompt_ids, 'attention_mask': torch.ones_like(prompt_ids)}
    else:
        dtype = getattr(model, 'dtype', None)  # the pixels in the model's type, as explain() passes them
        given = {
            key: value.to(dtype)
            if isinstance(value, torch.Tensor) and value.is_floating_point() and isinstance(dtype, torch.dtype)
            else value
            for key, value in encoding.items()
        }
    with torch.no_grad():
        sequences = model.generate(**given, **settings)
    if not isinstance(sequences, torch.Tensor):  # return_dict_in_generate=True
        sequences = sequences.sequences
    return sequences


def _explain_each_prefix(model, answer: _Answer, rows: _Rows, contrasts, options: dict, bar) -> None:
    """``batched=False``: one explain() call per generated token on exactly the prefix it was generated from, so
    that each row is bit for bit what explain() gives on that prefix."""
    for index in range(answer.count):
        step = {} if contrasts is None else {'contrast': contrasts[index] if isinstance(contrasts, list) else contrasts}
        rows.place(index, explain(model, **answer.inputs(index), target=answer.target(index), **step, **options), 0)
        bar.update()


def _explain_in_batches(model, answer: _Answer, rows: _Rows, contrasts, size: int, options: dict, bar) -> None:
    """``batched=True`` or ``k``: the rows ``size`` at a time, each call on copies of the full sequence with the
    explained position and token set per row; the columns from each row's own token on are then set to 0 (they
    come after its prefix)."""
    count = answer.count
    for start in range(0, count, size):
        indices = list(range(start, min(count, start + size)))
        targets = [answer.target(index) for index in indices]
        step = (
            {}
            if contrasts is None
            else {'contrast': [contrasts[index] for index in indices] if isinstance(contrasts, list) else contrasts}
        )
        copies = {key: value.expand(len(indices), -1) for key, value in answer.inputs(count - 1).items()}
        explanation = explain(
            model, **copies, target=targets, position=[answer.first + index for index in indices], **step, **options
        )
        for row, index in enumerate(indices):
            rows.place(index, explanation, row)
        bar.update()
    columns = torch.arange(answer.columns.shape[0])
    after = columns[None, :] >= answer.answer_start + torch.arange(count)[:, None]
    rows.relevance[after] = 0.0
    if rows.positions is not None:
        rows.positions[after] = 0.0


def _explain_whole_answer(model, answer: _Answer, options: dict):
    """One explain() call from the sum of all generated tokens' logits, ``target=[(position, token), ...]`` on the
    full sequence (up to the last generated token, which no token was generated from)."""
    targets = [(answer.first + index, answer.target(index)) for index in range(answer.count)]
    return explain(model, **answer.inputs(answer.count - 1), target=targets, **options)


def _generation_explanation(
    answer: _Answer, rows: _Rows, whole, method: str, tokenizer, contrast: bool
) -> GenerationExplanation:
    """The :py:class:`GenerationExplanation` of the filled-in ``rows`` and the ``whole`` answer's explanation, in the
    relevance's dtype (float32 for a method whose relevance is not floating point)."""
    parts = [whole.relevance[0]] + ([whole.decoder_relevance[0]] if answer.encoder_decoder else [])
    relevance = torch.cat(parts).detach()
    answer_relevance = torch.zeros(answer.columns.shape[0], dtype=torch.float64)
    answer_relevance[: relevance.shape[0]] = relevance.to('cpu', torch.float64)
    dtype = whole.relevance.dtype if whole.relevance.is_floating_point() else torch.float32
    first = answer.prompt_length if answer.encoder_decoder else answer.first
    positions, answer_positions = _positions(whole, 0), None
    if positions is not None:
        answer_positions = torch.zeros(answer.columns.shape[0], dtype=torch.float64)
        answer_positions[: positions.shape[0]] = positions.to('cpu', torch.float64)
        answer_positions = answer_positions.to(dtype)
    return GenerationExplanation(
        relevance=rows.relevance.to(dtype),
        answer_relevance=answer_relevance.to(dtype),
        input_ids=answer.columns.cpu(),
        prompt_length=answer.prompt_length,
        answer_start=answer.answer_start,
        target=answer.generated.cpu(),
        logit=rows.logits.to(dtype),
        position=torch.arange(answer.count) + first,
        method=method,
        encoder_decoder=answer.encoder_decoder,
        tokenizer=tokenizer,
        contrast=rows.contrasts if contrast else None,
        position_relevance=None if rows.positions is None else rows.positions.to(dtype),
        answer_position_relevance=answer_positions,
        **_image_fields(answer, rows, whole),
    )


def _image_fields(answer: _Answer, rows: _Rows, whole) -> dict:
    """The fields of :py:class:`GenerationExplanation` for an answer to images (none for a text prompt): each row's and
    the whole answer's pixel relevance, the images, and the columns of the image placeholder tokens."""
    if answer.encoding is None:
        return {}
    placeholders = torch.zeros(answer.columns.shape[0], dtype=torch.bool)
    if whole.image_tokens is not None:
        placeholders[: whole.image_tokens.shape[1]] = whole.image_tokens[0].cpu()
    return dict(
        pixel_relevance=torch.stack(rows.pixels),
        answer_pixel_relevance=whole.pixel_relevance.detach().cpu(),
        images=[image.cpu() for image in whole.images],
        token_images=rows.token_images,
        image_tokens=placeholders,
    )


def _check_images_request(model, processor, method: str, batched, contrast):
    """The processor of an :py:func:`explain_generation` call with images, after refusing what does not apply."""
    if not is_processor(processor):
        raise TypeError(
            'explain_generation(model, processor, prompt, images=...): with images the second argument '
            "must be the model's processor (AutoProcessor.from_pretrained(path): an image processor and "
            f'a tokenizer), got {type(processor).__name__}'
        )
    if is_similarity_model(model):
        raise TypeError(
            f'{type(model).__name__} scores (text, image) pairs and cannot generate text: explain its '
            'similarity scores with explain(model, texts, images=..., processor=...)'
        )
    if is_encoder_decoder(model):
        raise ValueError(
            'explain_generation with images explains decoder-only vision-language models (LLaVA, '
            f'Qwen2-VL); {type(model).__name__} is an encoder-decoder'
        )
    if _batched(batched) is not None:
        raise ValueError(
            'batched= does not apply with images: a vision-language model is explained one text (and '
            'its images) at a time, so each row is one explain() call on its prefix; leave out batched='
        )
    if contrast is not None:
        raise ValueError('contrast= does not apply with images (explain() with images explains logits): leave it out')
    entry = METHODS.get(method)
    if entry is not None and not entry.lrp:
        raise ValueError(
            f'explain_generation with images runs the LRP methods (attnlrp, cplrp), which give text and '
            f'pixel relevance in one backward pass; {method!r} is not one'
        )
    return processor


def _encode(model, processor, prompt, images) -> dict:
    """The processor's output for ``prompt`` and ``images`` (or ``prompt`` itself if it is one), on the model's
    input device."""
    if has_pixels(prompt):
        if images is not None:
            raise ValueError(
                "the prompt already holds pixel_values (the processor's output): leave out images=, or "
                'pass the text with images='
            )
        encoding = dict(prompt)
    else:
        encoding = dict(encode_multimodal(processor, prompt, images))
    device = input_device(model)
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in encoding.items()}


def _contrasts(contrast, tokenizer, count: int):
    """``contrast`` of :py:func:`explain_generation` for ``count`` generated tokens: None, ``'runner-up'``, one id
    for every step, or a list of one id per step."""
    if contrast is None or (isinstance(contrast, str) and contrast == RUNNER_UP):
        return contrast
    contrast = token_ids(tokenizer, contrast, 'contrast')
    if isinstance(contrast, torch.Tensor) and contrast.dim() == 0:
        contrast = int(contrast)
    if isinstance(contrast, numbers.Integral):
        return int(contrast)
    values = [
        as_integer(value, 'contrast')
        for value in (contrast.tolist() if isinstance(contrast, torch.Tensor) else contrast)
    ]
    if len(values) != count:
        raise ValueError(
            f'contrast has {len(values)} tokens, but the model generated {count}: give one per '
            f'generated token, one for all, or {RUNNER_UP!r}'
        )
    return values
