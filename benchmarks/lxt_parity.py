"""Relevance parity with the authors' AttnLRP code (LXT, efficient mode): the same model, the same input, the same
explained logit; does zennit-attn give the relevance LXT gives?

LXT's efficient mode (``lxt.efficient.monkey_patch``; github rachtibat/LRP-eXplains-Transformers, not a dependency of
zennit-attn) replaces, process-wide, the forward methods of the classes of a transformers module it has a map for
(Llama, Qwen2, Qwen3, Qwen3-MoE, Gemma 3, GPT-2) and the attention functions of that module: the identity rule on the
MLP's activation and the normalisations (their normaliser a constant), the uniform rule on the gate product and on
the attention's two matrix products (the gradient at the queries and keys divided by 4, at the values by 2), the plain
gradient everywhere else (the linear layers, the softmax: its Taylor rule with bias in the gradient x input form).
Relevance is ``(embeddings * gradient).sum(-1)`` at the input embeddings. zennit-attn's ``AttnLRPEpsilon()`` (its
default ``epsilon=0``: gradient x input on the linear layers, as LXT) should give the same numbers, up to rounding.
``--methods cplrp``: LXT's CP-LRP maps (no gradient through the queries and keys, the MLP's gate a constant) against
``CPLRPEpsilon()``.

The patch is applied and undone around each of LXT's calls (:py:class:`lxt_speed.Patched`: the attributes of the
patched classes and module, kept in both states), so that both run in one process on one model; zennit-attn's call
runs on the original classes.

Models (:py:data:`TINY`): tiny random models of each architecture LXT has a map for, built from configurations in
float64 (seeded; biases as the architecture has them; the zero-initialised weights drawn at random), torchvision's
vision transformer as LXT's ViT example explains it (``torchvision_vit``: CP-LRP and zennit's gamma rules,
:py:func:`vision_transformer`), and the real SmolLM2-135M-Instruct (:py:func:`zennit_attn.pretrained.load_smollm2`, cast
to float64) on the leads of Wikipedia articles (``--articles``, ``--tokens``). Reported per model: the largest
difference as a share of the largest relevance (over the models' inputs), the smallest cosine between the two relevance
vectors, the relevance sums over the logit (the share each keeps: AttnLRP's softmax rule hands part of it to the
softmax's bias); a model or method LXT has no map for is named and left out.

Usage (LXT importable, e.g. its checkout on ``PYTHONPATH``; 1 thread)::

    python benchmarks/lxt_parity.py --threads 1
    python benchmarks/lxt_parity.py --threads 1 --articles 20 --tokens 64 --out docs/results/lxt_parity.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import transformers
from faithfulness import sample_articles
from lxt.efficient import models as lxt_models
from lxt.efficient import monkey_patch
from lxt_speed import VIT_GAMMAS, Patched, vit_patch
from torchvision.models.vision_transformer import VisionTransformer
from tqdm import tqdm
from zennit.composites import LayerMapComposite
from zennit.rules import Gamma

from zennit_attn import explain
from zennit_attn.composites import AttnLRPEpsilon, CPLRPEpsilon, CPLRPGamma
from zennit_attn.pretrained import load_smollm2

#: the tiny configurations: architecture -> (model class, configuration arguments); 2 layers, width 64, grouped
#: keys and values where the architecture has them
SHAPE = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=128,
)
TINY = {
    'llama': ('LlamaForCausalLM', SHAPE),
    'qwen2': ('Qwen2ForCausalLM', SHAPE),
    'qwen3': ('Qwen3ForCausalLM', dict(SHAPE, head_dim=16)),
    'qwen3_moe': (
        'Qwen3MoeForCausalLM',
        dict(SHAPE, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    ),
    'gemma3_text': ('Gemma3ForCausalLM', dict(SHAPE, head_dim=16, sliding_window=4, layer_types=None)),
    'gpt2': ('GPT2LMHeadModel', dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=128)),
}
#: tokens of the random inputs of the tiny models
TINY_TOKENS = 12
#: the tiny torchvision vision transformer
VIT_SHAPE = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10)
#: the methods compared: name -> (the attribute of LXT's map in its model modules, zennit-attn's composite)
METHODS = {'attnlrp': ('attnLRP', AttnLRPEpsilon), 'cplrp': ('cp_LRP', CPLRPEpsilon)}


@dataclass
class Parity:
    """One model's comparison, over its inputs."""

    model: str
    method: str
    inputs: int
    largest_difference: float  # of the largest |relevance|, the worst input
    smallest_cosine: float
    lxt_share: tuple[float, float]  # relevance sum / logit, smallest and largest over the inputs
    ours_share: tuple[float, float]
    seconds: float

    def row(self) -> str:
        return (
            f'| {self.model} | {self.method} | {self.inputs} | {self.largest_difference:.1e} | '
            f'{self.smallest_cosine:.12f} | '
            f'{self.lxt_share[0]:.4f} - {self.lxt_share[1]:.4f} | {self.ours_share[0]:.4f} - {self.ours_share[1]:.4f} '
            f'| {self.seconds:.1f} |'
        )


