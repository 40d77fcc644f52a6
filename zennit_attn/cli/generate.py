"""``zennit-attn generate``: generate an answer and explain it (terminal heatmap, interactive HTML page)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..generation import explain_generation
from .checks import check_common, make_composite, parse_contrast
from .errors import PROG, UsageError
from .explain import check_images, read_images
from .models import load, load_multimodal
from .options import (Formatter, add_contrast_option, add_debug, add_image_option, add_method_options,
                      add_model_options, add_output_options, add_prompt_options)
from .progress import status
from .printing import color_choice, decode, legend, method_label, shorten

__all__ = ['NAME', 'DESCRIPTION', 'EPILOG', 'add_parser', 'check', 'run']

NAME = 'generate'

DESCRIPTION = '''\
Generate an answer and explain it: which tokens each generated token, and the whole answer, relied on.

Loads the model, generates up to N tokens greedily after the prompt, explains every generated token over the prefix
it was generated from (one explanation each) and the whole answer, the sum of the generated tokens' logits, in one
more backward pass. Prints the answer and the heatmap of the whole answer over prompt and answer. With --output
it writes an interactive HTML page (click or hover a generated token to see its own heatmap), or the heatmap of
the whole answer as .png, .svg, .pdf or .tex. With --image a vision-language model answers the prompt about the
images, and the pixels are explained too (the overlay of each image is drawn beside the answer).'''

EPILOG = '''\
examples:
  zennit-attn generate --prompt "The capital of France is" --max-new-tokens 5 --output answer.html
  zennit-attn generate --input question.txt --max-new-tokens 40 --composite cplrp --output answer.html
  zennit-attn generate --prompt "2 + 2 =" --max-new-tokens 3 --words --output answer.pdf
  zennit-attn generate --prompt "The capital of France is" --max-new-tokens 5 --contrast runner-up
  zennit-attn generate --model ./llava --prompt "<image>What is this? It is" --image bear.png --output bear.html

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded).'''


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``generate`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME, help='generate an answer and explain it (terminal heatmap, HTML file)',
        description=DESCRIPTION, epilog=EPILOG, formatter_class=Formatter)
    add_prompt_options(parser, 'to answer')
    group = parser.add_argument_group('generation')
    group.add_argument('--max-new-tokens', type=int, default=20, metavar='N',
                       help='generate at most N tokens; generation stops earlier at the end-of-sequence token '
                            '(default: %(default)s)')
    add_contrast_option(group, 'each generated token')
    add_image_option(parser)
    add_method_options(parser)
    add_model_options(parser)
    add_output_options(parser, None)
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`)."""
    if args.max_new_tokens < 1:
        raise UsageError(f'--max-new-tokens must be at least 1, got {args.max_new_tokens}')
    args.contrast = parse_contrast(args.contrast)
    check_common(args)
    check_images(args)


def run(args: argparse.Namespace) -> int:
    """Run ``generate`` with checked arguments; returns the exit status."""
    images = {}
    if args.images:
        with status('loading the model and its processor', not args.quiet):
            model, processor = load_multimodal(args.model_spec, args.dtype, args.torch_device)
        tokenizer, images = processor.tokenizer, {'images': read_images(args.images)}
    else:
        model, tokenizer = load(args, need_tokenizer_first=args.contrast is not None)
        processor = tokenizer
    start = time.perf_counter()
    if not args.quiet:  # then a progress bar over the explanations
        print(f'{PROG}: generating up to {args.max_new_tokens} tokens and explaining each with {args.method}',
              file=sys.stderr, flush=True)
    generation = explain_generation(model, processor, args.text, max_new_tokens=args.max_new_tokens,
                                    method=args.method, composite=make_composite(args.composite),
                                    progress=not args.quiet, contrast=args.contrast, **images, **args.params)
    seconds = time.perf_counter() - start
    generated = int(generation.target.shape[0])

    print(f'Model:       {args.model_spec.label}')
    with_images = f' with {len(images["images"])} image(s)' if images else ''
    print(f'Prompt:      {shorten(args.text)!r} ({int(generation.prompt_length)} tokens){with_images}')
    print(f'Answer:      {generation.answer()!r} ({generated} tokens)')
    if images:
        print(f'Relevance:   text {float(generation.answer_relevance.sum()):+.4f} + images '
              f'{generation.image_relevance():+.4f} for the sum of the logits, {float(generation.logit.sum()):.4f}')
    print(f'Method:      {method_label(args)} ({seconds:.2f} s for generating and {generated + 1} explanations)')
    versus = ''
    if generation.contrast is not None:
        versus = ' rather than the contrast tokens'
        shown = ', '.join(repr(decode(tokenizer, int(token))) for token in generation.contrast[:8])
        print(f'Contrast:    {shown}{", ..." if generated > 8 else ""} (--contrast: the logit differences are '
              'explained)')
    print()
    unit = 'word' if args.words else 'token'
    print(f'Relevance of each {unit} for the whole answer{versus}{legend(args.color)}:')
    generation.show(words=args.words, color=color_choice(args.color))
    if args.output is not None:
        path = Path(generation.save(args.output, words=args.words)).resolve()
        print()
        what = 'the interactive page (click a generated token for its heatmap)' if path.suffix.lower() == '.html' \
            else 'the heatmap of the whole answer'
        print(f'Wrote {what} to {path}')
    return 0
