"""Which architectures of the installed transformers zennit-attn explains: the zoo walk.

:py:func:`walk` builds every architecture of some of transformers' auto mappings (causal LM, image-text-to-text,
masked LM, sequence-to-sequence LM) from a tiny random configuration (:py:func:`tiny_config`: the config class's
defaults with every size shrunk), in float64, with every bias and learned position embedding set to zero, and
checks each one:

- ``explained``: CP-LRP's relevance at the inputs (every modality: text embeddings and pixels) sums to the explained
  logit within ``1e-6`` (exact conservation, which a missed non-linearity breaks), and AttnLRP runs to finite
  relevance;
- ``refused``: the composite raised :py:class:`~zennit_attn.module_kinds.UnsupportedModelError` (the reason is
  recorded);
- ``not built``: the tiny configuration does not build or run a plain forward pass (a limit of the walk, not of
  the library);
- ``failed``: anything else (a conservation error, another exception): a defect.

``python -m zennit_attn.zoo docs/supported-models.md`` writes the page of the documentation from it.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import math
import re
import sys
import time
import warnings
from typing import Iterable

import torch
import transformers
from tqdm.auto import tqdm

from .canonizers import GeneralCanonizer, canonizers_for
from .composites import AttnLRPEpsilon, CPLRPEpsilon
from .module_kinds import UnsupportedModelError

#: The auto mappings walked: name -> transformers attribute of ``MODEL_FOR_*_MAPPING_NAMES``.
MAPPINGS = {
    'causal-lm': 'MODEL_FOR_CAUSAL_LM_MAPPING_NAMES',
    'image-text-to-text': 'MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES',
    'masked-lm': 'MODEL_FOR_MASKED_LM_MAPPING_NAMES',
    'seq2seq-lm': 'MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES',
}
STATUSES = ('explained', 'refused', 'not built', 'failed')

#: Integer configuration fields and their tiny values (only fields that exist are set).
_SIZES = {
    'hidden_size': 32, 'd_model': 32, 'n_embd': 32, 'n_embed': 32, 'dim': 32, 'embed_dim': 32, 'model_dim': 32,
    'intermediate_size': 48, 'ffn_dim': 48, 'd_ff': 48, 'n_inner': 48, 'hidden_dim': 48, 'encoder_ffn_dim': 48,
    'decoder_ffn_dim': 48, 'moe_intermediate_size': 16, 'shared_expert_intermediate_size': 16,
    'expert_intermediate_size': 16,
    'num_hidden_layers': 2, 'n_layer': 2, 'n_layers': 2, 'num_layers': 2, 'encoder_layers': 2, 'decoder_layers': 2,
    'num_decoder_layers': 2, 'depth': 2,
    'num_attention_heads': 4, 'n_head': 4, 'n_heads': 4, 'encoder_attention_heads': 4, 'decoder_attention_heads': 4,
    'num_heads': 4, 'num_key_value_heads': 2, 'n_kv_heads': 2, 'num_kv_heads': 2, 'head_dim': 8, 'd_kv': 8,
    'vocab_size': 96, 'num_experts': 4, 'num_local_experts': 4, 'n_routed_experts': 4, 'num_experts_per_tok': 2,
    'moe_num_experts': 4, 'num_shared_experts': 1, 'n_shared_experts': 1,
    'image_size': 32, 'patch_size': 8, 'num_channels': 3, 'projection_dim': 32, 'projector_hidden_size': 32,
    'q_lora_rank': 16, 'kv_lora_rank': 16, 'qk_rope_head_dim': 8, 'qk_nope_head_dim': 8, 'v_head_dim': 8,
    'qk_head_dim': 16, 'sliding_window': 16, 'max_window_layers': 2, 'first_k_dense_replace': 1, 'rotary_dim': 8,
    'num_global_heads': 4, 'n_group': 1, 'topk_group': 1,
}
#: Token id fields kept inside the shrunk vocabulary.
_IDS = ('pad_token_id', 'bos_token_id', 'eos_token_id', 'decoder_start_token_id', 'sep_token_id', 'cls_token_id',
        'mask_token_id', 'unk_token_id')
_SIZE_NAMES = tuple(_SIZES)


#: Names of biases, and of learned or fixed position and token-type embeddings (added to the tokens: biases too).
_BIAS = re.compile(r'bias')
_POSITIONS = re.compile(r'(^|\.)(wpe|positions_embed|pos_encoding|pos_embed|position_embeddings?|embed_positions|positional_embedding|'
                        r'token_type_embeddings|pos_emb(edding)?|embed_pos|position_embedding|abs_pos|'
                        r'type_embeddings|segment_embeddings?|language_embeddings|lang_embeddings|[xyhw]_position_embeddings|'
                        r'token_type_embeddings_\d+|class_embedding)(\.|$)')


@dataclasses.dataclass
class Result:
    """One architecture of the walk."""
    mapping: str
    architecture: str
    status: str
    reason: str = ''
    ratio: float = math.nan
    seconds: float = 0.0


def _shrink(config, depth: int = 0) -> None:
    for key, value in _SIZES.items():
        current = getattr(config, key, None)
        if isinstance(current, int) and not isinstance(current, bool) and current > value:
            with contextlib.suppress(Exception):
                setattr(config, key, value)
    vocab = getattr(config, 'vocab_size', None)
    if isinstance(vocab, int):
        for key in _IDS:
            value = getattr(config, key, None)
            if isinstance(value, int) and value >= vocab:
                with contextlib.suppress(Exception):
                    setattr(config, key, min(_IDS.index(key) + 1, vocab - 1))
    layers = getattr(config, 'num_hidden_layers', None)
    for key in ('layer_types', 'mlp_layer_types', 'block_types'):
        value = getattr(config, key, None)
        if isinstance(value, (list, tuple)) and isinstance(layers, int) and len(value) > layers:
            with contextlib.suppress(Exception):
                setattr(config, key, list(value[:layers]))
    heads = getattr(config, 'num_attention_heads', None)
    if isinstance(heads, int) and isinstance(getattr(config, 'num_key_value_heads', None), int):
        with contextlib.suppress(Exception):
            config.num_key_value_heads = min(config.num_key_value_heads, heads)
    if depth < 3:
        for key in getattr(config, 'sub_configs', {}) or {}:
            sub = getattr(config, key, None)
            if sub is not None and hasattr(sub, 'to_dict'):
                _shrink(sub, depth + 1)


def tiny_config(config_class):
    """The config class's defaults with every size shrunk (also in nested text and vision configurations)."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter('ignore')
        config = config_class()
        _shrink(config)
    return config


