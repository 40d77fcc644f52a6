"""The checks every explanation request passes before a method runs: the model (a module in eval mode, not compiled,
its weights loaded, no foreign rule hooks), the input (token ids within the vocabulary and the model's positions,
masks, integer arguments) and what a tokenizer returns.

Each check raises with a message that names what is wrong and what to do; none changes its arguments.
:py:class:`~zennit_attn.inputs.task.Task` runs them (:py:func:`check_model` also
:py:func:`~zennit_attn.explain_generation`). What takes a forward pass or an inspection of every module to find out
about a model (whether it is causal, its quantized layers, its other token tables) is found once per model instance
and kept while the model stays the same (:py:class:`ModelFacts`).
"""

from __future__ import annotations

import itertools
import numbers
import weakref
from collections.abc import Callable, Hashable, Mapping

import torch
from transformers import PreTrainedConfig

from ..composites import AttnLRPComposite, refuse_compiled, rule_hooks
from ..core.devices import input_device
from ..core.errors import UnsupportedModelError
from ..core.modules import (
    Modules,
    decoder_word_embeddings,
    forward_parameters,
    is_encoder_decoder,
    output_scores,
    within,
    without_cache,
    word_embeddings,
)
from ..core.quantization import check_quantized, cpu_packing_held, four_bit_layers, unpack_for_gradients
from .choices import takes_choices

__all__ = [
    'ModelFacts',
    'model_facts',
    'is_causal',
    'sees_later_tokens',
    'run_probe',
    'reads_ids',
    'model_pad_token',
    'check_pad_ids',
    'row_ends',
    'check_embeddings_run',
    'embedding_probe',
    'keeps_left_padding',
    'check_left_padding',
    'keeps_right_padding',
    'check_right_padding',
    'is_image_model',
    'image_channels',
    'takes_video',
    'check_input_kind',
    'check_model',
    'bitsandbytes_layers',
    'unpack_quantized',
    'offloaded_modules',
    'rule_hooks',
    'as_integer',
    'default_position',
    'as_integers',
    'target_pairs',
    'token_id',
    'token_ids',
    'explained_positions',
    'target_indices',
    'check_ids',
    'check_vocabulary',
    'check_length',
    'split_encoding',
]


# --------------------------------------------------------------------------------------------------- model facts
class ModelFacts:
    """What the checks find out about one model instance by walking its modules or running it, kept between calls
    while the model stays the same (:py:func:`model_facts` returns them).

    A fact is found on its first use (:py:meth:`known`) and kept while the model's :py:attr:`key` is unchanged. The
    key holds what a user can change in a model between two calls:

    - the module tree: each module's name and a weak reference to it (a module added, removed, replaced or moved
      changes the key), and whether a ``forward`` or an ``accelerate`` hook (``_hf_hook``) is set on the instance;
    - each parameter and buffer: a weak reference to it, its class, dtype and device (a weight replaced, cast, moved,
      quantized in place or offloaded to the ``meta`` device changes the key);
    - the configuration: a copy of the attributes of ``model.config`` and of the configurations inside it
      (``text_config``, ...), the attention and experts implementations among them (a copy of the attributes, not of
      their values: a list or dict of the configuration changed in place is not seen).

    What changes without a change of the key is checked in every call instead (:py:func:`check_model`): the
    training mode of each module, compilation, zennit rules registered on the model, inference mode. Facts hold no
    module (the names of modules instead), and the cache holds the model by a weak reference: it keeps nothing alive.
    """

    def __init__(self, key: tuple):
        #: what the facts hold for (see the class's description)
        self.key = key
        self._known: dict[Hashable, object] = {}

    def known(self, name: Hashable, find: Callable[[], object]):
        """The fact ``name``: ``find()`` on its first use, afterwards what it returned. A ``find`` that raises keeps
        nothing: a refusal is repeated in every call."""
        if name not in self._known:
            self._known[name] = find()
        return self._known[name]


#: the facts of each model instance (weak keys: an entry goes with its model)
_FACTS: weakref.WeakKeyDictionary[torch.nn.Module, ModelFacts] = weakref.WeakKeyDictionary()


def model_facts(model: torch.nn.Module, modules: Modules | None = None) -> ModelFacts:
    """The :py:class:`ModelFacts` of ``model``: those of the earlier calls while its key is unchanged, else new ones.

    Costs one walk over the modules, parameters and buffers (``modules``: ``list(model.named_modules())`` if the
    caller has it), about 0.1 ms for a model of 100 modules, where the facts cost a forward pass each or a walk with
    an inspection of every module."""
    modules = list(model.named_modules()) if modules is None else modules
    key = _model_key(model, modules)
    facts = _FACTS.get(model)
    if facts is None or facts.key != key:
        facts = _FACTS[model] = ModelFacts(key)
    return facts


def _model_key(model: torch.nn.Module, modules: Modules) -> tuple:
    """The key of :py:class:`ModelFacts`: the module tree, the parameters and buffers, the configuration.

    An object is in the key as its ``id`` followed by a weak reference to it: keys compare equal where the same
    objects are alive in both. Two ids differ for two live objects, and where an id is reused by a new object, the
    reference to the old one is dead and equals no other reference (the referents themselves are never compared: two
    tensors compare element by element)."""
    tree = tuple(
        (name, id(module), weakref.ref(module), 'forward' in module.__dict__, '_hf_hook' in module.__dict__)
        for name, module in modules
    )
    tensors = tuple(
        (id(tensor), weakref.ref(tensor), type(tensor), tensor.dtype, tensor.device)
        for _, module in modules
        for tensor in itertools.chain(module._parameters.values(), module._buffers.values())
        if tensor is not None
    )
    return tree, tensors, _configuration(getattr(model, 'config', None))


def _configuration(config) -> dict | None:
    """The attributes of a Hugging Face configuration, with those of the configurations inside it (None for none)."""
    if not isinstance(config, PreTrainedConfig):
        return None
    return {
        name: _configuration(value) if isinstance(value, PreTrainedConfig) else value
        for name, value in vars(config).items()
    }


