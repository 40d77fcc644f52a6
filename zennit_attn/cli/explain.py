"""``zennit-attn explain``: explain a language model's next-token prediction (terminal heatmap, top tokens, a
heatmap file)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..explain import encode_texts, explain
from .checks import check_common, make_composite, parse_contrast, parse_target
from .errors import CommandError, UsageError
from .models import load, load_multimodal, resolve_target
from .options import (Formatter, add_contrast_option, add_debug, add_image_option, add_method_options,
                      add_model_options, add_output_options, add_prompt_options, add_target_option, methods_manual)
from .printing import color_choice, decode, legend, method_label, shorten
from .progress import status

__all__ = ['NAME', 'DESCRIPTION', 'EPILOG', 'add_parser', 'check', 'check_images', 'read_images', 'run',
           'explain_and_show', 'explain_images', 'write_heatmap', 'prediction']

NAME = 'explain'

DESCRIPTION = '''\
Explain a language model's next-token prediction: which input tokens it relied on.

Loads the model, runs the attribution METHOD (default AttnLRP, Achtibat et al., ICML 2024: one forward and one
backward pass) for the logit of TARGET (default: the predicted next token) at the end of the text, and prints the
prediction (token, id, logit), the explained token, a heatmap of the input tokens (red: for, blue: against) and the
most relevant tokens. With --output it also writes the heatmap as a file.'''

EPILOG = '''\
methods and their --param hyperparameters (with defaults):
{methods}

examples:
  zennit-attn explain --prompt "The Eiffel Tower is located in the city of" --output paris.html
  zennit-attn explain --input article.txt --target " London" --method cplrp
  zennit-attn explain --prompt "The Eiffel Tower is located in the city of" --target " Paris" --contrast " London"
  zennit-attn explain --prompt "2 + 2 =" --target id:220 --model ./my-llama --output why.pdf
  zennit-attn explain --prompt "Hello" --method integrated_gradients --param steps=50
  zennit-attn explain --model ./llava --prompt "<image>A photo of" --image cat.png --output cat.html
  zennit-attn explain --model ./clip --prompt "a photo of a cat" --image cat.png --method cplrp

exit status: 0 done, 1 the run failed, 2 a bad argument (reported before the model is loaded).'''


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``explain`` command to ``subparsers``; returns its parser."""
    parser = subparsers.add_parser(
        NAME, help="explain a model's next-token prediction (terminal heatmap, HTML/PNG/SVG/PDF/LaTeX file)",
        description=DESCRIPTION, epilog=EPILOG.format(methods=methods_manual()), formatter_class=Formatter)
    add_prompt_options(parser, 'whose next token is explained')
    group = parser.add_argument_group('target')
    add_target_option(group)
    add_contrast_option(group)
    group.add_argument('--top', type=int, default=5, metavar='K',
                       help='list the K most relevant input tokens; 0: none (default: %(default)s)')
    add_image_option(parser, " or an image-text model (CLIP: the prompt's similarity to the image is explained)")
    add_method_options(parser)
    add_model_options(parser)
    add_output_options(parser, None)
    add_debug(parser)
    parser.set_defaults(run=run, check=check)
    return parser


def check(args: argparse.Namespace) -> None:
    """Check the arguments before anything is loaded (:py:class:`~zennit_attn.cli.errors.UsageError`)."""
    if args.top < 0:
        raise UsageError(f'--top must be 0 or more, got {args.top}')
    args.target = parse_target(args.target)
    args.contrast = parse_contrast(args.contrast)
    check_common(args)
    check_images(args)


def check_images(args: argparse.Namespace) -> None:
    """Check ``--image`` (:py:func:`~zennit_attn.cli.options.add_image_option`): files, a model folder, no
    ``--contrast``."""
    for path in args.images or ():
        if not Path(path).is_file():
            raise UsageError(f'--image {path!r} is not a file')
    if args.images and args.model_spec.kind != 'folder':
        raise UsageError(f'--image needs --model FOLDER (a vision-language or CLIP model with its processor); '
                         f'{args.model_spec.label} takes text only')
    if args.images and args.contrast is not None:
        raise UsageError('--contrast does not apply with --image')


def read_images(paths) -> list:
    """The images of ``--image`` as RGB PIL images (:py:class:`CommandError` for one that cannot be read)."""
    from PIL import Image

    images = []
    for path in paths:
        try:
            with Image.open(path) as picture:
                images.append(picture.convert('RGB'))
        except OSError as error:
            raise CommandError(f'cannot read the image {path!r}: {error}') from error
    return images


def prediction(model, explanation) -> tuple[int, float] | None:
    """The argmax token and its logit at the explained position (one extra forward pass), or None if unknown."""
    try:
        kwargs = {'input_ids': explanation.input_ids.to(model.device)}
        if getattr(explanation, 'attention_mask', None) is not None:
            kwargs['attention_mask'] = explanation.attention_mask.to(model.device)
        if getattr(explanation, 'decoder_input_ids', None) is not None:
            kwargs['decoder_input_ids'] = explanation.decoder_input_ids.to(model.device)
        with torch.no_grad():
            logits = model(**kwargs, use_cache=False).logits[0]
        position = explanation.position
        position = int(position.reshape(-1)[0]) if position is not None else -1
        scores = logits[position].float()
        token = int(scores.argmax())
        return token, float(scores[token])
    except Exception:  # noqa: BLE001 -- only a nicety of the printout: the explanation itself stands
        return None


