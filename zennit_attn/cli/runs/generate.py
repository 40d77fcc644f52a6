"""The run step of ``zennit-attn generate`` (:py:mod:`zennit_attn.cli.generate`): load the model, generate and explain
the answer, print it with its heatmap, write the page or the heatmap file."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ...workflows.generation import explain_generation
from ..errors import PROG
from ..loading import load, load_multimodal, make_composite, read_images
from ..printing import color_choice, decode, legend, method_label, shorten
from ..progress import status

__all__ = ['run']


def run(args: argparse.Namespace) -> int:
    """Run ``generate`` with arguments checked by :py:func:`zennit_attn.cli.generate.check`; returns the exit
    status."""
    images = {}
    if args.images:
        with status('loading the model and its processor', not args.quiet):
            model, processor = load_multimodal(args.model_spec, args.dtype, args.device)
        tokenizer, images = processor.tokenizer, {'images': read_images(args.images)}
    else:
        model, tokenizer = load(args, need_tokenizer_first=args.contrast is not None)
        processor = tokenizer
    start = time.perf_counter()
    if not args.quiet:  # then a progress bar over the explanations
        print(
            f'{PROG}: generating up to {args.max_new_tokens} tokens and explaining each with {args.method}',
            file=sys.stderr,
            flush=True,
        )
    generation = explain_generation(
        model,
        processor,
        args.text,
        max_new_tokens=args.max_new_tokens,
        method=args.method,
        composite=make_composite(args.composite),
        progress=not args.quiet,
        contrast=args.contrast,
        **images,
        **args.params,
    )
    seconds = time.perf_counter() - start
    generated = int(generation.target.shape[0])

    print(f'Model:       {args.model_spec.label}')
    with_images = f' with {len(images["images"])} image(s)' if images else ''
    print(f'Prompt:      {shorten(args.text)!r} ({int(generation.prompt_length)} tokens){with_images}')
    print(f'Answer:      {generation.answer()!r} ({generated} tokens)')
    if images:
        print(
            f'Relevance:   text {float(generation.answer_relevance.sum()):+.4f} + images '
            f'{generation.image_relevance():+.4f} for the sum of the logits, {float(generation.logit.sum()):.4f}'
        )
    print(f'Method:      {method_label(args)} ({seconds:.2f} s for generating and {generated + 1} explanations)')
    versus = ''
    if generation.contrast is not None:
        versus = ' rather than the contrast tokens'
        shown = ', '.join(repr(decode(tokenizer, int(token))) for token in generation.contrast[:8])
        print(
            f'Contrast:    {shown}{", ..." if generated > 8 else ""} (--contrast: the logit differences are explained)'
        )
    pairs = generation.position_relevance is not None
    if pairs:  # PA-LRP: each token shown (and written) with its position
        print(
            f'Positions:   {float(generation.answer_position_relevance.sum()):+.4f} to the positions, '
            f'{float(generation.answer_relevance.sum()):+.4f} to the tokens (PA-LRP: the heatmaps and --output show '
            'each token with its position)'
        )
        generation = generation.with_positions()
    print()
    unit = ('word' if args.words else 'token') + (' with its position' if pairs else '')
    print(f'Relevance of each {unit} for the whole answer{versus}{legend(args.color)}:')
    generation.show(words=args.words, color=color_choice(args.color))
    if args.output is not None:
        path = Path(generation.save(args.output, words=args.words)).resolve()
        print()
        what = (
            'the interactive page (click a generated token for its heatmap)'
            if path.suffix.lower() == '.html'
            else 'the heatmap of the whole answer'
        )
        print(f'Wrote {what} to {path}')
    return 0