# --------------------------------------------------------------------------------------------------- the model
def is_causal(model: torch.nn.Module, facts: ModelFacts | None = None) -> bool:
    """Whether ``model`` has causal (decoder) self-attention: each position sees only the positions before it.

    A module whose ``is_causal`` attribute is True says so (transformers' attention modules). Models that mask in
    their own code without that attribute (OpenAI-GPT, XGLM, GIT, Doge, GPT-NeoX-Japanese, LFM3) are asked directly
    (:py:func:`sees_later_tokens`): causal if another last token leaves every earlier position's output as it was.
    A model that cannot be asked (an encoder-decoder, no token table, no output per position, a failing forward)
    counts as not causal.

    The answer is a fact of the model (:py:class:`ModelFacts`): found once per model and kept while the model stays
    the same; ``facts``: the model's facts if the caller has them (:py:func:`check_model` returns them).
    """
    facts = model_facts(model) if facts is None else facts
    return facts.known('causal', lambda: _is_causal(model, facts))


def reads_ids(model: torch.nn.Module, facts: ModelFacts | None = None) -> str | None:
    """Why ``model`` computes another output from its token ids than from their embeddings, None where it computes
    the same, by experiment (:py:func:`embedding_probe`). Transformers' sequence classifiers of decoders take the score
    of the last token that is not padding, which they find in the ids, and of the last position on embeddings: another
    logit wherever an input ends in the pad token (a right-padded row, or any text ending in GPT-2's end-of-text token
    where that is the pad token)."""
    kind, reason = embedding_probe(model, facts)
    return reason if kind == 'differs' else None


def model_pad_token(model: torch.nn.Module) -> int | None:
    """The pad token id of ``model``'s configuration (None where it has none)."""
    pad = getattr(getattr(model, 'config', None), 'pad_token_id', None)
    return pad if isinstance(pad, int) and not isinstance(pad, bool) else None


def check_pad_ids(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, facts: ModelFacts | None = None
) -> None:
    """Refuse right padding with another id than the model's pad token for a causal model that finds its padding in
    the ids (:py:func:`reads_ids`: a decoder's sequence classifier scores the last token that is not its pad token): it
    would score a pad, whose relevance is left out (a Llama classifier right-padded with its end-of-sequence token
    explained 0.013 where the row alone gives 0.136). Left padding ends in the row's last token whatever its ids; an
    encoder that counts its positions from the padding (RoBERTa) is refused left padding elsewhere and keeps the
    positions of a row's tokens under right padding.

    Raises
    ------
    ValueError
        Naming the model's pad token and the ids the padding holds.
    """
    pad = model_pad_token(model)
    if pad is None or not is_causal(model, facts) or reads_ids(model, facts) is None:
        return
    order = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    padded = order >= row_ends(attention_mask)[:, None]  # the padding after each row's tokens
    held = sorted(set(input_ids[padded.to(input_ids.device)].tolist()) - {pad})
    if held:
        raise ValueError(
            f'{type(model).__name__} finds its padding in the ids by its pad token (id {pad}), but the padding of the '
            f'input holds id(s) {held[:3]}: it would score a pad instead of the last token; pad with id {pad} '
            f'(tokenizer.pad_token_id = {pad}) or explain the rows one at a time'
        )


def check_embeddings_run(model: torch.nn.Module, facts: ModelFacts | None = None) -> None:
    """Refuse a model whose forward takes ``inputs_embeds`` but fails on them where it runs on its ids (a head that
    builds a mask from the ids: Longformer's global attention; a base model that takes no ``inputs_embeds`` behind a
    head that does: ESM C; patches found from the bytes: BLT), by experiment (:py:func:`embedding_probe`). Its
    computation from the ids besides their embeddings (hashed n-grams, masks) would take no relevance on the ids. Also
    refused: an encoder-decoder model whose output on embeddings differs from its output on its ids (FSMT, whose
    decoder is causal only where it gets ids), which zennit-attn runs on embeddings.

    Raises
    ------
    UnsupportedModelError
        Naming the model and the error of its forward on embeddings, or how its outputs differ.
    """
    kind, reason = embedding_probe(model, facts)
    if kind == 'fails':
        raise UnsupportedModelError(
            f'{type(model).__name__} fails when run on the embeddings of its tokens ({reason}), where zennit-attn '
            'reads their relevance: it computes from the ids themselves, which no relevance reaches, so it is not '
            'explained'
        )
    if kind == 'differs' and is_encoder_decoder(model):
        raise UnsupportedModelError(
            f'{type(model).__name__}: {reason}. zennit-attn runs encoder-decoder models on the embeddings of their '
            'tokens, where it reads their relevance, so it would explain another output than the model gives'
        )


def embedding_probe(model: torch.nn.Module, facts: ModelFacts | None = None) -> tuple[str | None, str | None]:
    """``(kind, why)``: the model (without gradients) on three ordinary tokens followed by its pad token (if it has
    one), once given as ``input_ids`` and once as ``inputs_embeds`` (their word embeddings): ``('differs', why)`` where
    the outputs differ, ``('fails', the error)`` where the run on embeddings fails and the one on ids does not,
    ``(None, None)`` where they agree or it cannot be told (a model without a token table, a forward without
    ``inputs_embeds`` or that fails on the ids). An encoder-decoder model gets three tokens for each side, its decoder
    ids embedded by its decoder's table. Cost: two forward passes of four tokens, once per
    model (a fact of the model: :py:class:`ModelFacts`; ``facts`` as for :py:func:`is_causal`)."""
    facts = model_facts(model) if facts is None else facts
    return facts.known('embedding probe', lambda: _embedding_probe(model))


def _embedding_probe(model: torch.nn.Module) -> tuple[str | None, str | None]:
    if is_encoder_decoder(model):
        return _encoder_decoder_probe(model)
    ids = _probe_ids(model)
    if ids is None or 'inputs_embeds' not in forward_parameters(model):
        return None, None
    pad = _pad_token(model)
    if pad is not None:
        ids = torch.cat([ids, torch.full_like(ids[:, :1], pad)], -1)
    try:
        on_ids = run_probe(model, input_ids=ids)
    except Exception:  # not decided here: a model that needs more than its ids
        return None, None
    try:
        with torch.no_grad():
            embeddings = word_embeddings(model)(ids)
        on_embeddings = run_probe(model, inputs_embeds=embeddings)
    except Exception as error:
        return 'fails', f'{type(error).__name__}: {str(error)[:160]}'
    if not (isinstance(on_ids, torch.Tensor) and isinstance(on_embeddings, torch.Tensor)):
        return None, None
    if _same_outputs(on_ids, on_embeddings):
        return None, None
    if pad is None:
        return 'differs', 'its output on the ids differs from its output on their embeddings'
    return 'differs', (
        f'its output on the ids differs from its output on their embeddings where its pad token ({pad}) ends the input '
        '(a head that scores the last token that is not padding, or positions counted from the padding)'
    )