def explain_and_show(args: argparse.Namespace):
    """Load the model, explain ``args.text`` and print the prediction, the heatmap and the top tokens; returns
    ``(model, tokenizer, explanation)``. Shared by ``explain`` and ``demo``."""
    if getattr(args, 'images', None):
        return explain_images(args)
    contrast = getattr(args, 'contrast', None)  # demo has none
    model, tokenizer = load(args, need_tokenizer_first=args.target is not None or contrast is not None)
    contrast = getattr(args, 'contrast', None)  # resolved to an id by load
    start = time.perf_counter()
    with status(f'explaining with {args.method}', not args.quiet):
        # tokenised here (as explain() does for text) to put the ids on the model's device
        encoding = encode_texts(tokenizer, args.text).to(args.torch_device)
        explanation = explain(model, encoding, target=args.target, method=args.method,
                              composite=make_composite(args.composite), tokenizer=tokenizer, contrast=contrast,
                              **args.params)
    seconds = time.perf_counter() - start
    target = int(explanation.target.reshape(-1)[0])
    logit = float(explanation.logit.reshape(-1)[0])
    explained = repr(decode(tokenizer, target))
    tokens = int(explanation.input_ids.shape[-1])

    print(f'Model:       {args.model_spec.label}')
    print(f'Prompt:      {shorten(args.text)!r} ({tokens} tokens)')
    if explanation.contrast is not None:
        other = int(explanation.contrast.reshape(-1)[0])
        explained = f'{decode(tokenizer, target)!r} rather than {decode(tokenizer, other)!r}'
        print(f'Explained:   {explained} (token ids {target} and {other}, logit difference {logit:.3f}; '
              f'{"--target and " if args.target is not None else ""}--contrast)')
    elif args.target is None:
        print(f'Prediction:  {decode(tokenizer, target)!r} (token id {target}, logit {logit:.3f})')
    else:
        predicted = prediction(model, explanation)
        if predicted is not None:
            token, value = predicted
            print(f'Prediction:  {decode(tokenizer, token)!r} (token id {token}, logit {value:.3f})')
        print(f'Explained:   {decode(tokenizer, target)!r} (token id {target}, logit {logit:.3f}; --target)')
    print(f'Method:      {method_label(args)} ({seconds:.2f} s)')
    print()
    unit = 'word' if args.words else 'input token'
    print(f'Relevance of each {unit} for {explained}{legend(args.color)}:')
    explanation.show(words=args.words, color=color_choice(args.color))
    if args.top:
        top = explanation.top(args.top, tokenizer)
        print()
        print(f'Top-{len(top)} input tokens:')
        for rank, (position, value, token) in enumerate(top, start=1):
            print(f'  {rank}. {token!r:<16} position {position:>4}   relevance {value:+.4f}')
    return model, tokenizer, explanation


def explain_images(args: argparse.Namespace):
    """:py:func:`explain_and_show` for ``--image``: text and images through the model's processor."""
    with status('loading the model and its processor', not args.quiet):
        model, processor = load_multimodal(args.model_spec, args.dtype, args.torch_device)
    images = read_images(args.images)
    start = time.perf_counter()
    with status(f'explaining with {args.method}', not args.quiet):
        target = resolve_target(args.target, processor.tokenizer)
        explanation = explain(model, args.text, images=images, processor=processor, target=target,
                              method=args.method, composite=make_composite(args.composite), **args.params)
    seconds = time.perf_counter() - start
    print(f'Model:       {args.model_spec.label} ({type(model).__name__})')
    print(f'Prompt:      {shorten(args.text)!r} with {len(images)} image(s)')
    for row in range(explanation.relevance.shape[0]):
        if explanation.position is None:
            explained = f'similarity score {float(explanation.logit[row]):.3f}'
        else:
            token = int(explanation.target[row])
            explained = f'{decode(processor.tokenizer, token)!r} (token id {token}, logit ' \
                        f'{float(explanation.logit[row]):.3f})'
        print(f'Explained:   {explained}; text {float(explanation.relevance[row].sum()):+.4f} + images '
              f'{explanation.image_relevance(row):+.4f}')
    print(f'Method:      {method_label(args)} ({seconds:.2f} s)')
    print()
    explanation.show(words=args.words, color=color_choice(args.color))
    return model, processor.tokenizer, explanation


def write_heatmap(args: argparse.Namespace, explanation) -> None:
    """Write the heatmap to ``args.output`` (if given) with ``Explanation.save`` and say where."""
    if args.output is not None:
        path = Path(explanation.save(args.output, words=args.words)).resolve()
        print()
        print(f'Wrote the heatmap to {path}')


def run(args: argparse.Namespace) -> int:
    """Run ``explain`` with checked arguments; returns the exit status."""
    _, _, explanation = explain_and_show(args)
    write_heatmap(args, explanation)
    return 0
