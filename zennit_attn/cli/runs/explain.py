"""The run step of ``zennit-attn explain`` (:py:mod:`zennit_attn.cli.explain`): load the model, explain, print the
prediction, the heatmap and the top tokens, write the heatmap file. Also the first part of ``demo``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ...explain import encode_texts, explain
from ..loading import load, load_multimodal, make_composite, read_images, resolve_target
from ..printing import color_choice, decode, legend, method_label, shorten
from ..progress import status

__all__ = ['run', 'explain_and_show', 'explain_images', 'write_heatmap', 'prediction', 'positions_line']


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
        encoding = encode_texts(tokenizer, args.text).to(args.device)
        explanation = explain(
            model,
            encoding,
            target=args.target,
            method=args.method,
            composite=make_composite(args.composite),
            tokenizer=tokenizer,
            contrast=contrast,
            **args.params,
        )
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
        print(
            f'Explained:   {explained} (token ids {target} and {other}, logit difference {logit:.3f}; '
            f'{"--target and " if args.target is not None else ""}--contrast)'
        )
    elif args.target is None:
        print(f'Prediction:  {decode(tokenizer, target)!r} (token id {target}, logit {logit:.3f})')
    else:
        predicted = prediction(model, explanation)
        if predicted is not None:
            token, value = predicted
            print(f'Prediction:  {decode(tokenizer, token)!r} (token id {token}, logit {value:.3f})')
        print(f'Explained:   {decode(tokenizer, target)!r} (token id {target}, logit {logit:.3f}; --target)')
    print(f'Method:      {method_label(args)} ({seconds:.2f} s)')
    pairs = explanation.position_relevance is not None
    if pairs:  # PA-LRP: the input is position-token pairs, each token shown (and written) with its position
        print(positions_line(explanation))
        explanation = explanation.with_positions()
    print()
    unit = ('word' if args.words else 'input token') + (' with its position' if pairs else '')
    print(f'Relevance of each {unit} for {explained}{legend(args.color)}:')
    explanation.show(words=args.words, color=color_choice(args.color))
    if args.top:
        top = explanation.top(args.top, tokenizer)
        print()
        print(f'Top-{len(top)} input tokens:')
        for rank, (position, value, token) in enumerate(top, start=1):
            print(f'  {rank}. {token!r:<16} position {position:>4}   relevance {value:+.4f}')
    return model, tokenizer, explanation


def positions_line(explanation) -> str:
    """The line that splits PA-LRP's relevance of the pairs into the tokens' and the positions' (first row)."""
    positions = float(explanation.position_relevance[0].sum())
    tokens = float(explanation.relevance[0].sum())
    if explanation.decoder_relevance is not None:
        tokens += float(explanation.decoder_relevance[0].sum())
        if explanation.decoder_position_relevance is not None:
            positions += float(explanation.decoder_position_relevance[0].sum())
    return (
        f'Positions:   {positions:+.4f} to the positions, {tokens:+.4f} to the tokens (PA-LRP: the heatmap, the top '
        'tokens and --output show each token with its position)'
    )


def explain_images(args: argparse.Namespace):
    """:py:func:`explain_and_show` for ``--image``: text and images through the model's processor."""
    with status('loading the model and its processor', not args.quiet):
        model, processor = load_multimodal(args.model_spec, args.dtype, args.device)
    images = read_images(args.images)
    start = time.perf_counter()
    with status(f'explaining with {args.method}', not args.quiet):
        target = resolve_target(args.target, processor.tokenizer)
        explanation = explain(
            model,
            args.text,
            images=images,
            processor=processor,
            target=target,
            method=args.method,
            composite=make_composite(args.composite),
            **args.params,
        )
    seconds = time.perf_counter() - start
    print(f'Model:       {args.model_spec.label} ({type(model).__name__})')
    print(f'Prompt:      {shorten(args.text)!r} with {len(images)} image(s)')
    for row in range(explanation.relevance.shape[0]):
        if explanation.position is None:
            explained = f'similarity score {float(explanation.logit[row]):.3f}'
        else:
            token = int(explanation.target[row])
            explained = (
                f'{decode(processor.tokenizer, token)!r} (token id {token}, logit {float(explanation.logit[row]):.3f})'
            )
        print(
            f'Explained:   {explained}; text {float(explanation.relevance[row].sum()):+.4f} + images '
            f'{explanation.image_relevance(row):+.4f}'
        )
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
    """Run ``explain`` with arguments checked by :py:func:`zennit_attn.cli.explain.check`; returns the exit status."""
    _, _, explanation = explain_and_show(args)
    write_heatmap(args, explanation)
    return 0