def lxt_map(module: types.ModuleType, method: str) -> dict | None:
    """LXT's efficient map of ``method`` (:py:data:`METHODS`) for the transformers module ``module`` (the map of
    LXT's model module whose AttnLRP map is ``module``'s default), None where LXT has none (CP-LRP for Qwen3-MoE)."""
    default = lxt_models.DEFAULT_MAP.get(module)
    if default is None:
        raise ValueError(f'LXT has no efficient map for {module.__name__}')
    owners = [owner for owner in vars(lxt_models).values() if getattr(owner, 'attnLRP', None) is default]
    return getattr(owners[0], METHODS[method][0], None)


def lxt_patch(model: torch.nn.Module, method: str) -> Patched | None:
    """LXT's efficient patch of ``method`` for the transformers module of ``model``'s class, switched off: the
    attributes it replaces are every attribute of the patched classes, and the module's attention function and
    registry; None where LXT has no map of ``method`` for it."""
    module = sys.modules[type(model).__module__]
    patch_map = lxt_map(module, method)
    if patch_map is None:
        return None
    attributes = [(module, 'eager_attention_forward')]
    for target in patch_map:
        if isinstance(target, type):
            attributes += [(target, name) for name in ('forward', '_norm', 'original_forward')]
    return Patched(attributes, lambda: monkey_patch(module, patch_map), module.ALL_ATTENTION_FUNCTIONS)


class Sides(NamedTuple):
    """The three calls of one comparison, on one input: the explained class or token (``predict``), LXT's relevance
    and logit, zennit-attn's relevance and logit (both ``(input, target) -> (relevance, logit)``)."""

    predict: Callable
    lxt: Callable
    ours: Callable


def language_model(model, method: str) -> Sides | None:
    """The calls for a causal language model: the argmax logit at the last position; LXT's relevance as its
    documentation computes it (the input embeddings as the leaf, the backward of the logit, ``(embeddings *
    gradient).sum(-1)``) under its patch of ``method``; zennit-attn's with the composite of ``method``. None where LXT
    has no map of ``method`` for the model."""
    patch = lxt_patch(model, method)
    if patch is None:
        return None

    def predict(input_ids):
        with torch.no_grad():
            return int(model(input_ids=input_ids, use_cache=False).logits[0, -1].argmax())

    def lxt(input_ids, target):
        patch.apply(True)
        try:
            embeddings = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
            logit = model(inputs_embeds=embeddings, use_cache=False).logits[0, -1, target]
            (gradient,) = torch.autograd.grad(logit, embeddings)
        finally:
            patch.apply(False)
        return (embeddings * gradient).sum(-1)[0].detach(), logit.item()

    def ours(input_ids, target):
        explanation = explain(model, input_ids, target=target, composite=METHODS[method][1]())
        return explanation.relevance[0].detach(), explanation.logit.item()

    return Sides(predict, lxt, ours)


def vision_transformer(model, method: str) -> Sides | None:
    """The calls for torchvision's vision transformer, as LXT's example explains it (``lxt_speed.vit_patch``: CP-LRP
    in the attention, its only map for the ViT, and zennit's ``Gamma`` on the linear layers and the patch convolution,
    :py:data:`lxt_speed.VIT_GAMMAS`, in the gradient x input form LXT patches into zennit) against
    ``CPLRPGamma`` with the same gammas. torchvision's ``MultiheadAttention`` computes its projections with
    ``F.linear`` on its own parameters, so zennit's rules of linear layers do not reach them under LXT:
    ``attention_in=None, attention_out=None`` (the plain gradient there) is the same choice. The argmax class; the
    relevance at the pixels, summed over the channels. None for AttnLRP (LXT has no AttnLRP map for it)."""
    if method != 'cplrp':
        return None
    patch = vit_patch()
    rules = [(torch.nn.Conv2d, Gamma(VIT_GAMMAS['conv'])), (torch.nn.Linear, Gamma(VIT_GAMMAS['linear']))]

    def predict(pixels):
        with torch.no_grad():
            return int(model(pixels)[0].argmax())

    def lxt(pixels, target):
        patch.apply(True)
        try:
            leaf = pixels.detach().requires_grad_(True)
            with LayerMapComposite(rules).context(model) as modified:
                logit = modified(leaf)[0, target]
                (gradient,) = torch.autograd.grad(logit, leaf)
        finally:
            patch.apply(False)
        return (leaf * gradient).sum(1)[0].flatten().detach(), logit.item()

    def ours(pixels, target):
        composite = CPLRPGamma(
            conv=Gamma(VIT_GAMMAS['conv']), linear=Gamma(VIT_GAMMAS['linear']), attention_in=None, attention_out=None
        )
        explanation = explain(model, pixels, target=target, composite=composite)
        return explanation.relevance[0].flatten().detach(), explanation.logit.item()

    return Sides(predict, lxt, ours)


