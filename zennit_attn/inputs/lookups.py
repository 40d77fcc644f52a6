"""Token relevance of language models that must be run on their token ids: the embedding lookups as inputs.

zennit-attn reads a token's relevance at its word embedding vector, which most models take as input
(``inputs_embeds``). Some models need the ids themselves: Gemma 3n and Gemma 4 look every token up in a second,
per-layer embedding table, DeepSeek-V4 routes by token id, and some forwards take no ``inputs_embeds`` at all
(:py:func:`needs_ids` says which and why). Such a model is run on ``input_ids``, and :py:class:`TokenLookups`
replaces the output of each lookup of the ids by a tensor whose relevance is read: the word embedding's by the
task's input, every other token table's by a new leaf. The rows a token's id selects are that token's input
vectors (the inputs ``x`` of Eq. (2)), so a token's relevance is the sum over all its lookups; for CP-LRP the
relevance of all lookups together sums to the explained logit, as at ``inputs_embeds``. A model that puts tokens of its
own ahead of the ids (CPM-Ant's prompt) looks them up with the ids: their rows are constants of the model, whose
relevance no input token gets (like a bias's; :py:attr:`TokenLookups.own` holds it after an LRP run).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch

from ..core.devices import input_device
from ..core.modules import forward_parameters, is_encoder_decoder
from ..rules.boundary import input_relevance
from .checks import ModelFacts, model_facts, reads_ids, run_probe

__all__ = ['id_tables', 'needs_ids', 'TokenLookups']


class _Found(Exception):
    """Raised by :py:func:`id_tables`' hooks once every candidate table has been looked up: the rest of the forward
    pass is not needed."""


def id_tables(
    model: torch.nn.Module, word: torch.nn.Module | None, facts: ModelFacts | None = None
) -> list[tuple[str, torch.nn.Module]]:
    """The tables besides ``word`` that ``model`` looks its token ids up in (Gemma 3n's and Gemma 4's per-layer
    embeddings), recognised by their index, whatever their size.

    The candidates are the modules of ``word``'s class or :py:class:`torch.nn.Embedding` (positions, token types,
    per-layer tables) besides ``word`` and the word embeddings of models inside the model (BLT's entropy patcher,
    another language model). If there are any, the model is run without gradients on eight ordinary token ids in
    falling order (``input_ids`` only) until each candidate has been looked up once: a table is looked up with the
    ids if its index has their shape and equals them at at least half of the entries (a table indexed by a tensor
    computed from the ids, such as Gemma 3n's ``where(ids < rows, ids, 0)``, counts; positions and token types rise
    or stay constant, so they equal falling ids at one entry at most), and it returns a row per id
    (:py:func:`_looks_up`). A forward pass that fails on the ids alone (a model that needs images or a decoder input)
    ends the search with the tables found before it. Encoder-decoder models have none (their decoder's table is the
    decoder's input).

    The tables are a fact of the model (:py:class:`~zennit_attn.inputs.checks.ModelFacts`, for each ``word``): the
    search runs once per model and is kept while the model stays the same; ``facts``: the model's facts if the caller
    has them (:py:func:`~zennit_attn.inputs.checks.check_model` returns them).

    Returns
    -------
    list of (str, torch.nn.Module)
        ``(name, module)`` of each such table, in module order.
    """
    if not isinstance(word, torch.nn.Module):
        return _search_id_tables(model, word)
    facts = model_facts(model) if facts is None else facts
    # names, not modules: the facts keep no module alive (the key holds each name's module while they are kept)
    names = facts.known(
        ('id tables', weakref.ref(word)), lambda: tuple(name for name, _ in _search_id_tables(model, word))
    )
    return [(name, model.get_submodule(name)) for name in names]


def _candidate_tables(model: torch.nn.Module, word: torch.nn.Module | None) -> list[tuple[str, torch.nn.Module]]:
    """The modules :py:func:`id_tables` tries: of ``word``'s class or embeddings, not ``word``, not the word
    embeddings of models inside the model."""
    nested = set()  # the word embeddings of models inside the model (BLT's entropy patcher: another language model)
    for module in model.modules():
        if hasattr(type(module), 'get_input_embeddings'):  # the class: a module's missing attribute costs an exception
            with contextlib.suppress(Exception):
                nested.add(id(module.get_input_embeddings()))
    return [
        (name, module)
        for name, module in model.named_modules()
        if (isinstance(module, torch.nn.Embedding) or type(module) is type(word))
        and module is not word
        and id(module) not in nested
    ]


def _search_id_tables(model: torch.nn.Module, word: torch.nn.Module | None) -> list[tuple[str, torch.nn.Module]]:
    """:py:func:`id_tables` found by running the model (see there)."""
    rows = getattr(word, 'num_embeddings', None)
    if not isinstance(rows, int) or is_encoder_decoder(model):
        return []
    candidates = _candidate_tables(model, word)
    if not candidates:
        return []
    length = min(8, rows)
    first = min(rows - 1, rows // 4 + length)  # ordinary tokens, past the special ones at the start of vocabularies
    weight = getattr(word, 'weight', None)  # the device of the ids: the word table's, unless offloaded
    device = weight.device if isinstance(weight, torch.Tensor) and not weight.is_meta else input_device(model)
    ids = torch.arange(first, first - length, -1, device=device)[None]
    seen, found = set(), set()

    def hook(name):
        def record(module, args, output):
            if _looks_up(args, output, ids):
                found.add(name)
            seen.add(name)
            if len(seen) == len(candidates):
                raise _Found

        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in candidates]
    try:
        # _Found: each candidate looked up; another error: the model needs more than the ids (images, a decoder
        # input), and the tables are those looked up before it
        with contextlib.suppress(Exception):
            run_probe(model, input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    return [(name, module) for name, module in candidates if name in found]


def _looks_up(args: tuple, output, ids: torch.Tensor) -> bool:
    """Whether a table's call (its positional ``args`` and ``output``) is a lookup of the token ids ``ids``: its index
    (the first argument) has their shape and equals them at at least half of the entries (a model may replace some,
    e.g. image placeholders), and the output has a row per id (``[*ids.shape, ...]``). A table called with the ids
    that looks up something else in them is not (BigBird-Pegasus's decoder passes ``input_ids`` to its learned
    positions, which look up ``arange(seq)``: ``[seq, hidden]``, a constant of the model like a bias)."""
    index = args[0] if args else None
    return (
        isinstance(index, torch.Tensor)
        and index.shape == ids.shape
        and isinstance(output, torch.Tensor)
        and output.shape[: ids.dim()] == ids.shape
        and 2 * int((index == ids.to(index.device)).sum()) >= ids.numel()
    )


def needs_ids(
    model: torch.nn.Module,
    word: torch.nn.Module | None,
    tables: list[tuple[str, torch.nn.Module]] | None = None,
    facts: ModelFacts | None = None,
) -> str | None:
    """Why ``model`` must be run on ``input_ids`` rather than on its word embeddings ``word``, None if it need not.

    A model needs its ids if its forward takes no ``inputs_embeds``, if it looks the ids up in another table
    (:py:func:`id_tables`; per-layer embeddings: Gemma 3n run on ``inputs_embeds`` leaves them out or recovers the ids
    from the embeddings, so that their lookups would be constants), or if a module inside it takes ``input_ids``
    without an ``inputs_embeds`` alternative (routing by token id; also the scaled word embeddings of the Gemma
    models, whose forward names its argument so), or if its output on the ids differs from its output on their
    embeddings (:py:func:`~zennit_attn.inputs.checks.reads_ids`: sequence classifiers that pool at the last token that
    is not padding). Encoder-decoder models are run on embeddings (their decoder's table
    is the decoder's input, not a second table of the encoder's tokens).

    Parameters
    ----------
    model: torch.nn.Module
    word: torch.nn.Module or None
        Its word embedding module (``model.get_input_embeddings()``).
    tables: list of (str, torch.nn.Module), optional
        :py:func:`id_tables` of the model if already known (found here otherwise).
    facts: ModelFacts, optional
        The model's facts if the caller has them: the walk over the modules' forward signatures runs once per model
        (a fact of the model, :py:class:`~zennit_attn.inputs.checks.ModelFacts`).
    """
    if is_encoder_decoder(model):
        return None
    if 'inputs_embeds' not in forward_parameters(model):
        return f'the forward of {type(model).__name__} takes no inputs_embeds'
    if word is None:
        return None
    facts = model_facts(model) if facts is None else facts
    tables = id_tables(model, word, facts) if tables is None else tables
    if tables:
        return f'it looks the token ids up in {tables[0][0]!r} too'
    return facts.known('module taking ids', lambda: _module_taking_ids(model)) or reads_ids(model, facts)


def _module_taking_ids(model: torch.nn.Module) -> str | None:
    """Why a module inside ``model`` needs the token ids (see :py:func:`needs_ids`), None if none does."""
    for name, module in model.named_modules():
        parameters = forward_parameters(module)
        if (
            name
            and not hasattr(type(module), 'get_input_embeddings')
            and 'input_ids' in parameters
            and 'inputs_embeds' not in parameters
        ):
            return f'{name!r} ({type(module).__name__}) takes the token ids'
    return None


class TokenLookups:
    """The token-indexed embedding lookups of a model that is run on its ids (see the module's description).

    Parameters
    ----------
    model: torch.nn.Module
        The language model.
    word: torch.nn.Module
        Its word embedding module (``model.get_input_embeddings()``).
    tables: list of (str, torch.nn.Module), optional
        :py:func:`id_tables` of the model if already known (found here otherwise).
    """

    def __init__(
        self, model: torch.nn.Module, word: torch.nn.Module, tables: list[tuple[str, torch.nn.Module]] | None = None
    ):
        self.model = model
        self.word = word
        #: ``(name, module)`` of the other tables the model looks its ids up in (per-layer embeddings,
        #: :py:func:`id_tables`)
        self.tables = id_tables(model, word) if tables is None else list(tables)
        self._leaves: list[torch.Tensor] = []
        self._recording = False
        #: after an LRP run (:py:meth:`record`), the leaf of the tokens the model puts ahead of the ids itself
        #: (CPM-Ant's prompt; ``[batch, own tokens, hidden]``, its gradient their relevance, which no token of the
        #: input gets: absorbed like a bias's), empty for a model that adds none
        self.own: list[torch.Tensor] = []

    def record(self) -> None:
        """Make the next :py:meth:`substituting` an LRP run: the gradient ``g`` of the embeddings becomes the
        relevance ``x * g`` there (as the root's :py:class:`~zennit_attn.rules.RelevanceBoundary` does for the
        model's inputs: ids here) and the other tables' lookups become leaves (:py:meth:`recorded`)."""
        self._leaves, self._recording = [], True

    def recorded(self) -> list[torch.Tensor]:
        """The leaves made since :py:meth:`record` (each ``[batch, seq, ...]``; their gradient is their relevance)."""
        leaves, self._leaves = self._leaves, []
        return leaves

    @contextlib.contextmanager
    def substituting(self, ids: torch.Tensor, embeddings: torch.Tensor, fixed: bool = True) -> Iterator[None]:
        """Within the context, the word embedding of ``ids`` is ``embeddings``; after :py:meth:`record`, the
        embeddings and every other table's lookup of the ids (a new leaf) pass ``x * g`` as their gradient (their
        relevance, read with LRP). Otherwise the other tables' lookups are kept as the model computes them, if
        ``fixed`` allows it. A table's lookup is one of the ids as :py:func:`id_tables` tells it
        (:py:func:`_looks_up`); other lookups of the tables (positions) are left alone. A word lookup of more ids that
        end with the explained ones (tokens the model puts ahead of them) keeps the model's rows for the others
        (:py:attr:`own`).

        Raises
        ------
        RuntimeError
            If the word embedding module embeds ids of another shape than ``ids`` that do not end with them: their
            tokens are unknown.
        ValueError
            If a table looks the ids up while not recording and ``fixed`` is False (a method that perturbs or
            differentiates the word embeddings would keep that table fixed).
        """
        leaves = self._leaves if self._recording else None
        self.own = []
        if self._recording:
            embeddings = input_relevance(embeddings)
        self._recording = False
        handles = [self.word.register_forward_hook(self._word_hook(ids, embeddings, leaves))]
        handles += [
            module.register_forward_hook(self._table_hook(name, ids, leaves, fixed)) for name, module in self.tables
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _word_hook(self, ids: torch.Tensor, embeddings: torch.Tensor, leaves: list | None):
        """The forward hook of the word embedding module in :py:meth:`substituting`: ``embeddings`` for the lookup of
        ``ids``; for a lookup of more ids that end with them, the model's own rows of the others (:py:attr:`own`)
        ahead of ``embeddings``."""

        def word(module, args, output):
            index = args[0] if args else None
            if isinstance(index, torch.Tensor) and index.shape == ids.shape:
                return embeddings
            count = ids.shape[-1]
            if (
                isinstance(index, torch.Tensor)
                and index.shape[:-1] == ids.shape[:-1]
                and index.shape[-1] > count
                and bool((index[..., -count:] == ids.to(index.device)).all())
            ):
                return self._own_ahead(output, index.shape[-1] - count, embeddings, leaves)
            shape = tuple(index.shape) if isinstance(index, torch.Tensor) else type(index).__name__
            raise RuntimeError(
                f'{type(self.model).__name__} embeds ids of shape {shape}, not the explained tokens '
                f'{tuple(ids.shape)}: zennit-attn cannot tell which token each row belongs to; '
                'report the model'
            )

        return word

    def _own_ahead(
        self, output: torch.Tensor, own_count: int, embeddings: torch.Tensor, leaves: list | None
    ) -> torch.Tensor:
        """The word lookup of tokens of the model's own ahead of the ids (CPM-Ant's prompt): their rows are
        constants, absorbing relevance like a bias (a leaf of :py:attr:`own` in an LRP run); the ids' rows are the
        explained input."""
        own = output.narrow(-2, 0, own_count).detach()
        if leaves is not None:
            self.own = [own.requires_grad_(True)]
            own = input_relevance(own)
        return torch.cat([own, embeddings.to(own.dtype)], dim=-2)

    def _table_hook(self, name: str, ids: torch.Tensor, leaves: list | None, fixed: bool):
        """The forward hook of another token table in :py:meth:`substituting`: its lookup of ``ids`` becomes a new
        leaf of ``leaves`` (an LRP run), stays as the model computes it (``fixed``), or is refused."""

        def hook(module, args, output):
            if not torch.is_grad_enabled() or not _looks_up(args, output, ids):
                return None  # not the tokens (positions), or without gradients (carrying no relevance)
            if leaves is not None:
                leaves.append(output.detach().requires_grad_(True))
                return input_relevance(leaves[-1])
            if not fixed:
                raise ValueError(
                    f'{type(self.model).__name__} looks its token ids up in {name!r} besides the word embeddings: '
                    'only the LRP methods (attnlrp, cplrp) read relevance there; other methods would perturb or '
                    'differentiate the word embeddings only and keep that table fixed'
                )
            return None

        return hook

    @staticmethod
    def token_relevance(relevances: list[torch.Tensor]) -> torch.Tensor | None:
        """``[batch, seq]`` the relevance of the other tables' lookups (``[batch, seq, ...]`` each) per token, None
        for none."""
        sums = [relevance.reshape(*relevance.shape[:2], -1).sum(-1) for relevance in relevances]
        return sum(sums[1:], sums[0]) if sums else None
