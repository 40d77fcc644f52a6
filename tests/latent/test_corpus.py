"""The Wikipedia texts of the reference samples (``zennit_attn.latent.corpus``), on a small file of the package's
layout (title -> ``{title, extract}``)."""

from __future__ import annotations

import json

import pytest

from zennit_attn.latent.corpus import wikipedia_leads

LEADS = {
    'A': {'title': 'A', 'extract': 'A film by Stanley Kubrick, who wrote it with Arthur C. Clarke. It is long!  '},
    'B': {'title': 'B', 'extract': None},
    'C': {'title': 'C'},
    'D': {'title': 'D', 'extract': 'Dr. Smith went home, e.g. by bus. He slept.'},
}


@pytest.fixture
def leads(tmp_path):
    path = tmp_path / 'summaries.json'
    path.write_text(json.dumps(LEADS))
    return path


def test_sentences_are_not_cut_after_initials_and_abbreviations(leads):
    """A split at every stop followed by whitespace cut ``Arthur C.`` from ``Clarke.`` and ``Dr.`` from ``Smith`` (187
    of the first 3000 leads of the package were cut somewhere so)."""
    assert list(wikipedia_leads(path=leads, sentences=True, min_chars=1)) == [
        'A film by Stanley Kubrick, who wrote it with Arthur C. Clarke.',
        'It is long!',
        'Dr. Smith went home, e.g. by bus.',
        'He slept.',
    ]
    assert list(wikipedia_leads(path=leads, min_chars=50)) == [LEADS['A']['extract'].strip()]
    assert list(wikipedia_leads(path=leads, sentences=True, limit=3, min_chars=12)) == [
        'A film by Stanley Kubrick, who wrote it with Arthur C. Clarke.',
        'Dr. Smith went home, e.g. by bus.',
    ]


@pytest.mark.parametrize('limit', [-1, True, 2.5])
def test_a_limit_that_is_not_a_count_is_refused(leads, limit):
    """``limit=-1`` gave no text at all, ``True`` one, ``2.5`` three."""
    with pytest.raises(ValueError, match='limit must be a non-negative integer or None'):
        list(wikipedia_leads(path=leads, limit=limit))
    with pytest.raises(ValueError, match='min_chars must be a non-negative integer'):
        list(wikipedia_leads(path=leads, min_chars=-1 if limit == -1 else limit))
    assert list(wikipedia_leads(path=leads, limit=0)) == []
