"""Tokens as people read them: the text each token id stands for, word merging, and printable token strings.

:py:func:`token_texts` decodes ids one token at a time the way the tokenizer writes the whole text, so byte-level BPE
markers (``'Ġ'`` for a space, ``'Ċ'`` for a line break), SentencePiece's ``'▁'``, byte fallbacks (``'<0x0A>'``) and
WordPiece's ``'##'`` come out as the spaces, line breaks and characters they encode. :py:func:`merge_words` groups
tokens into words (their relevance summed), :py:func:`display_token` makes a token string printable on one line.
Every renderer of :py:mod:`zennit_attn.results.render` goes through these three functions.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = ['display_token', 'token_texts', 'merge_words', 'byte_pieces']

#: visible stand-ins for whitespace characters that would break the layout
_VISIBLE = {'\n': '\u23ce', '\r': '\u240d', '\t': '\u21e5', '\x7f': '\u2421'}
#: bidirectional classes of the embedding, override and isolate controls, which would reorder the text after them
_DIRECTIONAL = frozenset({'LRE', 'RLE', 'LRO', 'RLO', 'PDF', 'LRI', 'RLI', 'FSI', 'PDI'})
#: how many tokens before a token are decoded with it (spacing rules look at the previous token at most)
_WINDOW = 6
_BYTES = re.compile(r'(?:<0x[0-9A-Fa-f]{2}>)+')
_BYTES_TAIL = re.compile(r'(?:<0x[0-9A-F]{2}>)+$')
_REPLACEMENT = '\ufffd'


def display_token(token: str) -> str:
    """Make a token printable: leading/trailing spaces are kept, line breaks and control characters are shown.

    ``'\\n'`` becomes ``'⏎'``, ``'\\r'`` ``'␍'``, ``'\\t'`` ``'⇥'``, other C0 control characters (including ESC,
    which could otherwise inject terminal escape sequences) their Unicode control picture (``'\\x1b'`` ->
    ``'␛'``); C1 control characters (``'\\x9b'``, a terminal's CSI) and the bidirectional embedding, override and
    isolate controls (``'\\u202e'``, which would show the tokens after it reversed) their code point, ``'<U+202E>'``.
    A token of spaces only becomes ``'␣'`` per space, an empty token ``'∅'``, so that both stay visible.

    Parameters
    ----------
    token: str
        The decoded token.

    Returns
    -------
    str
    """
    if token == '':
        return '\u2205'
    if token.strip(' ') == '':
        return '\u2423' * len(token)
    out = []
    for char in token:
        if char in _VISIBLE:
            out.append(_VISIBLE[char])
        elif ord(char) < 0x20:
            out.append(chr(0x2400 + ord(char)))
        elif 0x80 <= ord(char) < 0xA0 or unicodedata.bidirectional(char) in _DIRECTIONAL:
            out.append(f'<U+{ord(char):04X}>')
        else:
            out.append(char)
    return ''.join(out)


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (the inverse of ``bytes_to_unicode``)."""
    printable = (
        list(range(ord('!'), ord('~') + 1)) + list(range(ord('¡'), ord('¬') + 1)) + list(range(ord('®'), ord('ÿ') + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}


_BYTE_LEVEL = _bytes_to_unicode()


def byte_pieces(raw: str) -> bytes | None:
    """The bytes a raw token string stands for, if it is a byte fallback (``'<0xE2><0x80>'``) or a string of GPT-2's
    byte-level alphabet (``'Ġbear'`` -> ``b' bear'``); None otherwise.

    Parameters
    ----------
    raw: str
        The token as the vocabulary holds it (``tokenizer.convert_ids_to_tokens(id)``).

    Returns
    -------
    bytes or None
    """
    if _is_bytes(raw):
        return bytes(int(raw[index + 3 : index + 5], 16) for index in range(0, len(raw), 6))
    if raw and all(char in _BYTE_LEVEL for char in raw):
        return bytes(_BYTE_LEVEL[char] for char in raw)
    return None


def _is_bytes(text: str) -> bool:
    """Whether ``text`` is one or more byte tokens ``'<0xNN>'``."""
    return bool(text) and _BYTES.fullmatch(text) is not None


def _markers(pieces: bytes) -> str:
    return ''.join(f'<0x{byte:02X}>' for byte in pieces)


def _incomplete_tail(pieces: bytes) -> bytes:
    """The bytes at the end of ``pieces`` that start a UTF-8 character without completing it."""
    for back in range(1, min(4, len(pieces)) + 1):
        byte = pieces[-back]
        if byte >= 0xC0:  # a lead byte: how many bytes its character needs
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return pieces[-back:] if back < needed else b''
        if byte < 0x80:
            return b''
    return pieces[-4:] if len(pieces) < 4 and pieces and all(0x80 <= byte < 0xC0 for byte in pieces) else b''


def _decode(tokenizer, ids: Sequence[int]) -> str:
    if not ids:
        return ''
    try:
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except TypeError:  # a tokenizer whose decode takes the ids only
        return tokenizer.decode(list(ids))


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """The text of each token of ``ids``, as the tokenizer writes it within the whole sequence.

    Token ``k``'s text is what decoding ``ids[k - 6 : k + 1]`` adds to decoding ``ids[k - 6 : k]``, so that
    tokenizer-specific spacing comes out as in ``tokenizer.decode(ids)``: byte-level BPE (``'Ġ'`` -> ``' '``,
    ``'Ċ'`` -> ``'\\n'``), SentencePiece (``'▁'`` -> ``' '``, the first token's space stripped as the tokenizer
    does), byte fallbacks (``'<0x0A>'`` -> ``'\\n'``) and WordPiece (``'##ing'`` -> ``'ing'``, a space before a new
    word). Special tokens keep their name (``'<s>'``). A token that holds only the first bytes of a multi-byte
    character (an emoji split over byte tokens) shows those bytes, ``'<0xF0><0x9F>'``, and the character appears
    on the token that completes it. Where the window does not decode to a prefix of the longer one, the
    token is decoded alone.

    Parameters
    ----------
    tokenizer
        A Hugging Face tokenizer (anything with ``decode(ids)``; ``convert_ids_to_tokens`` is used for split
        characters where present).
    ids: sequence of int
        Token ids.

    Returns
    -------
    list of str
        One string per id (possibly with leading spaces or line breaks; see :py:func:`display_token`).
    """
    ids = [int(token) for token in ids]
    texts = []
    for k, token in enumerate(ids):
        start = max(0, k - _WINDOW)
        before = _decode(tokenizer, ids[start:k])
        after = _decode(tokenizer, ids[start : k + 1])
        stem = before.rstrip(_REPLACEMENT)
        if after.startswith(stem):
            text = after[len(stem) :]
        else:
            text = _decode(tokenizer, [token])
        if _REPLACEMENT in text:  # a character split over tokens (or invalid bytes)
            convert = getattr(tokenizer, 'convert_ids_to_tokens', None)
            pieces = byte_pieces(convert(token)) if callable(convert) else None
            if pieces is not None and not text.strip(_REPLACEMENT):  # nothing complete yet: show the bytes
                text = _markers(pieces)
            elif pieces is not None and text.endswith(_REPLACEMENT) and _incomplete_tail(pieces):
                text = text.rstrip(_REPLACEMENT) + _markers(_incomplete_tail(pieces))
            if texts and _BYTES_TAIL.search(texts[-1]) and text.startswith(_REPLACEMENT):
                text = text.lstrip(_REPLACEMENT)  # the bytes shown before never completed a character
        texts.append(text)
    return texts


def _kind(char: str) -> int:
    """0: letter or digit, 1: whitespace, 2: anything else (punctuation, symbols)."""
    return 0 if char.isalnum() or char == '_' else 1 if char.isspace() else 2


def merge_words(
    texts: Sequence[str], values: Sequence[float], special: Sequence[bool] | None = None
) -> tuple[list[str], list[float], list[list[int]]]:
    """Merge tokens into words; a word's relevance is the sum of its tokens'.

    A new word starts at a token that begins with whitespace, after a token that ends with whitespace or a line
    break, at and after special tokens, and where letters/digits meet punctuation (``'lives'`` ``','`` are two
    words, ``'ice'`` ``'bear'`` without a space one). A token of spaces only joins the next word. A token that shows
    bytes of a split character (``'<0xE2>'``, see :py:func:`token_texts`) joins the word of the token that
    completes the character, and those bytes are left out of the word's text.

    Parameters
    ----------
    texts: sequence of str
        Token texts (:py:func:`token_texts`).
    values: sequence of float
        One relevance per token.
    special: sequence of bool, optional
        True for special tokens (``'<s>'``, ``'[CLS]'``), which stay words of their own.

    Returns
    -------
    tuple
        ``(words, relevance, groups)``: the word texts, their summed relevance, and for each word the indices of its
        tokens.
    """
    if len(texts) != len(values):
        raise ValueError(f'{len(texts)} tokens but {len(values)} relevance values')
    special = [False] * len(texts) if special is None else [bool(flag) for flag in special]
    # the text each token shows once the bytes of split characters are left to the token that completes them
    resolved = [_BYTES_TAIL.sub('', text) for text in texts]
    first = [''] * len(texts)  # first character a token contributes (looking ahead over byte pieces)
    for index in reversed(range(len(texts))):
        first[index] = resolved[index][:1] or (first[index + 1] if index + 1 < len(texts) else '')
    last = [''] * len(texts)  # last character shown up to a token
    for index, text in enumerate(resolved):
        last[index] = text[-1:] or (last[index - 1] if index else '')
    groups: list[list[int]] = []
    for index in range(len(texts)):
        if not groups:
            new = True
        elif special[index] or special[index - 1]:
            new = True
        elif _BYTES_TAIL.search(texts[index - 1]) or resolved[index - 1].strip(' ') == '' and resolved[index - 1]:
            new = False  # the rest of a split character, or the word after a token of spaces
        else:
            head, tail = first[index], last[index - 1]
            new = not head or not tail or head.isspace() or tail.isspace() or _kind(head) != _kind(tail)
        if new:
            groups.append([index])
        else:
            groups[-1].append(index)
    words, sums = [], []
    for group in groups:
        pieces = [texts[index] for index in group]
        # bytes of a split character are dropped where a later token of the word shows the character
        words.append(
            ''.join(
                _BYTES_TAIL.sub('', piece) if position < len(pieces) - 1 else piece
                for position, piece in enumerate(pieces)
            )
        )
        sums.append(sum(float(values[index]) for index in group))
    return words, sums, groups