def _model_class(mapping: str, architecture: str):
    config_name = importlib.import_module('transformers.models.auto.configuration_auto').CONFIG_MAPPING_NAMES
    names = getattr(importlib.import_module('transformers.models.auto.modeling_auto'), MAPPINGS[mapping])
    return getattr(transformers, names[architecture]), getattr(transformers, config_name[architecture])


def zero_biases(model: torch.nn.Module) -> None:
    """Set every bias and every learned position embedding to zero (exact conservation needs no biases)."""
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if tensor.is_floating_point() and (_BIAS.search(name.rsplit('.', 1)[-1]) or _POSITIONS.search(name)):
                tensor.zero_()


def _inputs(model, config, mapping: str, generator: torch.Generator) -> dict:
    """Token ids (and pixels for vision-language models) for a plain forward pass."""
    text = getattr(config, 'text_config', None) or config
    vocab = getattr(text, 'vocab_size', None) or getattr(config, 'vocab_size', 96)
    ids = torch.randint(4, min(int(vocab), 90), (1, 6), generator=generator)
    inputs = {'input_ids': ids, 'use_cache': False}
    if mapping == 'seq2seq-lm' or getattr(config, 'is_encoder_decoder', False):
        inputs['decoder_input_ids'] = torch.randint(4, min(int(vocab), 90), (1, 4), generator=generator)
    return inputs


def _explain(model, inputs: dict, composite) -> float:
    """The sum of the input relevance under ``composite`` for the relevance 1 at the explained logit."""
    embeddings = model.get_input_embeddings()
    leaves = {'inputs_embeds': embeddings(inputs['input_ids']).detach().requires_grad_(True)}
    kwargs = {key: value for key, value in inputs.items() if key != 'input_ids'}
    if 'decoder_input_ids' in kwargs:
        decoder = model.get_decoder().get_input_embeddings() if hasattr(model, 'get_decoder') else embeddings
        leaves['decoder_inputs_embeds'] = decoder(kwargs.pop('decoder_input_ids')).detach().requires_grad_(True)
    with (contextlib.nullcontext(model) if composite is None else composite.context(model)) as modified:
        output = modified(**leaves, **kwargs)
        if composite is None:
            return 0.0
        logits = output.logits if hasattr(output, 'logits') else output[0]
        last = logits[0, -1]
        last[last.argmax()].backward()
    return float(sum(leaf.grad.sum() for leaf in leaves.values() if leaf.grad is not None))


