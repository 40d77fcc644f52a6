"""Token texts as the tokenizer writes them (byte-level BPE, SentencePiece with byte fallback) and word merging."""

from __future__ import annotations

import pytest

from tests.text_tokenizer import byte_level_tokenizer, sentencepiece_tokenizer
from zennit_attn.results.render.tokens import byte_pieces, display_token, merge_words, token_texts


@pytest.fixture(scope='module')
def bpe():
    return byte_level_tokenizer()


@pytest.fixture(scope='module')
def spm():
    return sentencepiece_tokenizer()


def test_byte_level_markers_are_decoded(bpe):
    ids = bpe('The ice bear lives in the Arctic.').input_ids
    assert bpe.convert_ids_to_tokens(ids)[1] == '\u0120ice'  # 'Ġice' in the vocabulary
    texts = token_texts(bpe, ids)
    assert texts == ['The', ' ice', ' bear', ' lives', ' in', ' the', ' Arctic', '.']
    assert ''.join(texts) == bpe.decode(ids)


def test_byte_level_line_breaks_and_split_characters(bpe):
    ids = bpe('Caf\u00e9 au lait\nis a drink.').input_ids
    raw = bpe.convert_ids_to_tokens(ids)
    assert '\u010a' in raw and 'f\u00c3' in raw  # 'Ċ' (line break) and 'f' + the first byte of 'é'
    texts = token_texts(bpe, ids)
    assert texts[:3] == ['Ca', 'f<0xC3>', '\u00e9']  # the character appears on the token that completes it
    assert '\n' in texts
    assert display_token('\n') == '\u23ce'
    # four byte tokens of an emoji: three show their bytes, the last one the emoji
    texts = token_texts(bpe, bpe('with a bear \U0001f43b').input_ids)
    assert texts[-4:] == ['<0xF0>', '<0x9F>', '<0x90>', '\U0001f43b']
    assert byte_pieces('\u0120bear') == b' bear' and byte_pieces('<0x0A>') == b'\n'
    assert byte_pieces('<0xF0><0x9F>') == b'\xf0\x9f' and byte_pieces('\u2581The') is None


def test_invalid_bytes_do_not_repeat(bpe):
    """A first byte of a character followed by a token that does not complete it: the byte is shown once."""
    ids = [bpe.convert_tokens_to_ids('e'), bpe.convert_tokens_to_ids('\u00c3'), bpe.convert_tokens_to_ids('T')]
    assert token_texts(bpe, ids) == ['e', '<0xC3>', 'T']


def test_sentencepiece_markers_and_byte_fallback(spm):
    ids = spm('The ice bear lives\nCaf\u00e9').input_ids
    raw = spm.convert_ids_to_tokens(ids)
    assert '\u2581ice' in raw and '<0x0A>' in raw and '<0xC3>' in raw
    texts = token_texts(spm, ids)
    # the first token's space is stripped as the tokenizer's decoder does; '▁' is a space; <0x0A> a line break
    assert texts == ['T', 'h', 'e', ' ice', ' bear', ' lives', '\n', 'Caf', '<0xC3>', '\u00e9']
    words, values, groups = merge_words(texts, [1.0] * len(texts))
    assert words == ['The', ' ice', ' bear', ' lives', '\n', 'Caf\u00e9']
    assert values == [3.0, 1.0, 1.0, 1.0, 1.0, 3.0]
    assert groups[0] == [0, 1, 2] and groups[-1] == [7, 8, 9]


def test_merge_words_sums_relevance(bpe):
    ids = bpe('Question: where does the polar bear live?').input_ids
    texts = token_texts(bpe, ids)
    assert texts[2:5] == [' w', 'he', 're']
    values = [float(index) for index in range(len(texts))]
    words, sums, groups = merge_words(texts, values)
    assert words == ['Question', ':', ' where', ' does', ' the', ' polar', ' bear', ' live', '?']
    assert sums[2] == 2.0 + 3.0 + 4.0
    assert sum(sums) == sum(values)
    assert [index for group in groups for index in group] == list(range(len(texts)))


def test_merge_words_keeps_special_tokens_and_spaces_apart():
    texts = ['<s>', 'The', ' ', '\U0001f43b', ' is', '\n', 'big', '</s>']
    words, _, _ = merge_words(texts, [0.0] * len(texts), [True, False, False, False, False, False, False, True])
    assert words == ['<s>', 'The', ' \U0001f43b', ' is', '\n', 'big', '</s>']
    with pytest.raises(ValueError, match='2 tokens but 1'):
        merge_words(['a', 'b'], [1.0])


def test_a_tokenizer_with_decode_only():
    """Anything with decode(ids) works; where a window does not decode to a prefix, a token is decoded alone."""

    class Odd:
        def decode(self, ids):
            return '|'.join(f't{token}' for token in ids)

    assert token_texts(Odd(), [5, 6, 7]) == ['t5', '|t6', '|t7']


def test_display_token():
    assert display_token(' Tower') == ' Tower'
    assert display_token('\n') == '\u23ce'
    assert display_token('a\tb\r') == 'a\u21e5b\u240d'
    assert display_token('\x1b[31m') == '\u241b[31m'
    assert display_token('') == '\u2205'
    assert display_token('  ') == '\u2423\u2423'