def _encoder_decoder_probe(model: torch.nn.Module) -> tuple[str | None, str | None]:
    """:py:func:`embedding_probe` of an encoder-decoder model: three ordinary encoder tokens, and two rows of three
    decoder tokens that differ in the last, on their embeddings (the decoder's outputs before the last token must be
    the same: it is causal) and, where the model runs on them, as ``input_ids`` and ``decoder_input_ids`` (the same
    outputs)."""
    encoder, decoder = word_embeddings(model), decoder_word_embeddings(model)
    firsts = [_ordinary_token(encoder), _ordinary_token(decoder)]
    if None in firsts or not {'inputs_embeds', 'decoder_inputs_embeds'} <= set(forward_parameters(model)):
        return None, None
    device = input_device(model)
    ids = torch.tensor([[firsts[0], firsts[0] - 1, firsts[0] - 2]] * 2, device=device)
    first = firsts[1]
    decoder_ids = torch.tensor([[first, first - 1, first - 2], [first, first - 1, first - 3]], device=device)
    try:
        on_ids = run_probe(model, input_ids=ids, decoder_input_ids=decoder_ids)
    except Exception:  # a model that needs more than its ids, or fails on them (FSMT in float64): tried below
        on_ids = None
    try:
        with torch.no_grad():
            embedded = {'inputs_embeds': encoder(ids), 'decoder_inputs_embeds': decoder(decoder_ids)}
        on_embeddings = run_probe(model, **embedded)
    except Exception as error:
        return ('fails', f'{type(error).__name__}: {str(error)[:160]}') if on_ids is not None else (None, None)
    if not isinstance(on_embeddings, torch.Tensor) or on_embeddings.dim() < 2 or on_embeddings.shape[1] != 3:
        return None, None
    if not _same_outputs(on_embeddings[0, :2], on_embeddings[1, :2]):
        return 'differs', (
            'on the embeddings of its tokens its decoder reads the tokens after each position (it builds its causal '
            "mask from the ids alone, as FSMT's)"
        )
    if isinstance(on_ids, torch.Tensor) and not _same_outputs(on_ids, on_embeddings):
        return 'differs', 'its output on the ids differs from its output on their embeddings'
    return None, None


def _same_outputs(on_ids: torch.Tensor, on_embeddings: torch.Tensor) -> bool:
    """Whether a probe's two outputs agree to rounding."""
    if on_ids.shape != on_embeddings.shape:
        return False
    scale = max(float(on_ids.double().abs().max()), torch.finfo(torch.float64).tiny)
    difference = float((on_ids.double() - on_embeddings.double()).abs().max())
    return difference <= _ROUNDING * torch.finfo(on_ids.dtype).eps * scale


def _is_causal(model: torch.nn.Module, facts: ModelFacts) -> bool:
    if any(getattr(module, 'is_causal', False) is True for module in model.modules()):
        return True
    return sees_later_tokens(model, facts) is False


def sees_later_tokens(model: torch.nn.Module, facts: ModelFacts | None = None) -> bool | None:
    """Whether a position's output depends on the tokens after it, by experiment: the model (without gradients) on
    three tokens and on the same tokens with another last one; True if the outputs at the first two positions differ
    (the last hidden state of a Hugging Face model's ``base_model``, else the model's output scores), False if they
    are the same. Cost: one forward pass of two rows of three tokens, once per model (a fact of the model:
    :py:class:`ModelFacts`; ``facts`` as for :py:func:`is_causal`).

    None where it cannot be told: an encoder-decoder (whose decoder needs inputs of its own), a model without a token
    table (``get_input_embeddings()`` with ``num_embeddings``) or without an output per position, or a forward that
    fails on token ids alone.
    """
    facts = model_facts(model) if facts is None else facts
    return facts.known('sees later tokens', lambda: _sees_later_tokens(model))


def _probe_ids(model: torch.nn.Module) -> torch.Tensor | None:
    """The two rows of three tokens :py:func:`sees_later_tokens` runs the model on, None for a model that cannot be
    asked (an encoder-decoder, no token table: :py:func:`~zennit_attn.core.modules.word_embeddings`, which finds the
    table of a model of one's own around a Hugging Face model too)."""
    if is_encoder_decoder(model):
        return None
    # None for transformers' composite models without one table (CLIP: a text and an image tower)
    first = _ordinary_token(word_embeddings(model))
    if first is None:
        return None
    return torch.tensor([[first, first - 1, first - 2], [first, first - 1, first - 3]], device=input_device(model))


def _ordinary_token(table) -> int | None:
    """An id of ``table`` (an embedding module) past the special tokens at the start of most vocabularies, whose
    three predecessors are ordinary too; None for a table without ``num_embeddings`` or of fewer than 8 rows."""
    rows = getattr(table, 'num_embeddings', None)
    if not isinstance(rows, int) or rows < 8:
        return None
    return rows // 4 + 4


def _probe_base(model: torch.nn.Module) -> torch.nn.Module:
    """The module the probes run: a Hugging Face model's ``base_model`` (without its head: an output per position),
    else the model."""
    base = getattr(model, 'base_model', None)
    return base if isinstance(base, torch.nn.Module) else model


def run_probe(model: torch.nn.Module, **inputs):
    """The output scores (:py:func:`~zennit_attn.core.modules.output_scores`) of ``model`` called on ``inputs``
    (keyword arguments) as the checks' probes call it: without gradients, without a cache where it takes
    ``use_cache``, with bitsandbytes' packing of 4-bit weights for CPU inference held off (a probe leaves the model as
    it was). A multiple-choice head (:py:func:`~zennit_attn.inputs.choices.takes_choices`) gets each row as its one
    choice (``[batch, 1, seq]``) and gives ``[batch, 1]`` scores. Raises what the call raises."""
    kwargs = without_cache(model)
    if takes_choices(model):
        inputs = {
            key: value.unsqueeze(1) if isinstance(value, torch.Tensor) and value.dim() >= 2 else value
            for key, value in inputs.items()
        }
    with torch.no_grad(), cpu_packing_held(four_bit_layers(model.modules())):
        return output_scores(model(**inputs, **kwargs))


