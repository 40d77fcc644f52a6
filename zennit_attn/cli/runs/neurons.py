"""The run step of ``zennit-attn neurons`` (:py:mod:`zennit_attn.cli.neurons`): load the model, explain with latent
relevance at the site, print the relevance per layer and the top units."""

from __future__ import annotations

import argparse
import time

from ...explain import encode_texts, explain
from ...latent import Neuron, top_neurons, vocabulary_projection
from ...results.render.tokens import token_texts
from ..errors import CommandError
from ..loading import load, make_composite
from ..printing import decode, method_label, shorten
from ..progress import status

__all__ = ['run']


def run(args: argparse.Namespace) -> int:
    """Run ``neurons`` with arguments checked by :py:func:`zennit_attn.cli.neurons.check`; returns the exit status."""
    model, tokenizer = load(args, need_tokenizer_first=args.target is not None)
    start = time.perf_counter()
    with status(f'explaining with {args.method} and recording the {args.site} site', not args.quiet):
        encoding = encode_texts(tokenizer, args.text).to(args.device)
        explanation = explain(
            model,
            encoding,
            target=args.target,
            method=args.method,
            composite=make_composite(args.composite),
            tokenizer=tokenizer,
            latent=(args.site,),
            latent_reduce='sum',
            **args.params,
        )
    seconds = time.perf_counter() - start
    relevance = explanation.latent[args.site][0]  # [layers, units], summed over positions
    if args.layers is not None and max(args.layers) >= relevance.shape[0]:
        raise CommandError(f'--layers: the model has {relevance.shape[0]} layers (0 to {relevance.shape[0] - 1})')
    target = int(explanation.target.reshape(-1)[0])
    logit = float(explanation.logit.reshape(-1)[0])
    unit = {'mlp': 'FFN neuron', 'attention': 'head'}.get(args.site, f'{args.site} feature')

    print(f'Model:       {args.model_spec.label}')
    print(f'Prompt:      {shorten(args.text)!r} ({int(explanation.input_ids.shape[-1])} tokens)')
    print(f'Explained:   {decode(tokenizer, target)!r} (token id {target}, logit {logit:.3f})')
    print(f'Method:      {method_label(args)} ({seconds:.2f} s)')
    print()
    print(f'Relevance of the {args.site} site per layer (sum over its {relevance.shape[1]} {unit}s and all positions):')
    per_layer = relevance.sum(-1).tolist()
    largest = max(max(abs(value) for value in per_layer), 1e-12)
    for layer, value in enumerate(per_layer):
        bar = ('+' if value >= 0 else '-') * round(30 * abs(value) / largest)
        print(f'  layer {layer:>3}  {value:+10.4f}  {bar}')
    ranked = top_neurons(explanation, k=args.top, site=args.site, absolute=args.absolute, layers=args.layers)
    where = (
        ''
        if args.layers is None
        else f' of layers {args.layers[0]}-{args.layers[-1]}'
        if args.layers == list(range(args.layers[0], args.layers[-1] + 1))
        else f' of layers {args.layers}'
    )
    print()
    print(
        f'Top-{len(ranked)} {unit}s{where} by {"absolute " if args.absolute else ""}relevance '
        f'(activation summed over positions):'
    )
    show_vocabulary = args.site == 'mlp' and args.vocabulary > 0
    for rank, item in enumerate(ranked, start=1):
        line = (
            f'  {rank:>3}. layer {item.layer:>3}  {unit} {item.index:>6}  relevance {item.relevance:+.4f}  '
            f'activation {item.activation:+.3f}'
        )
        if show_vocabulary:
            projection = vocabulary_projection(model, Neuron('mlp', item.layer, item.index), k=args.vocabulary)
            # the down projection's column times the activation: a negative activation promotes the bottom tokens
            promoted = projection.top if item.activation >= 0 else projection.bottom
            texts = token_texts(tokenizer, [token for token, _, _ in promoted])
            line += '  promotes ' + ', '.join(repr(text) for text in texts)
        print(line)
    return 0