def check(mapping: str, architecture: str, seed: int = 0) -> Result:
    """Build one architecture from a tiny configuration and check it (see the module's description)."""
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    try:
        model_class, config_class = _model_class(mapping, architecture)
        config = tiny_config(config_class)
        with contextlib.suppress(Exception):
            config._experts_implementation = 'eager'
        torch.manual_seed(seed)
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter('ignore')
            model = model_class(config).to(torch.float64).eval()
            zero_biases(model)
            inputs = _inputs(model, config, mapping, generator)
    except Exception as error:  # a limit of the walk's tiny configurations
        return Result(mapping, architecture, 'not built', _short(error), seconds=time.perf_counter() - start)
    try:  # the plain forward on embeddings, as explain() runs it
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter('ignore')
            _explain(model, inputs, None)
    except Exception as error:
        try:
            with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter('ignore')
                model(**inputs)
        except Exception:  # a limit of the walk's tiny configurations
            return Result(mapping, architecture, 'not built', _short(error), seconds=time.perf_counter() - start)
        return Result(mapping, architecture, 'refused', f'takes no inputs_embeds ({type(error).__name__}: '
                      f'{_short(error)[:120]}): token relevance needs the embeddings as input',
                      seconds=time.perf_counter() - start)
    canonizers = canonizers_for(model, constant_gates=True)
    constants = canonizers[0].constants if canonizers and isinstance(canonizers[0], GeneralCanonizer) else []
    try:
        ratio = _explain(model, inputs, CPLRPEpsilon(canonizers=canonizers))
        attnlrp = _explain(model, inputs, AttnLRPEpsilon())
    except UnsupportedModelError as error:
        return Result(mapping, architecture, 'refused', _short(error), seconds=time.perf_counter() - start)
    except Exception as error:
        return Result(mapping, architecture, 'failed', f'{type(error).__name__}: {_short(error)}',
                      seconds=time.perf_counter() - start)
    exact = abs(ratio - 1) <= 1e-6 and math.isfinite(attnlrp)
    reason = '' if exact else f'CP-LRP relevance / logit = {ratio:.6g}, AttnLRP sum {attnlrp:.4g}'
    if not exact and constants and math.isfinite(attnlrp):
        path, value = constants[0]
        # a constant in the model's code is a bias that cannot be zeroed: conservation cannot be exact
        return Result(mapping, architecture, 'explained', f'not exactly conservative by design: the model adds the '
                      f'constant {value:g} at {path!r} ({reason})', ratio, time.perf_counter() - start)
    return Result(mapping, architecture, 'explained' if exact else 'failed', reason, ratio,
                  time.perf_counter() - start)


def _short(error: BaseException) -> str:
    return ' '.join(str(error).split())[:400]


def architectures(mapping: str) -> list[str]:
    """The architectures (model types) of one mapping of the installed transformers, sorted."""
    names = getattr(importlib.import_module('transformers.models.auto.modeling_auto'), MAPPINGS[mapping])
    return sorted(names)


def walk(mappings: Iterable[str] = tuple(MAPPINGS), progress: bool = True) -> list[Result]:
    """Check every architecture of ``mappings`` (see :py:func:`check`)."""
    jobs = [(mapping, name) for mapping in mappings for name in architectures(mapping)]
    return [check(mapping, name) for mapping, name in tqdm(jobs, disable=not progress, desc='zoo')]


def counts(results: Iterable[Result]) -> dict[str, dict[str, int]]:
    """``{mapping: {status: count}}``."""
    table: dict[str, dict[str, int]] = {}
    for result in results:
        table.setdefault(result.mapping, dict.fromkeys(STATUSES, 0))[result.status] += 1
    return table


def page(results: list[Result]) -> str:
    """The supported-models page (Markdown): counts per mapping, then one table row per architecture."""
    version = transformers.__version__
    lines = [
        '# Supported models', '',
        f'Generated by `python -m zennit_attn.zoo docs/supported-models.md` with transformers {version}: every',
        'architecture of four auto mappings built from a tiny random configuration and checked in float64 with every',
        'bias and learned position embedding set to zero (see {py:mod}`zennit_attn.zoo`). *explained*: CP-LRP\'s',
        'relevance at the inputs sums to the explained logit within 1e-6 and AttnLRP runs; *refused*: zennit-attn',
        'raises `UnsupportedModelError` with the reason shown; *not built*: the tiny configuration did not build or',
        'run a plain forward pass (a limit of the walk, not of the library); *failed*: a defect, to be fixed.', '',
        '| mapping | explained | refused | not built | failed | explained of built |',
        '|---|---|---|---|---|---|',
    ]
    for mapping, row in counts(results).items():
        built = row['explained'] + row['refused'] + row['failed']
        share = f'{100 * row["explained"] / built:.0f}%' if built else '-'
        lines.append(f'| {mapping} | {row["explained"]} | {row["refused"]} | {row["not built"]} | {row["failed"]} '
                     f'| {share} |')
    for mapping in dict.fromkeys(result.mapping for result in results):
        lines += ['', f'## {mapping}', '', '| architecture | status | note |', '|---|---|---|']
        for result in results:
            if result.mapping == mapping:
                note = result.reason.replace('|', '\\|')
                lines.append(f'| `{result.architecture}` | {result.status} | {note} |')
    return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m zennit_attn.zoo', description=__doc__.split('\n\n')[0])
    parser.add_argument('output', nargs='?', help='write the supported-models page (Markdown) here')
    parser.add_argument('--mapping', action='append', choices=sorted(MAPPINGS), help='walk only these mappings')
    args = parser.parse_args(argv)
    results = walk(args.mapping or tuple(MAPPINGS))
    for mapping, row in counts(results).items():
        print(mapping, row)
    for result in results:
        if result.status == 'failed':
            print(f'FAILED {result.mapping} {result.architecture}: {result.reason}', file=sys.stderr)
    if args.output:
        with open(args.output, 'w', encoding='utf-8') as file:
            file.write(page(results))
        print(f'wrote {args.output}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