def _probe_outputs(base: torch.nn.Module, runs: list[dict]) -> list[torch.Tensor] | None:
    """The output scores of ``base`` called (:py:func:`run_probe`) with each of ``runs`` (keyword arguments); None
    where a call fails (a model that needs more than token ids: images, a decoder input) or an output is not a tensor
    with an output per position."""
    try:
        outputs = [run_probe(base, **run) for run in runs]
    except Exception:  # not decided here
        return None
    if not all(isinstance(output, torch.Tensor) and output.dim() >= 3 for output in outputs):
        return None
    return outputs


def _sees_later_tokens(model: torch.nn.Module) -> bool | None:
    ids = _probe_ids(model)
    if ids is None:
        return None
    outputs = _probe_outputs(_probe_base(model), [{'input_ids': ids}])
    if outputs is None or outputs[0].shape[:2] != ids.shape:
        return None
    states = outputs[0]
    earlier = states[:, :2].double()
    change = float((earlier[0] - earlier[1]).abs().max())
    return change > 1e-6 * max(float(earlier.abs().max()), torch.finfo(torch.float64).tiny)


#: Pad tokens the probe of :py:func:`keeps_left_padding` puts before its row
_PROBE_PADS = 2
#: How many units of rounding two padded rows of :py:func:`keeps_left_padding` may differ by
_ROUNDING = 64


def keeps_left_padding(model: torch.nn.Module, facts: ModelFacts | None = None) -> bool | None:
    """Whether a left-padded row gives the model's outputs of the row alone, by experiment: the model (without
    gradients) on three tokens, and on the same tokens after two pads masked by the ``attention_mask`` (with the
    ``position_ids`` :py:class:`~zennit_attn.inputs.task.TokenTask` passes for left padding: 0 from the first token),
    once with each of two pad tokens. False if the two padded runs differ at the three tokens beyond rounding (the
    pads reach the row), or if they differ from the row alone beyond the square root of float32's precision
    (transformers' recurrences compute in float32 also for float64 models); True otherwise. The pads are ordinary
    tokens, not the table's ``padding_idx`` (whose embedding is often zero and would hide a model that mixes the pads'
    embeddings into the tokens after them).

    Softmax attention masks the pads' keys, and the scans of Mamba, Mamba-2 and the gated delta rules of transformers
    zero the padded inputs; a recurrence or a convolution that does not read the mask carries the pads into the row
    (transformers' RWKV, xLSTM and RecurrentGemma): its left-padded rows are other inputs than the rows alone. Cost:
    three forward passes of a few tokens, once per model (a fact of the model: :py:class:`ModelFacts`; ``facts`` as
    for :py:func:`is_causal`). None where it cannot be told (as for :py:func:`sees_later_tokens`).
    """
    facts = model_facts(model) if facts is None else facts
    return facts.known('keeps left padding', lambda: _keeps_left_padding(model))


def _keeps_left_padding(model: torch.nn.Module) -> bool | None:
    ids = _probe_ids(model)
    if ids is None:
        return None
    row = ids[:1]
    padding_idx = getattr(word_embeddings(model), 'padding_idx', None)
    pads = [pad for pad in range(int(row.max()) + 1, int(row.max()) + 4) if pad != padding_idx][:2]
    mask = torch.ones(1, _PROBE_PADS + row.shape[1], dtype=torch.long, device=row.device)
    mask[:, :_PROBE_PADS] = 0
    base = _probe_base(model)
    positions = (
        {'position_ids': (mask.cumsum(-1) - 1).clamp(min=0)} if 'position_ids' in forward_parameters(base) else {}
    )
    runs = [{'input_ids': row, 'attention_mask': torch.ones_like(row)}]
    for pad in pads:
        padded = torch.cat([torch.full_like(mask[:, :_PROBE_PADS], pad), row], -1)
        runs.append({'input_ids': padded, 'attention_mask': mask, **positions})
    outputs = _probe_outputs(base, runs)
    if outputs is None or outputs[1].shape[1] != mask.shape[1]:
        return None
    if not all(bool(torch.isfinite(output).all()) for output in outputs):
        return None  # not told: NaN of the model itself (float64 eager attention over a fully masked row)
    return _same_row(outputs[0].dtype, *(output[:, -row.shape[1] :].double() for output in outputs))


def _pad_token(model: torch.nn.Module) -> int | None:
    """The pad token id of the model's (text) configuration, None where it has none."""
    config = getattr(model, 'config', None)
    text_config = config.get_text_config() if callable(getattr(config, 'get_text_config', None)) else config
    pad = getattr(text_config, 'pad_token_id', None)
    return pad if isinstance(pad, int) else None


def _same_row(dtype: torch.dtype, alone: torch.Tensor, first: torch.Tensor, *second: torch.Tensor) -> bool:
    """Whether a padded row's outputs ``first`` (and ``second``, with another pad token) are the row's ``alone``: the
    pads reach the row where two pad tokens give two outputs beyond rounding (where the mask is read, they are the
    same to rounding); the row changes otherwise (shifted positions) beyond the square root of float32's precision
    (transformers' recurrences compute in float32 also in float64)."""
    eps = torch.finfo(dtype).eps
    scale = max(float(alone.abs().max()), torch.finfo(torch.float64).tiny)
    if second and float((first - second[0]).abs().max()) > _ROUNDING * eps * scale:
        return False
    tolerance = max(eps, torch.finfo(torch.float32).eps) ** 0.5
    return float((alone - first).abs().max()) <= tolerance * scale


def check_left_padding(model: torch.nn.Module, attention_mask: torch.Tensor, facts: ModelFacts | None = None) -> None:
    """Refuse a left-padded batch (a row whose ``attention_mask`` starts with 0) for a model whose left-padded rows
    are not the rows alone (:py:func:`keeps_left_padding`): its explanation of such a row would be that of another
    input, pads included.

    Raises
    ------
    ValueError
        Naming the model and what to do: explain the rows one at a time, or pad on the right.
    """
    if not bool((attention_mask[:, 0] == 0).any()) or keeps_left_padding(model, facts) is not False:
        return
    raise ValueError(
        f'attention_mask pads rows on the left, and {type(model).__name__} does not keep the pads out of the tokens '
        'after them (its sequence mixing does not read the attention mask: a left-padded row gives other outputs '
        "than the row alone, so its explanation would not be the row's own): explain the rows one at a time, or pad "
        "them on the right (tokenizer.padding_side = 'right')"
    )


