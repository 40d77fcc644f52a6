"""Position encodings as inputs that take relevance: PA-LRP (Bakish, Zimerman, Chefer and Wolf 2025, "Revisiting LRP:
Positional Attribution as the Missing Ingredient for Transformer Explainability", arXiv 2506.02138).

AttnLRP gives a model's position encodings no relevance: they are constants of the forward pass (computed from the
positions, not from the explained input), and the relevance that enters them is absorbed, like a bias's. PA-LRP takes
the input as position-token pairs: the outputs of the position encodings become inputs of the explanation, next to the
word embeddings, and the relevance that reaches them is the positions' (per position, summed over the encoding's
features). The rules on the way are the ones the engine applies already:

- a rotary embedding (RoPE: ``q cos + rotate_half(q) sin``, likewise for the keys) is a product of the token path
  with the position-dependent factors ``cos`` and ``sin``; with both carrying relevance the composite's product rule
  shares it (AttnLRP's uniform rule: half to each factor, Prop. 3.2; CP-LRP's rule gives the queries and keys, and so
  the rotations, no relevance at all);
- a learned or sinusoidal absolute position embedding is added to the word embeddings: the sum's relevance is shared
  in proportion to the addends (Eq. 8 with epsilon -> 0), so that the word embeddings keep the relevance they have
  without PA-LRP and the positions get what a bias would absorb;
- a vision transformer's learned table held as a parameter (timm's ``pos_embed``, Hugging Face ViT's
  ``position_embeddings``) is added to the patch embeddings (and the class token) alike: the patches keep their
  relevance, the table gets what the constant absorbed. The parameter is the model's; for the time of the forward
  pass of its module it is replaced on that module by an explained input with its values (a batch of one image: the
  model's code may read the table as one row), and restored after it (also where the forward pass raises).

The position encodings are found by declaration (:py:data:`POSITION_ENCODINGS`: modules of Hugging Face's naming
conventions); :py:class:`PositionInputs` makes their floating-point outputs explained inputs (as the
:py:class:`~zennit_attn.rules.RelevanceBoundary` does with the model's inputs,
:py:func:`~zennit_attn.rules.boundary.input_relevance`) for the time of a composite's registration, and keeps the
leaves of the last forward pass, at which the relevance is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from zennit.core import RemovableHandleList

from ..core.modules import within
from .boundary import input_relevance

__all__ = ['PositionEncoding', 'POSITION_ENCODINGS', 'PositionInputs', 'HeldTable', 'held_table', 'position_encodings']


@dataclass(frozen=True)
class PositionEncoding:
    """A kind of position encoding: how its modules are recognised (``matches(name, module)``, the module's path in the
    model and the module) and what it is."""

    kind: str
    matches: Callable[[str, torch.nn.Module], bool]
    description: str


#: Attribute names of learned (or fixed sinusoidal) absolute position tables held as embedding modules.
_TABLE_NAMES = frozenset({'wpe', 'position_embeddings', 'position_embedding', 'embed_positions'})
#: Names of position tables held as parameters (ViT's ``pos_embed``, Hugging Face ViT's ``position_embeddings``,
#: BLIP's and TIPSv2's vision towers' ``position_embedding``): explained inputs of a model whose only position
#: encodings they are (a vision transformer); a model that holds one beside the encodings of another kind (a
#: vision-language model's vision tower beside its text's) is refused, as its two sequences are.
_PARAMETER_TABLE_NAMES = frozenset(
    {'pos_embed', 'pos_embedding', 'position_embedding', 'position_embeddings', 'positional_embedding'}
)


def _rotary(name: str, module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith('RotaryEmbedding')


def _learned(name: str, module: torch.nn.Module) -> bool:
    cls = type(module).__name__
    if 'Sinusoidal' in cls:
        return False
    return cls.endswith('LearnedPositionalEmbedding') or (
        isinstance(module, torch.nn.Embedding) and name.rsplit('.', 1)[-1] in _TABLE_NAMES
    )


def _sinusoidal(name: str, module: torch.nn.Module) -> bool:
    return 'SinusoidalPositionalEmbedding' in type(module).__name__


def held_table(module: torch.nn.Module) -> str | None:
    """The name of the position table ``module`` holds as a parameter of its own (:py:data:`_PARAMETER_TABLE_NAMES`),
    None where it holds none."""
    return next(
        (name for name, value in module._parameters.items() if name in _PARAMETER_TABLE_NAMES and value is not None),
        None,
    )


def _held(name: str, module: torch.nn.Module) -> bool:
    return held_table(module) is not None


#: The position encodings PA-LRP gives relevance, by kind: the modules whose outputs become explained inputs.
POSITION_ENCODINGS: dict[str, PositionEncoding] = {
    encoding.kind: encoding
    for encoding in (
        PositionEncoding(
            'rotary', _rotary, 'rotary embeddings (modules named *RotaryEmbedding returning cos and sin: Llama, ...)'
        ),
        PositionEncoding(
            'learned',
            _learned,
            'learned absolute position tables (embedding modules named wpe, position_embeddings, '
            'position_embedding or embed_positions, *LearnedPositionalEmbedding: GPT-2, BERT, OPT, CLIP, ...)',
        ),
        PositionEncoding(
            'sinusoidal', _sinusoidal, 'fixed sinusoidal tables (modules named *SinusoidalPositionalEmbedding: Marian)'
        ),
        PositionEncoding(
            'held',
            _held,
            'learned position tables held as parameters (pos_embed, position_embeddings, ...: timm ViT and DeiT, '
            'Hugging Face ViT, DeiT, DINOv2, ...)',
        ),
    )
}


def position_encodings(modules) -> list[tuple[str, torch.nn.Module, str]]:
    """``(name, module, kind)`` of every position encoding among ``modules`` (``model.named_modules()``), by
    :py:data:`POSITION_ENCODINGS`; a module inside a matched one is not matched again."""
    found = []
    for name, module in modules:
        if any(within(name, outer) for outer, _, _ in found if outer):
            continue
        kind = next((kind for kind, encoding in POSITION_ENCODINGS.items() if encoding.matches(name, module)), None)
        if kind is not None:
            found.append((name, module, kind))
    return found


class HeldTable:
    """A position table held as a parameter by ``module`` (:py:func:`held_table`), read as an explained input of
    ``inputs`` (:py:class:`PositionInputs`) while the module runs: :py:meth:`replace` (its forward pre-hook) puts a
    leaf with the parameter's values in the parameter's place on the module, :py:meth:`restore` (its forward hook, also
    called where the forward raises) and :py:meth:`remove` (a handle of the registration) put the parameter back, the
    same object."""

    def __init__(self, module: torch.nn.Module, name: str, inputs: PositionInputs):
        self.module, self.inputs = module, inputs
        self.attribute = held_table(module)
        self.parameter = module._parameters[self.attribute]
        self.path = f'{name}.{self.attribute}'.lstrip('.')

    def replace(self, module, args) -> None:
        if not torch.is_grad_enabled():
            return
        if self.parameter.dim() != 3 or self.parameter.shape[0] != 1:
            raise ValueError(
                f'the position table {self.path} has shape {list(self.parameter.shape)}: PA-LRP reads tables of one '
                '[1, positions, features] row (a table over a feature map, [1, channels, height, width], is not one '
                'position per token); explain without positions=True'
            )
        batch = self.inputs.batch or 1
        if batch > 1:
            raise ValueError(
                f'the position table {self.path} is a parameter of the model, which its code may read as one row: '
                f'PA-LRP reads its relevance for one input at a time, got a batch of {batch}; explain one image at a '
                'time'
            )
        self.module._parameters[self.attribute] = self.inputs.explained(self.path, 'held', self.parameter)

    def restore(self, *_) -> None:
        self.module._parameters[self.attribute] = self.parameter

    def remove(self) -> None:
        self.restore()


class PositionInputs:
    """The position encodings of a model as explained inputs (PA-LRP, see the module's description), for the time of
    a composite's registration.

    :py:meth:`register` hooks the encodings (refusing a model that has none), and the root module to learn the batch
    size of each forward pass; each forward pass then replaces every floating-point output of an encoding by a leaf
    (its values, repeated over the batch where the encoding computes them once for all rows) passed through the input
    side of the relevance boundary, and keeps the leaves (:py:attr:`recorded`). After the backward pass their gradient
    is their relevance (``x * g``); :py:meth:`per_position` sums it per row and position.
    """

    def __init__(self):
        #: ``(module name, kind, leaf)`` of the position inputs of the last forward pass
        self.recorded: list[tuple[str, str, torch.Tensor]] = []
        #: the paths of the position encodings hooked by :py:meth:`register`
        self.names: list[str] = []
        #: the number of rows of the last forward pass (None before one, or for an input without a batch dimension)
        self.batch: int | None = None

    def register(self, model: torch.nn.Module, modules) -> RemovableHandleList:
        """Hook the position encodings among ``modules`` (the walk of ``model``) and ``model`` itself.

        Raises
        ------
        ValueError
            If the model has no position encoding of :py:data:`POSITION_ENCODINGS`, or holds a position table as a
            parameter beside encodings of another kind.
        """
        found = position_encodings(modules)
        if not found:
            kinds = '; '.join(encoding.description for encoding in POSITION_ENCODINGS.values())
            raise ValueError(
                f'{type(model).__name__} has no position encoding that PA-LRP gives relevance ({kinds}): attention '
                'biases (ALiBi, T5, relative position tables) and encodings computed inline are not inputs of the '
                'explanation; explain without positions=True'
            )
        held = [name for name, _, kind in found if kind == 'held']
        other = [name for name, _, kind in found if kind != 'held']
        if held and other:
            table = f'{held[0]}.{held_table(dict(modules)[held[0]])}'.lstrip('.')
            raise ValueError(
                f'{type(model).__name__} holds a position table as a parameter ({table!r}) beside position '
                f'encodings of another kind ({other[0]!r}, ...): two sequences with positions of their own (a '
                "vision tower's and a text's), whose relevance PA-LRP cannot read as one; explain without "
                'positions=True'
            )
        unread = [
            name
            for name, module in modules
            if 'rotary' in type(module).__name__.lower()
            and not any(within(name, outer) for outer, _, _ in found if outer)
        ]
        if unread:
            kind, reads = type(dict(modules)[unread[0]]).__name__, found[0][0] or type(model).__name__
            raise ValueError(
                f'{type(model).__name__} has a rotary embedding PA-LRP does not read ({unread[0]!r}, {kind}: not a '
                "module named *RotaryEmbedding returning cos and sin, as timm's, which the attention reads by a "
                f"method) beside the encodings it reads ({reads!r}): the rotations' share of the relevance would be "
                "missing from the positions' without a word; explain without positions=True"
            )
        self.names = [name for name, _, _ in found]
        handles = [model.register_forward_pre_hook(self._batch_size, with_kwargs=True, prepend=True)]
        for name, module, kind in found:
            if kind == 'held':
                handles += self._hold(name, module)
            else:
                handles.append(module.register_forward_hook(self._hook(name, kind)))
        return RemovableHandleList(handles)

    def _hold(self, name: str, module: torch.nn.Module) -> list:
        """Hooks of ``module`` that replace the table it holds (:py:func:`held_table`) by an explained input with its
        values for the time of each of its forward passes (:py:class:`HeldTable`), and the table's own handle."""
        table = HeldTable(module, name, self)
        return [
            module.register_forward_pre_hook(table.replace),
            module.register_forward_hook(table.restore, always_call=True),
            table,
        ]

    def _batch_size(self, module, args, kwargs) -> None:
        """The number of rows of the forward pass: the first dimension of the model's first tensor argument."""
        self.recorded = []
        first = next((value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)), None)
        self.batch = None if first is None or first.dim() == 0 else first.shape[0]

    def _hook(self, name: str, kind: str):
        def hook(module, args, output):
            if not torch.is_grad_enabled():
                return None
            if isinstance(output, torch.Tensor):
                return self.explained(name, kind, output)
            if isinstance(output, tuple):
                return type(output)(self.explained(name, kind, item) for item in output)
            raise TypeError(
                f'the position encoding {name} ({type(module).__name__}) returned {type(output).__name__}: PA-LRP '
                'takes a tensor or a tuple of tensors'
            )

        return hook

    def explained(self, name: str, kind: str, output):
        """``output`` as an explained input (a leaf, kept), or as it is where it is not a floating-point tensor.

        Raises
        ------
        ValueError
            For a complex tensor (rotations as ``freqs_cis``): it would pass as a constant, its share lost.
        """
        if isinstance(output, torch.Tensor) and output.is_complex():
            raise ValueError(
                f'the position encoding {name} returns its rotations as complex numbers (freqs_cis: DeepSeek-V2, '
                'Llama 4): PA-LRP takes rotary embeddings as real cos and sin tensors, so their share of the '
                'relevance would be lost without a word; explain without positions=True'
            )
        if not (isinstance(output, torch.Tensor) and output.is_floating_point()):
            return output
        values = output.detach()
        if values.dim() >= 3 and values.shape[0] == 1 and (self.batch or 1) > 1:
            values = values.expand(self.batch, *values.shape[1:])  # one row of positions per row of the batch
        elif values.dim() < 3 and (self.batch or 1) > 1:
            raise ValueError(
                f'the position encoding {name} returns one {list(values.shape)} tensor for all rows of the batch: '
                'PA-LRP cannot tell the rows apart; explain one row at a time'
            )
        leaf = values.requires_grad_(True)  # detached: a leaf of its own (the boundary's input side copies it)
        self.recorded.append((name, kind, leaf))
        return input_relevance(leaf)

    def leaves(self) -> list[torch.Tensor]:
        """The position inputs of the last forward pass (their leaves, in the order of :py:attr:`recorded`).

        Raises
        ------
        ValueError
            If no position encoding ran in it (a model whose hooked encoding is not called, e.g. a hybrid without
            attention layers): no relevance of the positions to read.
        """
        if not self.recorded:
            raise ValueError(
                f'no position encoding of the model ran in the forward pass ({", ".join(self.names)} found, not '
                'called: e.g. a hybrid whose layers are all convolutions or recurrences, or a vision tower that '
                "interpolates its table's weight to another image size, interpolate_pos_encoding, as CLIP's and "
                "SigLIP's): there is no relevance of positions to read; explain without positions=True (or an image "
                'of the size the table was made for)'
            )
        return [leaf for _, _, leaf in self.recorded]

    def kinds(self) -> frozenset[str]:
        """The kinds (of :py:data:`POSITION_ENCODINGS`) of the position inputs of the last forward pass."""
        return frozenset(kind for _, kind, _ in self.recorded)

    def per_position(
        self, relevances: list[torch.Tensor], sequence_of: Callable[[str], str] | None = None
    ) -> dict[str, torch.Tensor]:
        """``{sequence: [batch, positions]}`` relevance of the positions of each sequence: the relevance of each leaf
        (``relevances``, in the order of :py:attr:`recorded`) summed over its features, over the encodings of the
        sequence and (for encodings run once per layer) over the layers. ``sequence_of`` names the sequence of the
        encoding at a module path (an encoder-decoder model's ``'encoder'`` and ``'decoder'``); without it all are of
        one sequence, ``'input'``.

        Raises
        ------
        ValueError
            If the encodings of one sequence disagree on its number of positions (a vision-language model whose
            vision tower has positions of its own beside the text's).
        """
        totals, firsts = {}, {}
        for (name, _, leaf), relevance in zip(self.recorded, relevances):
            sequence = 'input' if sequence_of is None else sequence_of(name)
            summed = (relevance.unsqueeze(0) if leaf.dim() < 3 else relevance).flatten(2).sum(-1)
            total = totals.get(sequence)
            if total is not None and summed.shape != total.shape:
                raise ValueError(
                    f'the position encodings of the model run over sequences of {total.shape[1]} '
                    f'({firsts[sequence]}) and {summed.shape[1]} positions ({name}): PA-LRP reads one relevance per '
                    "position of the input's sequence (vision-language models, whose vision tower has positions of "
                    'its own, have two); explain without positions=True'
                )
            totals[sequence] = summed if total is None else total + summed
            firsts.setdefault(sequence, name)
        if not totals:
            raise RuntimeError('no position encoding ran in the forward pass: nothing to read')
        return totals
