"""The check of one architecture: will zennit-attn explain a model of it?

A model of the architecture is built from a tiny random configuration
(:py:mod:`~zennit_attn.workflows.architecture_check.configs`) in float64, every weight initialised to zero drawn at
random (:py:func:`randomize_zero_weights`), every bias and learned position embedding set to zero
(:py:func:`zero_biases`), and fed token ids (and pixels where it has a vision tower:
:py:mod:`~zennit_attn.workflows.architecture_check.pixels`). Then:

- ``explained``: CP-LRP's relevance at the inputs (every modality: text embeddings and pixels) sums to the explained
  logit within ``1e-6`` (exact conservation, which a missed non-linearity breaks), and AttnLRP runs to finite
  relevance; or the model adds a constant in its code (a bias that cannot be zeroed), so that conservation cannot be
  exact by design, which the reason says;
- ``refused``: zennit-attn refuses the model with a reason that names the operation or the module
  (:py:class:`~zennit_attn.core.errors.UnsupportedModelError`; the forms of :py:data:`REFUSALS`);
- ``not built``: the tiny configuration does not build or run a plain forward pass (a limit of the check, not of the
  library);
- ``failed``: anything else (a conservation error, another exception): a defect.

An explained model is also checked for AttnLRP's own rules (:py:attr:`Result.attnlrp`): AttnLRP with the softmax
rule's bias term handed back (:py:mod:`~zennit_attn.workflows.architecture_check.softmax_bias`) conserves the logit
unless the model adds a constant, spells a softmax otherwise than as a softmax call, or feeds an input of zero to the
identity rule; the walk's test names each architecture that does not, and why.

:py:func:`check_architecture` checks an architecture of one of transformers' auto mappings from its config class's
defaults (the walk over all of them, ``tools/supported_models.py``, writes the documentation's supported-models page);
:py:func:`check_config` checks a model's own configuration (``zennit-attn check --model FOLDER``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import io
import math
import re
import time
import warnings
from collections.abc import Callable, Iterator

import torch

from ...composites import AttnLRPEpsilon, CPLRPEpsilon
from ...core.errors import UnsupportedModelError
from ...core.modules import decoder_word_embeddings
from ...inputs.checks import check_embeddings_run, check_word_embeddings
from ...inputs.lookups import TokenLookups, needs_ids
from ...operations import RuleTable
from .configs import model_class, model_class_for, tiny_config, tiny_copy
from .pixels import PIXEL_INPUTS, pixel_inputs, short_message
from .softmax_bias import SoftmaxBias

__all__ = [
    'STATUSES',
    'REFUSALS',
    'Result',
    'check_architecture',
    'check_config',
    'built_model',
    'zero_biases',
    'randomize_zero_weights',
    'check_inputs',
    'input_relevances',
    'added_constants',
    'attnlrp_returned',
]

STATUSES = ('explained', 'refused', 'not built', 'failed')

#: The check's own refusal of a model whose forward runs on token ids but not on their embeddings.
NO_EMBEDDINGS = 'takes no inputs_embeds'
#: The forms of a refusal's reason, each naming the operation or the module it refuses: the engine's
#: (``zennit-attn cannot explain OP in 'PATH' (CLASS): ...``), a model class's (``CLASS embeds its input_ids with ...``,
#: ``CLASS is named like ...``, ``CLASS changes its input in place ...``, ``CLASS returned ...``) and the check's own
#: (:py:data:`NO_EMBEDDINGS`, with the error of the forward on embeddings), and explain()'s of a model that runs
#: otherwise on the embeddings of its tokens (:py:func:`~zennit_attn.inputs.checks.check_embeddings_run`: ``CLASS fails
#: when run on the embeddings ...``, ``CLASS: on the embeddings of its tokens ...``).
REFUSALS = (
    re.compile(r"zennit-attn cannot explain \S+( \(used by \S+\))? in ('[^']*' \(\w+\)|the model \(\w+\)): "),
    re.compile(
        r'[A-Z]\w* (embeds its input_ids with|is named like|changes its input in place|returned|has no input embedding)'
    ),
    re.compile(r'[A-Z]\w*( fails when run on the embeddings of its tokens|: on the embeddings of|: its output on)'),
    re.compile(re.escape(NO_EMBEDDINGS) + r' \(\w+: '),
)
#: What :py:func:`check_architecture` notes (in :py:attr:`Result.inputs`) for a model that runs in float64 only with
#: torch's default dtype float64: its code makes tensors of the default dtype from float64 values (an overflow in
#: float32).
FLOAT64_DEFAULT = "run with float64 as torch's default dtype"
#: What :py:func:`check_architecture` notes where the pixels that were fed carry no relevance.
NO_PIXEL_SHARE = "the pixels carry no relevance (CP-LRP's share at the pixel inputs is 0)"
#: The largest entry of a weight that :py:func:`randomize_zero_weights` draws anew (an initialisation of almost zeros).
NEGLIGIBLE = 1e-6
#: The largest share of the explained logit at the pixel inputs that counts as none (rounding: 1e-36 in a tower that
#: attenuates them).
NO_SHARE = 1e-9

#: The largest distance of a relevance / logit ratio from 1 that counts as exact conservation (float64 rounding where
#: relevances of opposite signs cancel, the epsilon of a normaliser).
EXACT = 1e-6
#: The bias terms of softmax rows of zero logits (their sum) below which none counts as stranded (rounding).
STRANDED = 1e-9

#: Names of biases, and of learned or fixed position and token-type embeddings (added to the tokens: biases too),
#: and of learned tokens put ahead of the patches (CLIP's class embedding, RADIO's class and register tokens).
_BIAS = re.compile(r'bias')
_POSITIONS = re.compile(
    r'(^|\.)(wpe|positions_embed|pos_encoding|pos_embed|position_embeddings?|embed_positions|positional_embedding|'
    r'token_type_embeddings|pos_emb(edding)?|embed_pos|position_embedding|abs_pos|'
    r'type_embeddings|segment_embeddings?|language_embeddings|lang_embeddings|[xyhw]_position_embeddings|'
    r'token_type_embeddings_\d+|class_embedding|cls_register_token|\w+_positional_embedding)(\.|$)'
)


@dataclasses.dataclass
class Result:
    """The verdict on one architecture.

    Attributes
    ----------
    mapping: str
        The auto mapping of the model class (``'causal-lm'``, ...; ``''`` where none holds the architecture).
    architecture: str
        The ``model_type``.
    status: str
        One of :py:data:`STATUSES`.
    reason: str
        Why it is refused, not built or failed (and why an explained model is not exactly conservative).
    ratio: float
        CP-LRP's relevance at the inputs over the explained logit (NaN where it was not computed).
    seconds: float
        How long the check took.
    inputs: str
        What was fed, for a model with a vision tower: ``'text + image'`` or ``'text only: <why>'`` (``''`` without
        one), and :py:data:`FLOAT64_DEFAULT` for a model that runs in float64 only so.
    rules: RuleTable or None
        Where asked for (``rules=``) and the model was built: the rule each of its operations gets under the
        composite asked for (:py:meth:`~zennit_attn.composites.AttnLRPComposite.rule_table`, a dry run).
    attnlrp: float
        For an explained model: AttnLRP's relevance at the inputs over the explained logit with the softmax rule's
        bias term handed back (:py:func:`attnlrp_returned`; 1 to rounding where AttnLRP's other rules lose nothing),
        NaN otherwise.
    attnlrp_note: str
        What kept that check from being exact other than the rules: its error, or the bias terms stranded at softmax
        rows of zero logits.
    """

    mapping: str
    architecture: str
    status: str
    reason: str = ''
    ratio: float = math.nan
    seconds: float = 0.0
    inputs: str = ''
    rules: RuleTable | None = None
    attnlrp: float = math.nan
    attnlrp_note: str = ''

    @property
    def attnlrp_exact(self) -> bool:
        """Whether AttnLRP with the softmax rule's bias term handed back conserves the logit (within
        :py:data:`EXACT`; False where it was not computed)."""
        return abs(self.attnlrp - 1) <= EXACT


def check_architecture(mapping: str, architecture: str, seed: int = 0, rules=None) -> Result:
    """Build the architecture ``architecture`` (a ``model_type``) of the auto mapping ``mapping`` from a tiny
    configuration of its config class's defaults
    (:py:func:`~zennit_attn.workflows.architecture_check.configs.tiny_config`) and check it (see the module's
    description); with a composite ``rules``, also the rule each operation of the model gets under it
    (:py:attr:`Result.rules`)."""
    start = time.perf_counter()

    def build():
        model, config_class = model_class(mapping, architecture)
        return model, tiny_config(config_class)

    return _check(mapping, architecture, build, seed, start, rules)


def check_config(config, seed: int = 0, rules=None) -> Result:
    """Build a model from a tiny copy of a model's own configuration ``config`` (a ``PretrainedConfig``, e.g. read
    from its ``config.json``; :py:func:`~zennit_attn.workflows.architecture_check.configs.tiny_copy`), of the class of
    :py:func:`~zennit_attn.workflows.architecture_check.configs.model_class_for`, and check it (see the module's
    description; ``rules`` as for :py:func:`check_architecture`). ``config`` itself is not changed."""
    start = time.perf_counter()
    architecture = getattr(config, 'model_type', '') or ''
    try:
        mapping, model, own = model_class_for(tiny_copy(config))
    except Exception as error:  # no model class in the mappings, or a configuration that does not copy
        return Result('', architecture, 'not built', short_message(error), seconds=time.perf_counter() - start)
    return _check(mapping, architecture, lambda: (model, own), seed, start, rules)


def _check(mapping: str, architecture: str, build: Callable, seed: int, start: float, rules=None) -> Result:
    """Build the model of ``build() -> (model class, tiny configuration)`` and give the verdict (and the rule table
    under the composite ``rules``)."""
    generator = torch.Generator().manual_seed(seed)
    try:
        model, inputs, fed = built_model(mapping, build, seed, generator)
    except Exception as error:  # a limit of the tiny configurations
        return Result(mapping, architecture, 'not built', short_message(error), seconds=time.perf_counter() - start)
    status, reason, ratio, fed, dtype = _verdict(model, inputs, fed)
    attnlrp, attnlrp_note = attnlrp_returned(model, inputs, dtype) if status == 'explained' else (math.nan, '')
    table = None
    if rules is not None:
        leaves, kwargs = _leaves(model, model.get_input_embeddings(), inputs)
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter('ignore')
            table = rules.rule_table(model, **leaves, **kwargs)
    seconds = time.perf_counter() - start
    return Result(mapping, architecture, status, reason, ratio, seconds, fed, table, attnlrp, attnlrp_note)


def built_model(
    mapping: str, build: Callable, seed: int, generator: torch.Generator
) -> tuple[torch.nn.Module, dict, str]:
    """The model in float64 with zero biases (random weights from ``seed``), its inputs and what was fed."""
    model_class, config = build()
    with contextlib.suppress(Exception):
        config._experts_implementation = 'eager'  # grouped-mm kernels refuse float64
    torch.manual_seed(seed)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter('ignore')
        model = model_class(config).to(torch.float64).eval()
        randomize_zero_weights(model, torch.Generator().manual_seed(seed))
        zero_biases(model)
        inputs, fed = check_inputs(model, config, mapping, generator)
    return model, inputs, fed


def _verdict(model: torch.nn.Module, inputs: dict, fed: str) -> tuple[str, str, float, str, torch.dtype]:
    """``(status, reason, ratio, what was fed, torch's default dtype it ran with)`` of the built model: its plain
    forward on the embeddings as :py:func:`~zennit_attn.explain` runs it, then CP-LRP's conservation and AttnLRP;
    pixels that carry no relevance (CP-LRP's share at the pixel inputs is zero) are noted as text only
    (:py:data:`NO_PIXEL_SHARE`)."""
    error, dtype, fed = _plain_forward(model, inputs, fed)
    if error is not None:
        status, reason = _plain_forward_verdict(model, inputs, error)
        return status, reason, math.nan, fed, dtype
    status, reason, ratio, share = _explained(model, inputs, dtype)
    if fed.startswith('text + image') and abs(share) <= NO_SHARE:
        fed = f'text only: {NO_PIXEL_SHARE} ({fed})'
    elif fed.startswith('text + image') and math.isfinite(share):
        fed = f'{fed}, pixel share {share:.3g}'
    return status, reason, ratio, fed, dtype


def _plain_forward(model: torch.nn.Module, inputs: dict, fed: str) -> tuple[Exception | None, torch.dtype, str]:
    """The error of the plain forward on the embeddings (None where it runs), the default dtype it runs with and what
    was fed: a model whose code makes default-dtype tensors of float64 values (XGLM's mask) runs with float64 as
    torch's default dtype, and the note says so."""
    error = _fails(model, inputs)
    dtype = torch.get_default_dtype()
    if error is not None:
        with default_dtype(torch.float64):
            if _fails(model, inputs) is None:
                error, dtype, fed = None, torch.float64, ', '.join(filter(None, [fed, FLOAT64_DEFAULT]))
    return error, dtype, fed


def _plain_forward_verdict(model: torch.nn.Module, inputs: dict, error: Exception) -> tuple[str, str]:
    """``(status, reason)`` of a model whose plain forward on the embeddings raised ``error``: refused where
    zennit-attn refused it (:py:class:`~zennit_attn.core.errors.UnsupportedModelError`) or where it runs on the ids
    only (:py:data:`NO_EMBEDDINGS`), not built where it does not run at all."""
    if isinstance(error, UnsupportedModelError):
        return 'refused', short_message(error)
    if _fails(model, inputs, embeddings=False) is not None:  # a limit of the tiny configurations
        return 'not built', short_message(error)
    return (
        'refused',
        f'{NO_EMBEDDINGS} ({type(error).__name__}: {short_message(error)[:120]}): token '
        'relevance needs the embeddings as input',
    )


def _explained(model: torch.nn.Module, inputs: dict, dtype: torch.dtype) -> tuple[str, str, float, float]:
    """``(status, reason, ratio, pixel share)`` of CP-LRP's conservation and AttnLRP's run on the model (with torch's
    default dtype ``dtype``); the pixel share is CP-LRP's relevance at the pixel inputs (every input but the text
    embeddings) over the explained logit (NaN where none is fed or it did not run)."""
    composite = CPLRPEpsilon()
    try:
        with default_dtype(dtype):
            sums, _ = input_relevances(model, inputs, composite)
            attnlrp = relevance_sum(model, inputs, AttnLRPEpsilon())
    except UnsupportedModelError as error:
        return 'refused', short_message(error), math.nan, math.nan
    except Exception as error:
        return 'failed', f'{type(error).__name__}: {short_message(error)}', math.nan, math.nan
    ratio = float(sum(sums.values()))
    pixels = [key for key in inputs if key.endswith(PIXEL_INPUTS)]  # none where the pixels got no gradient
    share = float(sum(sums.get(key, 0.0) for key in pixels)) if pixels else math.nan
    exact = abs(ratio - 1) <= EXACT and math.isfinite(attnlrp)
    reason = '' if exact else f'CP-LRP relevance / logit = {ratio:.6g}, AttnLRP sum {attnlrp:.4g}'
    path, value = max(added_constants(composite), key=lambda item: abs(float(item[1])), default=('', 0.0))
    if not exact and abs(float(value)) >= 1e-4 and math.isfinite(attnlrp):
        # a constant in the model's code is a bias that cannot be zeroed: conservation cannot be exact (a numerical
        # epsilon below 1e-4 cannot explain a visible loss: that stays a failure)
        return (
            'explained',
            f'not exactly conservative by design: the model adds the constant {value:g} at {path!r} ({reason})',
            ratio,
            share,
        )
    if not exact and math.isfinite(attnlrp) and abs(cplrp_returned(model, inputs, dtype) - 1) <= EXACT:
        return (
            'explained',
            'not exactly conservative by design: a softmax whose output is a value, not attention weights, keeps the '
            f'softmax rule (Prop. 3.1) under CP-LRP too and loses its bias term ({reason}; exact with it handed back)',
            ratio,
            share,
        )
    return ('explained' if exact else 'failed'), reason, ratio, share


def cplrp_returned(model: torch.nn.Module, inputs: dict, dtype: torch.dtype) -> float:
    """CP-LRP's relevance at the inputs over the explained logit with the bias term of every softmax that is not
    attention weights handed back (:py:meth:`~.softmax_bias.SoftmaxBias.cplrp_composite`, with torch's default dtype
    ``dtype``); NaN where it does not run."""
    try:
        return _quiet_relevance_sum(model, inputs, SoftmaxBias().cplrp_composite(), dtype)
    except Exception:  # the check's own limit (an override that does not fit the call): no claim
        return math.nan


def _quiet_relevance_sum(model: torch.nn.Module, inputs: dict, composite, dtype: torch.dtype) -> float:
    """:py:func:`relevance_sum` under ``composite`` with torch's default dtype ``dtype``, the model's warnings and
    messages silenced."""
    with default_dtype(dtype), warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter('ignore')
        return relevance_sum(model, inputs, composite)


def attnlrp_returned(model: torch.nn.Module, inputs: dict, dtype: torch.dtype) -> tuple[float, str]:
    """``(ratio, note)`` of AttnLRP with the softmax rule's bias term handed back
    (:py:class:`~zennit_attn.workflows.architecture_check.softmax_bias.SoftmaxBias`, with torch's default dtype
    ``dtype``): its relevance at the inputs over the explained logit, and what kept it from being exact other than the
    rules (its error, with NaN; the bias terms stranded at softmax rows of zero logits)."""
    bias = SoftmaxBias()
    try:
        ratio = _quiet_relevance_sum(model, inputs, bias.composite(), dtype)
    except Exception as error:  # the check's own limit (an override that does not fit the call) or a defect
        return math.nan, f'{type(error).__name__}: {short_message(error)}'
    if bias.stranded > STRANDED:
        return ratio, f'bias terms of {bias.stranded:.3g} stranded at softmax rows of zero logits'
    return ratio, ''


def added_constants(composite) -> list[tuple[str, float]]:
    """``(module path, value)`` of every non-zero number the model added to relevance in the composite's last run (a
    bias written into its code), as the engine recorded them
    (:py:attr:`~zennit_attn.canonizers.OperationCanonizer.constants`); none where it did not run."""
    engine = getattr(composite, 'operation_canonizer', None)
    return [] if engine is None else list(engine.constants)


def randomize_zero_weights(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Draw every floating-point weight that is zero throughout, or negligible (every entry at most
    :py:data:`NEGLIGIBLE`: an initialisation of zeros, as Gemma 3's image projection, Llama 3.2 Vision's
    cross-attention gates, xLSTM's gate projections and Doge's ``A``, or of 1e-10, as the SAM towers of GOT-OCR 2 and
    DeepSeek-OCR), from a normal distribution (standard deviation 0.1), so that every path of the random model carries
    relevance (the pixels reach its output; a gate of zero inputs gives the identity rule nothing to pass, Eq. 9);
    biases and position tables are zeroed after it (:py:func:`zero_biases`)."""
    with torch.no_grad():
        for _, parameter in model.named_parameters():
            if parameter.is_floating_point() and parameter.numel() > 0 and parameter.abs().max() <= NEGLIGIBLE:
                noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
                parameter.copy_(0.1 * noise)


def zero_biases(model: torch.nn.Module) -> None:
    """Set every bias and every learned position embedding to zero (exact conservation needs no biases); not the
    weights of a convolution named as a position embedding (a conditional position encoding, FastViT's: a function
    of its input, no constant; zeroed, it cuts the pixels off)."""
    convolutions = {name for name, module in model.named_modules() if isinstance(module, torch.nn.modules.conv._ConvNd)}
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            owner, _, field = name.rpartition('.')
            position = _POSITIONS.search(name) and not (owner in convolutions and field == 'weight')
            if tensor.is_floating_point() and (_BIAS.search(field) or position):
                tensor.zero_()


def check_inputs(model: torch.nn.Module, config, mapping: str, generator: torch.Generator) -> tuple[dict, str]:
    """Token ids (and pixels for vision-language models) for a plain forward pass, and what was fed.

    A model with a vision tower (every image-text-to-text architecture, any model whose forward takes
    ``pixel_values``) gets pixels (:py:func:`~zennit_attn.workflows.architecture_check.pixels.pixel_inputs`); what was
    fed is ``'text + image'``, ``'text only: <why>'``, or ``''`` for a model without a vision tower
    (:py:attr:`Result.inputs`).
    """
    text = getattr(config, 'text_config', None) or config
    vocab = getattr(text, 'vocab_size', None) or getattr(config, 'vocab_size', 96)
    ids = torch.randint(4, min(int(vocab), 90), (1, 6), generator=generator)
    inputs = {'input_ids': ids, 'use_cache': False}
    if mapping == 'seq2seq-lm' or getattr(config, 'is_encoder_decoder', False):
        inputs['decoder_input_ids'] = torch.randint(4, min(int(vocab), 90), (1, 4), generator=generator)
    params = _forward_parameters(model)
    if mapping == 'image-text-to-text' or set(PIXEL_INPUTS) & set(params):
        return inputs, pixel_inputs(model, config, inputs, params, generator, functools.partial(_fails, model))
    return inputs, ''


def _forward_parameters(model: torch.nn.Module) -> tuple[str, ...]:
    """The names of the parameters of the model's forward (none where it has no signature)."""
    try:
        return tuple(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return ()


def _fails(model: torch.nn.Module, inputs: dict, embeddings: bool = True) -> Exception | None:
    """The exception of the plain forward (on the embeddings, as :py:func:`relevance_sum` runs it, or on the ids),
    with the model's warnings and printed messages silenced."""
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter('ignore')
            if embeddings:
                input_relevances(model, inputs, None)
            else:
                model(**inputs)
    except Exception as error:
        return error
    return None


def relevance_sum(model: torch.nn.Module, inputs: dict, composite) -> float:
    """The sum of the input relevance under ``composite`` for the relevance 1 at the explained logit."""
    return float(sum(input_relevances(model, inputs, composite)[0].values()))


def input_relevances(model: torch.nn.Module, inputs: dict, composite) -> tuple[dict[str, float], float]:
    """The input relevance under ``composite`` summed per input (``inputs_embeds``, ``pixel_values``, ...) for the
    relevance 1 at the explained logit (the largest at the last position), and that logit; nothing for no composite
    (a plain forward on the embeddings).
    """
    embeddings = model.get_input_embeddings()
    check_word_embeddings(model, embeddings)
    ids = inputs['input_ids']
    leaves, kwargs = _leaves(model, embeddings, inputs)
    # a model that needs its ids (zennit_attn.inputs.lookups) is run on them, with its lookups as leaves, as
    # explain() does
    lookups = TokenLookups(model, embeddings) if needs_ids(model, embeddings) else None
    if lookups is None:
        check_embeddings_run(model)  # as explain() does: a model it refuses on embeddings is refused here
    with contextlib.nullcontext(model) if composite is None else composite.context(model) as modified:
        if lookups is None:
            output = modified(**leaves, **kwargs)
        else:
            if composite is not None:
                lookups.record()
            others = {key: leaf for key, leaf in leaves.items() if key != 'inputs_embeds'}
            with lookups.substituting(ids, leaves['inputs_embeds']):
                output = modified(input_ids=ids, **others, **kwargs)
        if composite is None:
            return {}, math.nan
        logits = output.logits if hasattr(output, 'logits') else output[0]
        last = logits[0, -1]
        target = last[last.argmax()]
        target.backward()
    if lookups is not None:
        leaves.update({f'token table {index}': leaf for index, leaf in enumerate(lookups.recorded())})
        if lookups.own:  # the model's own tokens ahead of the ids (CPM-Ant's prompt): one tensor
            leaves['own tokens'] = lookups.own[-1]
    sums = {key: float(leaf.grad.sum()) for key, leaf in leaves.items() if leaf.grad is not None}
    return sums, float(target.detach())


def _leaves(model: torch.nn.Module, embeddings: torch.nn.Module, inputs: dict) -> tuple[dict, dict]:
    """The inputs that carry relevance, as leaves (the word embeddings of the ids, the pixels: every floating-point
    input but masks, the decoder's embeddings), and the other keyword arguments of the forward."""
    leaves = {'inputs_embeds': embeddings(inputs['input_ids']).detach().requires_grad_(True)}
    kwargs = {key: value for key, value in inputs.items() if key != 'input_ids'}
    for key, value in list(kwargs.items()):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and 'mask' not in key:
            leaves[key] = kwargs.pop(key).detach().clone().requires_grad_(True)
    if 'decoder_input_ids' in kwargs:
        decoder = decoder_word_embeddings(model) or embeddings
        leaves['decoder_inputs_embeds'] = decoder(kwargs.pop('decoder_input_ids')).detach().requires_grad_(True)
    return leaves, kwargs


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype ``dtype`` for the time of the context (put back also when it raises)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