def keeps_right_padding(model: torch.nn.Module, facts: ModelFacts | None = None) -> bool | None:
    """Whether a right-padded row gives the model's output of the row alone, by experiment, as the
    :py:func:`keeps_left_padding` of the right: the model (its head included, without gradients) on six tokens, and
    on the same tokens followed by two pads masked by the ``attention_mask`` (its pad token, as its tokenizer pads;
    without one, once with each of two ordinary tokens); its output at the six tokens (or, for a head that pools the
    sequence, its whole output) compared. Softmax attention masks the pads, and decoder classifiers score the last
    token that is not padding; a model that mixes or pools the padding (XLNet's summary of the last position,
    ConvBERT's convolutions) gives a right-padded row another output than the row alone. Funnel's pooling of the
    padding is found, as are Nystromformer's landmarks where they move the row beyond the square root of float32's
    precision (a mixing below it passes). Cost: two or three forward passes of a few tokens, once per model (a fact
    of the model). None where it cannot be told (as for :py:func:`sees_later_tokens`)."""
    facts = model_facts(model) if facts is None else facts
    return facts.known('keeps right padding', lambda: _keeps_right_padding(model))


def _keeps_right_padding(model: torch.nn.Module) -> bool | None:
    ids = _probe_ids(model)
    if ids is None:
        return None
    row = ids[:1].repeat(1, 2)  # six tokens: Funnel's pooling fails on three
    pad = _pad_token(model)
    # the model's pad token, as its tokenizer pads (decoder classifiers find the last token that is not one);
    # without one, two ordinary tokens
    pads = [pad] if pad is not None else list(range(int(row.max()) + 1, int(row.max()) + 3))
    mask = torch.ones(1, row.shape[1] + _PROBE_PADS, dtype=torch.long, device=row.device)
    mask[:, row.shape[1] :] = 0
    runs = [{'input_ids': row, 'attention_mask': torch.ones_like(row)}]
    runs += [
        {'input_ids': torch.cat([row, torch.full_like(mask[:, :_PROBE_PADS], pad)], -1), 'attention_mask': mask}
        for pad in pads
    ]
    try:
        outputs = [run_probe(model, **run) for run in runs]
    except Exception:  # not decided here
        return None
    if not all(isinstance(output, torch.Tensor) and bool(torch.isfinite(output).all()) for output in outputs):
        return None
    pooled = outputs[0].dim() < 3 or outputs[1].shape[1] != mask.shape[1]
    alone, first, *second = (output.double() if pooled else output[:, : row.shape[1]].double() for output in outputs)
    if alone.shape != first.shape:
        return None
    return _same_row(outputs[0].dtype, alone, first, *second)


def check_right_padding(model: torch.nn.Module, attention_mask: torch.Tensor, facts: ModelFacts | None = None) -> None:
    """Refuse a right-padded batch (a row whose ``attention_mask`` ends with 0) for a model whose right-padded rows
    are not the rows alone (:py:func:`keeps_right_padding`): its explanation of such a row would be that of another
    input, pads included (XLNet's classifier scored a pad: 0.025 for the row's -0.0016).

    Raises
    ------
    ValueError
        Naming the model and what to do: explain the rows one at a time, or pad on the left where it keeps that.
    """
    if not bool((attention_mask[:, -1] == 0).any()) or keeps_right_padding(model, facts) is not False:
        return
    raise ValueError(
        f'attention_mask pads rows on the right, and {type(model).__name__} gives a right-padded row other outputs '
        'than the row alone (its sequence mixing or its pooling reads the pads), so its explanation would not be the '
        "row's own: explain the rows one at a time, or pad them on the left (tokenizer.padding_side = 'left')"
    )


