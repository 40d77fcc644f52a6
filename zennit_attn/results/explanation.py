"""What :py:func:`~zennit_attn.explain` returns: :py:class:`Explanation` (relevance per token of a language model),
:py:class:`ImageExplanation` (relevance per pixel of an image classifier) and :py:class:`MultimodalExplanation` (text
tokens and images of a vision-language or image-text similarity model, each image an :py:class:`ImageRelevance`),
each able to show and save itself through :py:mod:`zennit_attn.results.render`; and :py:data:`TargetLike`, what may be
explained.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import torch

from .render import multimodal as multimodal_views
from .render import views
from .render.layout import ScaleLike
from .render.views import save_image_explanation
from .segments import SegmentExplanation, SpansLike, first_token_share, segment_explanation

__all__ = ['TargetLike', 'Explanation', 'ImageExplanation', 'ImageRelevance', 'MultimodalExplanation']


#: An output index (or, with a tokenizer, a token's text), one per row, or several ``(position, token)`` pairs explained
#: together, or a function of the scores (:py:class:`zennit_attn.inputs.objectives.OutputFunction`).
TargetLike = (
    int
    | str
    | Sequence[int]
    | Sequence[str]
    | Sequence[tuple[int, int]]
    | torch.Tensor
    | Callable[[torch.Tensor], torch.Tensor]
    | None
)


@dataclass
class Explanation:
    """What :py:func:`~zennit_attn.explain` returns for a language model.

    Attributes
    ----------
    relevance: torch.Tensor
        ``[batch, seq]`` relevance per input token: the relevance of its word embedding vector summed over the
        hidden dimension (position and segment embeddings do not count toward it). 0 at padding.
    embedding_relevance: torch.Tensor or None
        ``[batch, seq, hidden]`` relevance of the word embedding vectors (None for methods that give only
        per-token scores).
    target: torch.Tensor
        ``[batch]`` the explained output index (vocabulary token, class or hidden unit).
    logit: torch.Tensor
        ``[batch]`` the explained output value; for LRP it is the initial relevance.
    position: torch.Tensor or None
        ``[batch]`` the explained sequence position, None for 2-D outputs (classification heads).
    input_ids: torch.Tensor
        ``[batch, seq]`` the explained input.
    attention_mask: torch.Tensor or None
        The attention mask that was used.
    decoder_relevance, decoder_embedding_relevance, decoder_input_ids, decoder_attention_mask: torch.Tensor or None
        For encoder-decoder models, the same for the decoder tokens (``relevance`` is the encoder's); the
        explained position is a decoder position.
    method: str
        The attribution method's name.
    tokenizer: object or None
        The tokenizer given to :py:func:`~zennit_attn.explain` (None if none was), used by :py:meth:`tokens`,
        :py:meth:`show`, :py:meth:`to_html` and :py:meth:`save` when they are not given one; not compared and not
        shown in ``repr``.
    latent: zennit_attn.latent.Latent or None
        Latent relevance recorded with ``explain(..., latent=...)`` (``explanation.latent['mlp']`` etc., see
        :py:mod:`zennit_attn.latent`); None otherwise. Not compared and not shown in ``repr``.
    contrast: torch.Tensor or None
        With ``explain(..., contrast=...)``: the contrast token of each row (shaped as ``target``); ``logit`` is then
        the target's logit minus the contrast's.
    objective: zennit_attn.inputs.objectives.Objective or None
        What was explained of the scores (:py:mod:`zennit_attn.inputs.objectives`: the logit, a contrast, a target
        function; for a target function ``target`` holds the predicted token, for reference). Not compared and not
        shown in ``repr``.
    template: torch.Tensor or None
        For a conversation (``explain(model, messages, tokenizer=...)``, :py:mod:`zennit_attn.inputs.chat`):
        ``[batch, seq]`` True for the chat template's tokens. They keep their relevance; the heatmaps leave them out
        unless ``template=True``.
    position_relevance: torch.Tensor or None
        With PA-LRP (``method='palrp'``, or a composite with ``positions=True``: :py:mod:`zennit_attn.rules.positions`):
        ``[batch, seq]`` relevance of the positions, that of the position encodings' outputs (rotary ``cos`` and
        ``sin`` of every layer, learned or sinusoidal tables) summed over their features; 0 at padding. The token
        relevance and it together are what the relevance of an input of position-token pairs sums to. For
        encoder-decoder models the encoder's positions. None otherwise.
    decoder_position_relevance: torch.Tensor or None
        With PA-LRP on an encoder-decoder model: ``[batch, decoder_seq]`` the decoder's positions, as
        ``position_relevance`` the encoder's. None otherwise.
    choices: int or None
        For a multiple-choice head (:py:mod:`zennit_attn.inputs.choices`): the number of choices per row. The choices'
        tokens are then one after another, ``input_ids``, ``relevance`` and ``attention_mask`` ``[batch, choices *
        seq]`` (:py:attr:`choice_relevance`: ``[batch, choices, seq]``), and ``target`` is the explained choice. None
        otherwise.

    Notes
    -----
    When several ``(position, token)`` pairs are explained at once, ``target``, ``position`` and ``logit`` are
    ``[batch, pairs]`` and the relevance is that of their sum.

    The heatmap methods show tokens as the tokenizer writes them
    (:py:func:`zennit_attn.results.render.tokens.token_texts`), optionally merged into words (``words=True``, relevance
    summed), padding left out, encoder and decoder tokens for encoder-decoder models; colours come from one diverging
    map centred at 0 (:py:func:`zennit_attn.results.render.colors.relevance_to_rgb`). ``scale`` is None (each heatmap
    its own largest absolute relevance), ``'shared'`` (one scale for all rows drawn together) or a number, e.g.
    :py:func:`zennit_attn.results.render.shared_scale` of several explanations.
    """

    relevance: torch.Tensor
    embedding_relevance: torch.Tensor | None
    target: torch.Tensor
    logit: torch.Tensor
    position: torch.Tensor | None
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    decoder_relevance: torch.Tensor | None = None
    decoder_embedding_relevance: torch.Tensor | None = None
    decoder_input_ids: torch.Tensor | None = None
    decoder_attention_mask: torch.Tensor | None = None
    method: str = 'attnlrp'
    tokenizer: object = field(default=None, repr=False, compare=False)
    latent: object = field(default=None, repr=False, compare=False)
    contrast: torch.Tensor | None = None
    objective: object = field(default=None, repr=False, compare=False)
    template: torch.Tensor | None = None
    position_relevance: torch.Tensor | None = None
    decoder_position_relevance: torch.Tensor | None = None
    choices: int | None = None
    #: whether ``relevance`` already holds the positions' (a copy made by :py:meth:`with_positions`)
    pairs: bool = False

    @property
    def choice_relevance(self) -> torch.Tensor:
        """``[batch, choices, seq]`` the token relevance of a multiple-choice head per choice.

        Raises
        ------
        ValueError
            For the explanation of a model that does not score choices."""
        if self.choices is None:
            raise ValueError('choice_relevance is the relevance of a multiple-choice head; this model has no choices')
        return self.relevance.unflatten(1, (self.choices, -1))

    def tokens(self, tokenizer=None, row: int = 0, words: bool = False, template: bool = False) -> list[str]:
        """The tokens of ``row`` as the tokenizer writes them (``'Ġ'``, ``'▁'`` and byte fallbacks decoded), as the
        heatmaps show them: padding removed, and the tokens of a chat template (:py:attr:`template`) unless
        ``template``; for encoder-decoder models the encoder tokens, then the decoder tokens. With ``template=True`` and
        no padding, the tokens are one per entry of ``relevance[row]``.

        Parameters
        ----------
        tokenizer: optional
            Default: the one given to :py:func:`~zennit_attn.explain`.
        row: int
            The batch row (negative counts from the end).
        words: bool
            Merge tokens into words.
        template: bool
            Keep the tokens of a chat template.

        Returns
        -------
        list of str
        """
        return views.explanation_tokens(self, tokenizer, row, words, template)

    def with_positions(self) -> Explanation:
        """The explanation of the input as position-token pairs (PA-LRP, :py:mod:`zennit_attn.rules.positions`): a copy
        whose ``relevance`` is each token's plus its position's (:py:attr:`position_relevance`; of an encoder-decoder
        model also ``decoder_relevance`` plus :py:attr:`decoder_position_relevance`), for every view (:py:meth:`show`,
        :py:meth:`to_html`, :py:meth:`save`, :py:meth:`top`); ``embedding_relevance`` and the position relevance are
        kept as they are.

        Raises
        ------
        ValueError
            For an explanation without position relevance (a method other than ``'palrp'``, a composite without
            ``positions=True``), and for what :py:meth:`with_positions` returned (its positions would count twice).
        """
        if self.position_relevance is None:
            raise ValueError(
                f"this {self.method} explanation has no position relevance: explain with method='palrp' (or a "
                'composite with positions=True)'
            )
        _check_not_pairs(self)
        decoder = self.decoder_relevance
        if self.decoder_position_relevance is not None:
            decoder = decoder + self.decoder_position_relevance
        return replace(self, relevance=self.relevance + self.position_relevance, decoder_relevance=decoder, pairs=True)

    def top(self, k: int, tokenizer=None, row: int = 0) -> list[tuple[int, float, str | None]]:
        """The ``k`` most relevant positions of ``row`` as ``(position, relevance, token)``; padding excluded. The
        token is decoded with ``tokenizer`` (default: the stored one), None without either."""
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        relevance = self.relevance[row].detach().cpu().double()  # float64: no ranking of rounded values
        if self.attention_mask is not None:
            relevance = relevance.masked_fill(self.attention_mask[row].cpu() == 0, float('-inf'))
        count = relevance.shape[0] if self.attention_mask is None else int((self.attention_mask[row] != 0).sum())
        values, indices = relevance.topk(min(k, count))
        decode = (
            (lambda index: None)
            if tokenizer is None
            # noqa: E731
            else (lambda index: tokenizer.decode([int(self.input_ids[row, index])]))
        )
        return [(int(index), float(value), decode(index)) for value, index in zip(values, indices)]

    @property
    def first_token_share(self) -> torch.Tensor:
        """``[batch]`` float64: the first (non-padding) token's share of the absolute relevance of its row,
        ``|R_first| / sum_i |R_i|`` (the encoder's tokens for encoder-decoder models; NaN for a row of zeros).

        On Llama-, Qwen- and Gemma-like models the first token is an *attention sink*: many heads put attention
        there that should change nothing, and relevance follows it, so the first token's relevance is large
        whatever it says. A share far above ``1 / tokens`` is that effect, not evidence that the first word matters;
        ``show(..., scale_without_first=True)`` (and ``to_html``, ``save``) keeps it out of the colour scale. See
        :py:func:`zennit_attn.results.segments.first_token_share`.
        """
        return first_token_share(self.relevance, self.attention_mask)

    def segments(
        self,
        spans: SpansLike,
        labels: Sequence[str] | None = None,
        text: str | None = None,
        row: int = 0,
        tokenizer=None,
    ) -> SegmentExplanation:
        """The relevance of ``row`` summed over segments of its text (sentences, documents, few-shot examples,
        chat turns), shown per segment by the result's ``show``, ``to_html`` and ``save``.

        Tokens are matched to characters with the tokenizer's offset mapping (``text`` tokenised again must give
        the explained ids; special tokens have no characters). A token belongs to the segment holding its first
        non-whitespace character; tokens in no segment (special tokens, template text, whitespace between spans)
        go to ``other``, so that the segments' relevance plus ``other`` is the row's total relevance.

        Parameters
        ----------
        spans: list of (int, int), Template or 'sentences'
            Character spans ``(start, end)`` of ``text`` (not overlapping, in any order), a
            :py:class:`zennit_attn.results.segments.Template` (its slots; ``text`` is the template's), or
            ``'sentences'`` (:py:func:`zennit_attn.results.segments.sentences`).
        labels: sequence of str, optional
            One per span (default ``'span 0'``, ... or ``'sentence 1'``, ...); not with a Template.
        text: str, optional
            The explained text; default the row's ids decoded without special tokens.
        row: int
        tokenizer: optional
            Default: the stored one; needed (a fast tokenizer, with offsets).

        Returns
        -------
        zennit_attn.results.segments.SegmentExplanation

        Raises
        ------
        ValueError
            For overlapping spans, a span outside the text or empty, labels that are not one distinct str per span
            (or ``'other'``), a text that does not tokenise to the explained ids, no tokenizer, or a tokenizer without
            offsets.
        """
        return segment_explanation(self, spans, labels, text, row, tokenizer)

    def heatmaps(
        self, rows=None, words: bool = False, tokenizer=None, scale_without_first: bool = False, template: bool = False
    ) -> list:
        """The :py:class:`~zennit_attn.results.render.layout.Heatmap` of each of ``rows`` (default all), what every
        format draws (scales not yet resolved); ``template``: show a chat template's tokens too."""
        return views.explanation_heatmaps(self, rows, words, tokenizer, scale_without_first, template)

    def show(
        self,
        row: int = 0,
        words: bool = False,
        scale: ScaleLike = None,
        color: bool | None = None,
        tokenizer=None,
        stream: IO | None = None,
        scale_without_first: bool = False,
        template: bool = False,
    ) -> None:
        """Print the heatmap of ``row``: coloured token boxes on a terminal (24-bit colour unless ``NO_COLOR`` is
        set), ``token[relevance]`` otherwise.

        Parameters
        ----------
        row: int
        words: bool
            Merge tokens into words (relevance summed).
        scale: None, 'shared' or float
            Relevance of full colour; default the row's largest absolute relevance.
        color: bool, optional
            Force colour on (True) or off (False).
        tokenizer: optional
            Default: the stored one.
        stream: file-like, optional
            Default ``sys.stdout``.
        scale_without_first: bool
            Leave the first token (an attention sink, see :py:attr:`first_token_share`) out of the colour scale; it
            is drawn fully saturated and the caption gives its relevance and share.
        template: bool
            For a conversation: show the chat template's tokens (role markers, special tokens) too; by default only
            the messages' content is shown (the template's tokens keep their relevance).
        """
        views.show_heatmaps(self.heatmaps([row], words, tokenizer, scale_without_first, template), scale, color, stream)

    def to_html(
        self,
        rows=None,
        words: bool = False,
        scale: ScaleLike = None,
        tokenizer=None,
        scale_without_first: bool = False,
        template: bool = False,
    ) -> str:
        """A standalone HTML page (inline style, no scripts) with one heatmap per row (default all rows).

        Parameters
        ----------
        rows: int, sequence of int or None
        words: bool
        scale: None, 'shared' or float
            ``'shared'`` gives all rows one colour scale.
        tokenizer: optional
        scale_without_first, template: bool
            See :py:meth:`show`.

        Returns
        -------
        str
        """
        return views.heatmaps_html(
            self.heatmaps(rows, words, tokenizer, scale_without_first, template),
            scale,
            title=f'Token relevance ({self.method})',
        )

    def _repr_html_(self) -> str | None:
        """Jupyter's rich display: the heatmaps of all rows as an HTML fragment (needs the stored tokenizer)."""
        if self.tokenizer is None:
            return None  # Jupyter falls back to the repr
        return views.heatmaps_html(self.heatmaps(), standalone=False)

    def save(
        self,
        path: str | os.PathLike,
        row: int | None = 0,
        words: bool = False,
        scale: ScaleLike = None,
        tokenizer=None,
        scale_without_first: bool = False,
        template: bool = False,
        **options,
    ) -> Path:
        """Write the heatmap of ``row`` (None: all rows) in the format of the suffix of ``path``.

        ``.html`` (standalone page), ``.png``, ``.svg``, ``.pdf`` (matplotlib figures; options ``width`` in inches,
        ``font_size``, ``dpi``, ``colorbar``), ``.tex`` (a LaTeX snippet of colour boxes for ``\\input``, needing
        ``\\usepackage{xcolor}``; ``document=True`` writes a complete document instead). Missing folders are made.

        Parameters
        ----------
        path: str or os.PathLike
        row: int or None
        words: bool
        scale: None, 'shared' or float
        tokenizer: optional
        scale_without_first, template: bool
            See :py:meth:`show`.
        **options
            Options of the format (above).

        Returns
        -------
        pathlib.Path

        Raises
        ------
        ValueError
            For a suffix other than the five.
        OSError
            Where ``path`` cannot be written.
        """
        views.check_output(path)
        return views.save_heatmaps(
            self.heatmaps(None if row is None else [row], words, tokenizer, scale_without_first, template),
            path,
            scale,
            title=f'Token relevance ({self.method})',
            **options,
        )


@dataclass
class ImageExplanation:
    """What :py:func:`~zennit_attn.explain` returns for an image classifier.

    Attributes
    ----------
    relevance: torch.Tensor
        ``[batch, height, width]`` relevance per pixel (summed over channels); of a video ``[batch, frames, height,
        width]``.
    pixel_relevance: torch.Tensor
        ``[batch, channels, height, width]`` relevance per pixel and channel; of a video ``[batch, frames, channels,
        height, width]``.
    target: torch.Tensor
        ``[batch]`` the explained class (-1 for a function of an output map, ``target=callable`` on a segmentation).
    logit: torch.Tensor
        ``[batch]`` the explained logit; for LRP the initial relevance.
    pixels: torch.Tensor
        ``[batch, channels, height, width]`` the explained input (of a video ``[batch, frames, channels, height,
        width]``).
    method: str
        The attribution method's name.
    latent: zennit_attn.latent.Latent or None
        Latent relevance recorded with ``explain(..., latent=...)``; None otherwise.
    contrast, objective
        As for :py:class:`Explanation`.
    position: torch.Tensor or None
        ``[batch]`` the explained position of a model with outputs per position (a detector's object query,
        ``explain(..., position=)``); None for a classifier.
    position_relevance: torch.Tensor or None
        With PA-LRP (``method='palrp'``, :py:mod:`zennit_attn.rules.positions`) on a vision transformer: ``[batch,
        tokens]`` relevance of its position table, per token (the prefix tokens, class token first, then the patches
        row by row), summed over the features. Pixels and positions together are what the relevance of an input of
        position-patch pairs sums to. None otherwise.
    position_pixel_relevance: torch.Tensor or None
        With ``position_relevance``: ``[batch, channels, height, width]`` the patches' position relevance spread evenly
        over the pixels and channels of each patch (the prefix tokens' positions have no pixels and are left out), what
        :py:meth:`with_positions` adds.
    """

    relevance: torch.Tensor
    pixel_relevance: torch.Tensor
    target: torch.Tensor
    logit: torch.Tensor
    pixels: torch.Tensor
    method: str = 'attnlrp'
    latent: object = field(default=None, repr=False, compare=False)
    contrast: torch.Tensor | None = None
    objective: object = field(default=None, repr=False, compare=False)
    position: torch.Tensor | None = None
    position_relevance: torch.Tensor | None = None
    position_pixel_relevance: torch.Tensor | None = None
    #: whether ``relevance`` and ``pixel_relevance`` already hold the positions' (a copy made by
    #: :py:meth:`with_positions`)
    pairs: bool = False

    def with_positions(self) -> ImageExplanation:
        """The explanation of the image as position-patch pairs (PA-LRP): a copy whose ``pixel_relevance`` and
        ``relevance`` hold each pixel's relevance plus its share of its patch's position relevance
        (:py:attr:`position_pixel_relevance`), for :py:meth:`save` and the other views; the positions of the prefix
        tokens (the class token's) are in :py:attr:`position_relevance` alone.

        Raises
        ------
        ValueError
            For an explanation without position relevance (a method other than ``'palrp'``), and for what
            :py:meth:`with_positions` returned (its positions would count twice).
        """
        if self.position_pixel_relevance is None:
            raise ValueError(
                f'this {self.method} explanation has no position relevance: explain a vision transformer with '
                "method='palrp' (or a composite with positions=True)"
            )
        _check_not_pairs(self)
        spread = self.position_pixel_relevance
        return replace(
            self,
            relevance=self.relevance + spread.sum(2 if spread.dim() == 5 else 1),
            pixel_relevance=self.pixel_relevance + spread,
            pairs=True,
        )

    def save(self, path: str | os.PathLike, row: int = 0, frame: int | None = None, **options) -> tuple[Path, Path]:
        """Write the heatmap of ``row`` to ``path`` (a ``.png``) and its overlay on the image to
        ``<stem>_overlay.png`` beside it (:py:func:`zennit_attn.results.render.views.save_image_explanation`).

        Parameters
        ----------
        path: str or os.PathLike
            A ``.png`` file name.
        row: int
        frame: int, optional
            Of a video: the frame to draw (required).
        **options
            ``cmap``, ``level``, ``scale`` (integer upscaling), ``vmax`` (relevance of full colour), and for the
            overlay ``alpha``, ``mean``, ``std``.

        Returns
        -------
        tuple of pathlib.Path
            ``(heatmap, overlay)``.

        Raises
        ------
        ValueError
            For a video without ``frame``, and for ``frame`` with an image (IndexError: a frame out of range).
        """
        if (frame is None) != (self.pixels.dim() == 4):
            raise ValueError(
                'frame= names the frame of a video to draw: '
                + ('give it for this video' if frame is None else 'this explanation is of images')
            )
        if frame is not None:
            frame = views.check_row(frame, self.pixels.shape[1], 'frame')
            picture = replace(
                self,
                relevance=self.relevance[:, frame],
                pixel_relevance=self.pixel_relevance[:, frame],
                pixels=self.pixels[:, frame],
            )
            return picture.save(path, row, **options)
        return save_image_explanation(self, path, views.check_row(row, self.relevance.shape[0]), **options)


def _check_not_pairs(explanation) -> None:
    """Refuse ``with_positions()`` of a copy that already holds the positions' relevance (it would add it twice)."""
    if explanation.pairs:
        raise ValueError(
            'this explanation already holds the positions in its relevance (it is what with_positions() returned): '
            'adding them again would count them twice'
        )


@dataclass
class ImageRelevance:
    """The relevance of one input image of a :py:class:`MultimodalExplanation`, in the image's own layout.

    Attributes
    ----------
    row: int
        The batch row (text) the image belongs to.
    pixels: torch.Tensor
        ``[channels, height, width]`` the image as the model took it (the processor's normalised pixels).
    relevance: torch.Tensor
        ``[channels, height, width]`` relevance per pixel and channel; for flattened-patch models (Qwen2-VL) the sum
        over the copies of the image in the temporal patch.
    patch_relevance: torch.Tensor
        ``[rows, columns]`` relevance per patch of the vision encoder (the sum of :py:attr:`relevance` over each
        patch).
    mean, std: tuple of float or None
        The processor's per-channel normalisation, undone for the overlay.
    """

    row: int
    pixels: torch.Tensor
    relevance: torch.Tensor
    patch_relevance: torch.Tensor
    mean: tuple | None = None
    std: tuple | None = None

    @property
    def total(self) -> float:
        """The image's relevance, summed over all its pixels and channels."""
        return float(self.relevance.sum())

    def cpu(self) -> ImageRelevance:
        """A copy with the tensors detached and on the CPU."""
        return ImageRelevance(
            self.row,
            self.pixels.detach().cpu(),
            self.relevance.detach().cpu(),
            self.patch_relevance.detach().cpu(),
            self.mean,
            self.std,
        )


@dataclass
class MultimodalExplanation(Explanation):
    """What :py:func:`~zennit_attn.explain` returns for a vision-language model (LLaVA, Qwen2-VL) or an image-text
    similarity model (CLIP): the fields of :py:class:`Explanation` for the text tokens, and the images.

    Attributes
    ----------
    pixel_relevance: torch.Tensor
        Relevance at ``pixel_values`` in the processor's layout (``[images, channels, height, width]``, or
        ``[patches, channels * temporal * patch * patch]`` with ``image_grid_thw`` for Qwen2-VL).
    images: list of ImageRelevance
        Every image in its own layout, with its row, pixel and patch relevance.
    image_tokens: torch.Tensor or None
        ``[batch, seq]`` True at the image placeholder tokens of the text (their embeddings are replaced by the
        image features, so their own relevance is 0); the heatmaps show each run of them as ``[image k]``.

    Notes
    -----
    For LRP the text relevance plus the relevance of all images of a row is the explained logit minus what biases
    and the softmax rule absorb (:py:meth:`total`); CP-LRP conserves it exactly in a model without biases.
    """

    pixel_relevance: torch.Tensor | None = None
    images: list = field(default_factory=list)
    image_tokens: torch.Tensor | None = None

    def image_relevance(self, row: int = 0) -> float:
        """The relevance of all images of ``row``, summed."""
        row = views.check_row(row, self.relevance.shape[0])
        return sum(image.total for image in self.images if image.row == row)

    def total(self, row: int = 0) -> float:
        """Text plus image relevance of ``row``: for LRP, the explained logit minus what biases absorb."""
        row = views.check_row(row, self.relevance.shape[0])
        return float(self.relevance[row].sum()) + self.image_relevance(row)

    def show(
        self,
        row: int = 0,
        words: bool = False,
        scale: ScaleLike = None,
        color: bool | None = None,
        tokenizer=None,
        stream: IO | None = None,
        scale_without_first: bool = False,
        template: bool = False,
    ) -> None:
        """Print the token heatmap of ``row`` and, below it, each of its images as a grid of patch relevance
        (coloured cells on a terminal, numbers otherwise); arguments as :py:meth:`Explanation.show`."""
        super().show(row, words, scale, color, tokenizer, stream, scale_without_first, template)
        multimodal_views.show_images(self._images(row), color, stream)

    def to_html(
        self,
        rows=None,
        words: bool = False,
        scale: ScaleLike = None,
        tokenizer=None,
        scale_without_first: bool = False,
        template: bool = False,
        **options,
    ) -> str:
        """A standalone HTML page: the overlay of each image (``options`` of
        :py:func:`zennit_attn.results.render.image.overlay`) above the token heatmaps; arguments as
        :py:meth:`Explanation.to_html`."""
        heatmaps = self.heatmaps(rows, words, tokenizer, scale_without_first, template)
        return multimodal_views.multimodal_html(heatmaps, self._images(rows), scale, title=self._title(), **options)

    def _repr_html_(self) -> str | None:
        if self.tokenizer is None:
            return None
        return multimodal_views.multimodal_html(self.heatmaps(), self._images(None), standalone=False)

    def save(
        self,
        path: str | os.PathLike,
        row: int | None = 0,
        words: bool = False,
        scale: ScaleLike = None,
        tokenizer=None,
        scale_without_first: bool = False,
        template: bool = False,
        **options,
    ) -> Path:
        """Write the token heatmap of ``row`` (None: all rows) with the overlay of each of its images, in the
        format of the suffix of ``path``: ``.html`` (images inline), ``.png``, ``.svg``, ``.pdf`` (one figure, the
        images above the tokens), ``.tex`` (a snippet that includes the overlays, written as PNG files beside it:
        ``<stem>_image<k>.png``; needs ``\\usepackage{graphicx}``). Options: those of :py:meth:`Explanation.save`
        and the overlay's ``alpha``, ``cmap``, ``level``, ``vmax``.

        Returns
        -------
        pathlib.Path
        """
        views.check_output(path)
        heatmaps = self.heatmaps(None if row is None else [row], words, tokenizer, scale_without_first, template)
        return multimodal_views.save_multimodal(
            heatmaps, self._images(row), path, scale, title=self._title(), **options
        )

    def _title(self) -> str:
        return f'Token and pixel relevance ({self.method})'

    def _images(self, rows) -> list:
        """``[(caption, pixels, relevance, patch relevance, mean, std)]`` of the images of ``rows`` (None: all)."""
        if rows is None:
            rows = range(self.relevance.shape[0])
        elif isinstance(rows, int):
            rows = [rows]
        rows = [views.check_row(row, self.relevance.shape[0]) for row in rows]
        shown = []
        for index, image in enumerate(self.images):
            if image.row in rows:
                number = sum(other.row == image.row for other in self.images[:index]) + 1
                caption = f'row {image.row}, image {number}: relevance {image.total:.4g}'
                shown.append((caption, image.pixels, image.relevance, image.patch_relevance, image.mean, image.std))
        return shown