def compare(name: str, method: str, sides: Sides, inputs: list[torch.Tensor]) -> Parity:
    """Both relevances (``method``) of the predicted logit of each input of ``inputs``."""
    start = time.perf_counter()
    differences, cosines, lxt_shares, our_shares = [], [], [], []
    for item in tqdm(inputs, desc=f'{name} {method}', leave=False):
        target = sides.predict(item)
        reference, lxt_logit = sides.lxt(item, target)
        relevance, logit = sides.ours(item, target)
        if abs(logit - lxt_logit) > 1e-9 * max(1.0, abs(logit)):
            raise RuntimeError(f'{name}: the explained logits differ ({logit} against LXT {lxt_logit})')
        differences.append(((relevance - reference).abs().max() / reference.abs().max()).item())
        cosines.append(torch.nn.functional.cosine_similarity(relevance, reference, dim=0).item())
        lxt_shares.append(reference.sum().item() / logit)
        our_shares.append(relevance.sum().item() / logit)
    return Parity(
        name,
        method,
        len(inputs),
        max(differences),
        min(cosines),
        (min(lxt_shares), max(lxt_shares)),
        (min(our_shares), max(our_shares)),
        time.perf_counter() - start,
    )


def tiny(architecture: str, inputs: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """The tiny random model of ``architecture`` (:py:data:`TINY`) in float64, every weight that its initialisation
    leaves at zero drawn at random, and ``inputs`` seeded random inputs of :py:data:`TINY_TOKENS` tokens."""
    class_name, shape = TINY[architecture]
    model_class = getattr(transformers, class_name)
    config = model_class.config_class(**shape, attn_implementation='eager')
    torch.manual_seed(0)
    model = model_class(config).double().eval()
    if getattr(config, '_experts_implementation', None) is not None:  # grouped kernels take no float64: the loop
        config._experts_implementation = 'eager'
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.any():
                parameter.normal_(0, 0.1)
    generator = torch.Generator().manual_seed(1)
    vocabulary = model.get_input_embeddings().num_embeddings
    return model, [torch.randint(3, vocabulary, (1, TINY_TOKENS), generator=generator) for _ in range(inputs)]


def tiny_vit(inputs: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """torchvision's vision transformer, tiny (:py:data:`VIT_SHAPE`), in float64, its zero-initialised weights (the
    class token, the head) drawn at random, and ``inputs`` seeded random images."""
    torch.manual_seed(0)
    model = VisionTransformer(**VIT_SHAPE).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.any():
                parameter.normal_(0, 0.1)
    generator = torch.Generator().manual_seed(1)
    size = VIT_SHAPE['image_size']
    return model, [torch.randn(1, 3, size, size, generator=generator, dtype=torch.float64) for _ in range(inputs)]


def smollm2(articles: int, tokens: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """SmolLM2-135M-Instruct in float64 (eager attention; LXT wraps every attention function of transformers'
    registry alike) and the first ``tokens`` tokens of ``articles`` Wikipedia leads, sampled as the faithfulness
    benchmark samples them (``benchmarks/faithfulness.py``, seed 0)."""
    model, tokenizer = load_smollm2(dtype=torch.float64, attn_implementation='eager')
    chosen = sample_articles(None, tokenizer, articles, tokens, seed=0)
    return model, [torch.tensor([ids]) for _, ids in chosen]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--models', nargs='+', default=[*TINY, 'torchvision_vit', 'smollm2'])
    parser.add_argument('--methods', nargs='+', choices=list(METHODS), default=list(METHODS))
    parser.add_argument('--inputs', type=int, default=5, help='random inputs per tiny model')
    parser.add_argument('--articles', type=int, default=10, help='Wikipedia leads for SmolLM2')
    parser.add_argument('--tokens', type=int, default=32, help='tokens of each lead')
    parser.add_argument('--threads', type=int, default=None)
    parser.add_argument('--out', type=Path, default=None, help='write the table as Markdown')
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()
    start = time.perf_counter()
    rows = []
    for name in args.models:
        if name == 'smollm2':
            model, inputs = smollm2(args.articles, args.tokens)
        elif name == 'torchvision_vit':
            model, inputs = tiny_vit(args.inputs)
        else:
            model, inputs = tiny(name, args.inputs)
        for method in args.methods:
            sides = (vision_transformer if name == 'torchvision_vit' else language_model)(model, method)
            if sides is None:
                print(f'LXT has no {method} map for {name}', flush=True)
                continue
            parity = compare(name, method, sides, inputs)
            rows.append(parity)
            print(json.dumps(vars(parity)), flush=True)
    lines = [
        '| model | method | inputs | largest difference (of the largest relevance) | smallest cosine | LXT sum / logit '
        '| zennit-attn sum / logit | seconds |',
        '|---|---|---|---|---|---|---|---|',
        *(parity.row() for parity in rows),
        '',
        f'Command: `python benchmarks/lxt_parity.py {" ".join(argv if argv is not None else sys.argv[1:])}`; '
        f'torch {torch.__version__}, transformers {transformers.__version__}; wall time '
        f'{time.perf_counter() - start:.0f} s; load average (1, 5, 15 min) {", ".join(f"{v:.2f}" for v in load)} at '
        f'the start, {", ".join(f"{v:.2f}" for v in os.getloadavg())} at the end.',
    ]
    print('\n'.join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text('\n'.join(lines) + '\n')


if __name__ == '__main__':
    sys.exit(main())