def is_image_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` takes pixels (Hugging Face ``main_input_name == 'pixel_values'``, or no word embedding table in
    it: timm models) rather than token ids (a Hugging Face language model, or a model of one's own around one:
    :py:func:`~zennit_attn.core.modules.word_embeddings`)."""
    main_input = getattr(model, 'main_input_name', None)
    if main_input is not None:
        return main_input == 'pixel_values'
    return not isinstance(word_embeddings(model), torch.nn.Embedding)


def image_channels(model: torch.nn.Module) -> int | None:
    """The number of colour channels a Hugging Face image model takes (``config.num_channels``, or its vision
    tower's), None where its configuration does not say (timm models)."""
    config = getattr(model, 'config', None)
    for source in (config, getattr(config, 'vision_config', None)):
        channels = getattr(source, 'num_channels', None)
        if isinstance(channels, int):
            return channels
    return None


def takes_video(model: torch.nn.Module) -> bool:
    """Whether ``model`` takes videos, ``[batch, frames, channels, height, width]`` pixels: its configuration has a
    number of frames (VideoMAE, TimeSformer, ViViT)."""
    frames = getattr(getattr(model, 'config', None), 'num_frames', None)
    return isinstance(frames, int) and not isinstance(frames, bool)


def check_input_kind(model: torch.nn.Module, inputs) -> None:
    """Refuse a floating-point input of a model that is neither explained at token ids nor at pixels: one whose main
    input (``main_input_name``) is audio (``input_values``, ``input_features``) or a preprocessed array (Perceiver's
    ``inputs``).

    Raises
    ------
    UnsupportedModelError
        Naming the model, its main input and what zennit-attn explains.
    """
    main = getattr(model, 'main_input_name', 'input_ids')
    if main in ('input_ids', 'pixel_values') or not (isinstance(inputs, torch.Tensor) and inputs.is_floating_point()):
        return
    raise UnsupportedModelError(
        f'{type(model).__name__} takes {main!r} (a float tensor, here of shape {tuple(inputs.shape)}): zennit-attn '
        'explains language models at their token ids and image classifiers at pixel_values [batch, channels, height, '
        "width]; this kind of input (audio values or features, Perceiver's preprocessed inputs) is not supported"
    )


def bitsandbytes_layers(model: torch.nn.Module, facts: ModelFacts, modules: Modules | None = None) -> list:
    """The model's bitsandbytes 4-bit layers (:py:func:`~zennit_attn.core.quantization.four_bit_layers`), a fact of
    the model (``modules``: ``list(model.named_modules())`` where the caller has walked them)."""
    walked = model.named_modules() if modules is None else modules
    return facts.known('bitsandbytes 4-bit layers', lambda: four_bit_layers(module for _, module in walked))


def unpack_quantized(model: torch.nn.Module, facts: ModelFacts, modules: Modules | None = None) -> None:
    """Undo bitsandbytes' packing of the model's 4-bit weights for CPU inference, whose kernel passes no gradient
    (:py:func:`~zennit_attn.core.quantization.unpack_for_gradients`; it packs them in a pass without gradients that
    its user ran: ``generate()``, ``torch.no_grad()``); unpacking runs where one is packed."""
    unpack_for_gradients(bitsandbytes_layers(model, facts, modules))


def check_model(model: torch.nn.Module, modules: Modules | None = None) -> ModelFacts:
    """Refuse what would give a wrong or no explanation, and return the model's :py:class:`ModelFacts`.

    What a user can change without changing the model's key (:py:class:`ModelFacts`) is checked in every call, in one
    walk over the modules: inference mode, compilation, rule hooks, training mode. What depends on the key only is a
    fact of the model, checked once while the model stays the same: quantized layers, weights on the ``meta``
    device.

    Parameters
    ----------
    model: torch.nn.Module
    modules: list of (str, torch.nn.Module), optional
        ``list(model.named_modules())`` where the caller has walked the model (for the rest of its call).

    Returns
    -------
    ModelFacts
        The model's facts, for :py:func:`is_causal` and :py:mod:`zennit_attn.inputs.lookups` in the same call.

    Raises
    ------
    TypeError
        For a model that is not a module.
    UnsupportedQuantizationError
        For quantized layers no backward pass goes through
        (:py:func:`zennit_attn.core.quantization.check_quantized`).
    CompiledModelError
        For a compiled model (its hooks are bypassed: :py:func:`zennit_attn.composites.refuse_compiled`).
    RuntimeError
        Inside :py:func:`torch.inference_mode` (no gradients can be recorded), or where zennit rules are already
        registered on the model (a composite's context that is still open: its hooks would change every
        gradient and relevance computed through the model).
    ValueError
        For any submodule in training mode (active dropout) or parameters on the ``meta`` device that no
        ``accelerate`` offloading hook loads.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f'model must be a torch.nn.Module, got {type(model).__name__}')
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            'explain() computes gradients, which torch.inference_mode() forbids: call it outside '
            'the inference_mode block (torch.no_grad() around it is fine)'
        )
    modules = list(model.named_modules()) if modules is None else modules
    if any(_may_be_compiled(module) for _, module in modules):
        refuse_compiled(model, modules=modules)  # names the compiled module and what to explain instead
    facts = model_facts(model, modules)
    facts.known('quantization', lambda: check_quantized(model))
    unpack_quantized(model, facts, modules)
    if any(module._forward_pre_hooks or module._forward_hooks for _, module in modules):
        _refuse_rule_hooks(model, modules)
    training = next((name for name, module in modules if module.training), None)
    if training is not None:
        where = 'the model' if training == '' else f'submodule {training!r}'
        raise ValueError(
            f'{where} of {type(model).__name__} is in training mode (dropout would make every call '
            'differ): call model.eval() before explaining'
        )
    facts.known('weights', lambda: _check_weights(model, modules))
    return facts


def _may_be_compiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` may be compiled (the wrapper of ``torch.compile(module)`` holds ``_orig_mod``,
    ``module.compile()`` sets ``_compiled_call_impl``): then :py:func:`~zennit_attn.composites.refuse_compiled`
    decides."""
    return '_orig_mod' in module._modules or module.__dict__.get('_compiled_call_impl') is not None


def _refuse_rule_hooks(model: torch.nn.Module, modules: Modules) -> None:
    """Raise if zennit rules are registered on the model (see :py:func:`check_model`; ``modules``: its walk)."""
    AttnLRPComposite.refuse_rules(
        model,
        hint="explain() registers the rules it needs itself: leave that context (or call the composite's remove()) "
        'first, and pass an LRP composite as explain(..., composite=...)',
        modules=modules,
    )


def _check_weights(model: torch.nn.Module, modules: Modules) -> None:
    """Raise for tensors on the ``meta`` device that no ``accelerate`` offloading hook loads (see
    :py:func:`check_model`)."""
    on_meta = any(
        tensor is not None and tensor.is_meta
        for _, module in modules
        for tensor in itertools.chain(module._parameters.values(), module._buffers.values())
    )
    if not on_meta:
        return  # the common case, without the names and the offloading walk
    offloaded = offloaded_modules(model)
    meta = next(
        (
            name
            for name, tensor in [*model.named_parameters(), *model.named_buffers()]
            if tensor.is_meta and name.rpartition('.')[0] not in offloaded
        ),
        None,
    )
    if meta is not None:
        raise ValueError(
            f'{type(model).__name__} has tensors on the meta device (e.g. {meta!r}): load its weights '
            '(from_pretrained without device="meta", or model.to_empty() plus loading a state dict)'
        )


def offloaded_modules(model: torch.nn.Module) -> set[str]:
    """Names of the modules whose weights ``accelerate`` offloads (CPU or disk offload of a ``device_map``): an
    offloading hook (``_hf_hook`` with ``offload=True``, also inside a ``SequentialHook``) on the module or an
    ancestor loads them for each forward, so they are on the meta device in between."""

    def offloads(hook) -> bool:
        return bool(getattr(hook, 'offload', False)) or any(offloads(inner) for inner in getattr(hook, 'hooks', ()))

    names, covered = set(), []
    for name, module in model.named_modules():
        if offloads(module.__dict__.get('_hf_hook')):  # accelerate sets it as a plain attribute
            covered.append(name)
        if any(within(name, prefix) for prefix in covered):
            names.add(name)
    return names


# --------------------------------------------------------------------------------------------------- integers
def as_integer(value, name: str) -> int:
    """``value`` as an int if it is an integer (Python, numpy or a 0-d integer tensor), else a ValueError naming
    ``name``."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
        return int(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise ValueError(f'{name} must be an integer, got {value!r} ({type(value).__name__})')


def as_integers(value, name: str) -> torch.Tensor | None:
    """``value`` (int, sequence or tensor of integers, None) as a long tensor; floats are refused, not
    truncated."""
    if value is None:
        return None
    if isinstance(value, (numbers.Number, torch.Tensor)) and torch.as_tensor(value).dim() == 0:
        return torch.tensor(as_integer(value, name))
    tensor = torch.as_tensor(value)
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise ValueError(f'{name} must hold integers, got {tensor.dtype} values {value!r}')
    return tensor.long()


# --------------------------------------------------------------------------------------------------- targets
def target_pairs(target) -> torch.Tensor | None:
    """``[pairs, 2]`` (position, token) if ``target`` names several pairs, else None."""
    if target is None or isinstance(target, (numbers.Number, str)):
        return None
    if isinstance(target, torch.Tensor):
        return as_integers(target, 'target') if target.dim() == 2 and target.shape[1] == 2 else None
    items = list(target)
    if items and all(isinstance(item, (tuple, list)) and len(item) == 2 for item in items):
        return as_integers(items, 'target (position, token) pairs')
    return None


def token_id(tokenizer, text: str, name: str = 'target') -> int:
    """The id of the one token ``text`` encodes to (without special tokens), else a ValueError naming the tokens it
    became; ``name`` names the argument in the message. A text that becomes the tokenizer's unknown token without
    being it (a word-level or SentencePiece vocabulary without the word) is refused too: its logit is that of every
    unknown text, not the text's."""
    if tokenizer is None:
        raise ValueError(f'{name} {text!r} is text: pass tokenizer= to turn it into its token id, or give the id')
    ids = tokenizer.encode(text, add_special_tokens=False)
    unknown = getattr(tokenizer, 'unk_token_id', None)
    if ids == [unknown] and text != getattr(tokenizer, 'unk_token', None):
        raise ValueError(
            f'{name} {text!r} is not in the vocabulary of the tokenizer: it encodes to the unknown token '
            f'{tokenizer.unk_token!r} (id:{unknown}), whose logit is that of any unknown text; give a text of the '
            "vocabulary (mind the leading space, e.g. ' Paris'), or its id"
        )
    if len(ids) != 1:
        pieces = ', '.join(f'{tokenizer.decode([index])!r} (id:{index})' for index in ids)
        encodes = f'{len(ids)} tokens: {pieces}' if ids else 'no token at all'
        raise ValueError(
            f"{name} {text!r} is {encodes}; give exactly one token (mind the leading space, e.g. ' Paris'), or its id"
        )
    return int(ids[0])


def token_ids(tokenizer, value, name: str = 'target'):
    """``value`` with its texts (a text, or a list of texts and ids) turned into token ids by :py:func:`token_id`;
    anything else is returned as it is."""
    if isinstance(value, str):
        return token_id(tokenizer, value, name)
    if isinstance(value, (list, tuple)) and any(isinstance(item, str) for item in value):
        return [token_id(tokenizer, item, name) if isinstance(item, str) else item for item in value]
    return value


def check_output_rows(scores: torch.Tensor, batch: int, model_name: str) -> None:
    """Refuse ``scores`` (the model's output as the task reads it) whose first dimension is not the input's ``batch``
    rows: a model that returns one row's scores without the batch dimension (``logits[0]``, ``.squeeze(0)``) or a
    scalar would have its positions or classes read as rows, and another value explained than the one asked for.

    Raises
    ------
    ValueError
        Naming the output's shape and the batch.
    """
    if scores.dim() == 0 or scores.shape[0] != batch:
        raise ValueError(
            f'the output of {model_name} has shape {tuple(scores.shape)} for an input of {batch} row(s): its first '
            f'dimension must be the batch ([batch, outputs], [batch, positions, outputs] or [batch] values); does the '
            'model drop the batch dimension (logits[0], .squeeze(0), .sum())?'
        )


def default_position(position) -> bool:
    """Whether ``position`` is ``explain()``'s default, -1 or None: no position named (each row's last token)."""
    return position is None or (isinstance(position, int) and position == -1)


def row_ends(mask: torch.Tensor) -> torch.Tensor:
    """``[batch]`` each row's end in ``mask`` (``[batch, seq]``, 0 at padding): one after its last token that is not
    padding (the row's length where it is padded on the right, ``seq`` where on the left)."""
    order = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
    return ((mask != 0) * order).argmax(-1) + 1


def explained_positions(scores: torch.Tensor, position, mask) -> torch.Tensor | None:
    """The explained position of every row (``[batch]``, or ``[batch, pairs]``) for ``[batch, seq, ...]`` scores,
    None for ``[batch, outputs]`` scores; -1 or None is each row's last non-padding position, and a negative position
    counts back from it (-2: the token before it; in a right-padded row, not the padding's end)."""
    if scores.dim() == 2:
        return None
    batch, seq = scores.shape[:2]
    ends = torch.full((batch,), seq, device=scores.device) if mask is None else row_ends(mask).to(scores.device)
    if default_position(position):
        return ends - 1
    positions = _per_row(position, batch, seq, scores.device)
    positions = torch.where(positions < 0, ends.view(-1, *([1] * (positions.dim() - 1))) + positions, positions)
    before = sorted(set((positions < 0).nonzero()[:, 0].tolist()))
    if before:
        raise ValueError(f'position {position} is before the first token of row(s) {before}')
    if mask is not None:
        rows = torch.arange(batch, device=scores.device).view(-1, *([1] * (positions.dim() - 1)))
        padded = sorted(set((mask[rows, positions] == 0).nonzero()[:, 0].tolist()))
        if padded:
            raise ValueError(f'position {position} is a padding token in row(s) {padded}')
    return positions


def _per_row(position, batch: int, seq: int, device) -> torch.Tensor:
    """``position`` as integers, one per row (``[batch]``) or ``[batch, pairs]``, each within ``-seq .. seq - 1``."""
    positions = as_integers(position, 'position').to(device)
    if positions.dim() < 2:
        positions = positions.flatten()
        if positions.numel() == 1:
            positions = positions.expand(batch)
        if positions.numel() != batch:
            raise ValueError(f'position needs one entry per row ({batch}), got {positions.numel()}')
    if bool(((positions < -seq) | (positions >= seq)).any()):
        raise ValueError(f'position {position} is out of range for sequence length {seq}')
    return positions


def target_indices(target, selected: torch.Tensor) -> torch.Tensor:
    """The explained output index of every row of the ``[batch, outputs]`` scores ``selected`` at the explained
    positions: ``target`` checked (one for all rows or one per row, within the outputs), or the argmax."""
    batch, size = selected.shape[0], selected.shape[-1]
    if target is None:
        return selected.detach().argmax(-1)
    targets = as_integers(target, 'target').to(selected.device)
    if selected.dim() == 2:
        targets = targets.flatten()
        if targets.numel() == 1:
            targets = targets.expand(batch)
        if targets.numel() != batch:
            raise ValueError(f'target needs one entry per row ({batch}), got {targets.numel()}')
    if bool(((targets < 0) | (targets >= size)).any()):
        raise ValueError(f'target {target} is out of range: the explained output has {size} entries')
    return targets


# --------------------------------------------------------------------------------------------------- token input
def check_ids(
    input_ids, attention_mask, name: str = 'input_ids', device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(input_ids, attention_mask)`` as ``[batch, seq]`` tensors (on ``device``, where given: the model's input
    device); text, other shapes and dtypes, empty input, a mask of another shape and a row without any token are
    refused."""
    if isinstance(input_ids, str) or (
        isinstance(input_ids, (list, tuple)) and input_ids and isinstance(input_ids[0], str)
    ):
        raise TypeError(
            f'{name} must be token ids, got text: pass the tokenizer, explain(model, text, '
            'tokenizer=tokenizer), or tokenize it first, explain(model, tokenizer(text, '
            "return_tensors='pt'))"
        )
    input_ids = torch.as_tensor(input_ids, device=device)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f'{name} must be an integer tensor [batch, seq], got {input_ids.dtype} {tuple(input_ids.shape)}'
        )
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f'Nothing to explain: {name} has shape {tuple(input_ids.shape)}')
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask, device=input_ids.device)
        if attention_mask.dim() == 1:
            attention_mask = attention_mask[None]
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f'attention mask {tuple(attention_mask.shape)} does not match {name} {tuple(input_ids.shape)}'
            )
        if not bool((attention_mask != 0).any(1).all()):
            raise ValueError('A row of attention_mask masks every token: nothing to explain in it')
    return input_ids, attention_mask


def check_word_embeddings(model: torch.nn.Module, embedding) -> None:
    """Refuse a model without input embeddings (``TypeError``) and one that embeds each token with several tables
    (:py:class:`~zennit_attn.core.errors.UnsupportedModelError`): MusicGen's decoder sums one table per audio codebook
    over ``num_codebooks`` rows of ``input_ids`` per sequence, which are not the tokens of one sequence."""
    if not isinstance(embedding, torch.nn.Module):
        raise TypeError(
            f'{type(model).__name__} has no input embedding module (get_input_embeddings() returns '
            f'{type(embedding).__name__})'
        )
    if isinstance(embedding, (torch.nn.ModuleList, torch.nn.ModuleDict)):
        raise UnsupportedModelError(
            f'{type(model).__name__} embeds its input_ids with a {type(embedding).__name__} of tables (one per '
            f'codebook, here {len(embedding)}), summed over as many rows of input_ids per sequence: zennit-attn '
            'explains models whose tokens have one embedding each, so it does not explain this model.'
        )


def check_vocabulary(input_ids: torch.Tensor, embedding: torch.nn.Module, name: str) -> None:
    """Refuse ids outside the vocabulary of ``embedding`` (tokenized for another model)."""
    size = getattr(embedding, 'num_embeddings', None)
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or (size is not None and high >= size):
        raise ValueError(
            f'{name} holds ids from {low} to {high}, but the vocabulary of {type(embedding).__name__} '
            f'has {size} entries (0 to {size - 1}): was it tokenized for another model?'
        )


def check_length(model: torch.nn.Module, length: int, name: str) -> None:
    """Refuse an input longer than the positions the model was built for (``config.max_position_embeddings``, else
    ``config.n_positions``); a negative limit or none (XLNet's ``-1``: relative positions) means no limit."""
    config = getattr(model, 'config', None)
    config = getattr(config, 'text_config', None) or config
    limit = getattr(config, 'max_position_embeddings', None)
    if limit is None:
        limit = getattr(config, 'n_positions', None)
    if isinstance(limit, numbers.Integral) and not isinstance(limit, bool) and 0 <= limit < length:
        raise ValueError(
            f'{name} has {length} positions, more than the {limit} {type(model).__name__} was built for '
            '(config.max_position_embeddings): shorten the input, e.g. keep its last '
            f'{limit} tokens'
        )


def split_encoding(input_ids, attention_mask=None, model_kwargs: dict | None = None) -> tuple[object, object, dict]:
    """``(input_ids, attention_mask, model_kwargs)`` from what a tokenizer returns (a ``BatchEncoding`` or a dict with
    ``input_ids``): its ``attention_mask`` unless one is given and its other fields (``token_type_ids``, ...) as model
    arguments; a field given twice (argument or ``model_kwargs`` and the mapping) with different values is refused.
    Other inputs are returned as they are."""
    model_kwargs = dict(model_kwargs or {})
    if not isinstance(input_ids, Mapping):
        return input_ids, attention_mask, model_kwargs
    encoding = dict(input_ids)
    if 'input_ids' not in encoding:
        raise ValueError(f'the input mapping has no input_ids (keys: {sorted(encoding)})')
    input_ids = encoding.pop('input_ids')
    mask = encoding.pop('attention_mask', None)
    if (
        attention_mask is not None
        and mask is not None
        and not torch.equal(torch.as_tensor(attention_mask), torch.as_tensor(mask))
    ):
        raise ValueError('attention_mask was given twice (argument and input mapping) with different values')
    for key, value in encoding.items():
        given = model_kwargs.setdefault(key, value)
        if given is not value and not _same_value(given, value):
            raise ValueError(f'{key} was given twice (model_kwargs and input mapping) with different values')
    return input_ids, mask if attention_mask is None else attention_mask, model_kwargs


def _same_value(first, second) -> bool:
    """Whether two values of one model argument are the same (tensors or anything torch can make one of)."""
    try:
        return torch.equal(torch.as_tensor(first), torch.as_tensor(second))
    except (TypeError, RuntimeError, ValueError):
        return first == second
