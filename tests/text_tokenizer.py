"""Tiny real tokenizers for the tiny test models (vocabulary of :py:data:`tests.models.VOCAB` = 100 ids).

- :py:func:`byte_level_tokenizer`: a GPT-2 style byte-level BPE (``'Ġ'`` for spaces, ``'Ċ'`` for line breaks,
  multi-byte characters as byte tokens), trained deterministically on :py:data:`CORPUS`; ``<pad>`` 0, ``<s>`` 1,
  ``</s>`` 2, ``<unk>`` 3 (the bos/eos ids of the tiny decoder models; T5's pad/eos are 0/1).
- :py:func:`sentencepiece_tokenizer`: a Llama style BPE with ``'▁'`` for spaces and byte fallback (``'<0x0A>'``).

Both are :py:class:`transformers.PreTrainedTokenizerFast` objects built from a :py:mod:`tokenizers` model in
memory (nothing is downloaded).
"""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tests.models import VOCAB

SPECIAL = ['<pad>', '<s>', '</s>', '<unk>']
CORPUS = [
    'The ice bear lives in the Arctic.',
    'The polar bear lives in the north, the penguin lives in the south.',
    'Question: where does the ice bear live? Answer: in the Arctic.',
    'Question: what does the bear eat? Answer: seals and fish.',
    'the the the bear bear lives lives in in',
    'Caf\u00e9 au lait\nis a drink.',
    'A bear \U0001f43b is big.',
]


def _alphabet() -> list[str]:
    """Every byte-level character of the corpus (so that no text of it is unknown)."""
    table = pre_tokenizers.ByteLevel.alphabet()
    used = set()
    for line in CORPUS:
        for piece, _ in pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(line):
            used.update(piece)
    return sorted(used & set(table))


@functools.cache
def _byte_level_json() -> str:
    tokenizer = Tokenizer(models.BPE(unk_token='<unk>'))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=_alphabet(), show_progress=False, min_frequency=1
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    assert tokenizer.get_vocab_size() == VOCAB, tokenizer.get_vocab_size()
    return tokenizer.to_str()


def byte_level_tokenizer(pad: bool = True, bos: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE of exactly 100 ids.

    Parameters
    ----------
    pad: bool
        Whether it has a pad token (``<pad>``, id 0); False gives a tokenizer without one, as GPT-2's and Llama's.
    bos: bool
        Whether ``tokenizer(text)`` puts ``<s>`` (id 1) in front.
    """
    backend = Tokenizer.from_str(_byte_level_json())
    if bos:
        from tokenizers import processors

        backend.post_processor = processors.TemplateProcessing(single='<s> $A', special_tokens=[('<s>', 1)])
    kwargs = dict(bos_token='<s>', eos_token='</s>', unk_token='<unk>')
    if pad:
        kwargs['pad_token'] = '<pad>'
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A Llama style BPE: ``'▁'`` marks a space, the first token's space is stripped when decoding, and characters
    outside the vocabulary fall back to byte tokens (``'<0x0A>'`` for a line break, ``'<0xC3>' '<0xA9>'`` for
    ``'é'``)."""
    vocab = {token: index for index, token in enumerate(SPECIAL)}
    for byte in (0x0A, 0xC3, 0xA9, 0xF0, 0x9F, 0x90, 0xBB):
        vocab[f'<0x{byte:02X}>'] = len(vocab)
    for piece in [
        '\u2581',
        'T',
        'h',
        'e',
        'i',
        'c',
        'b',
        'a',
        'r',
        'l',
        'v',
        's',
        'n',
        't',
        '\u2581T',
        'Th',
        'The',
        '\u2581The',
        '\u2581i',
        '\u2581ic',
        '\u2581ice',
        '\u2581b',
        '\u2581be',
        '\u2581bea',
        '\u2581bear',
        'C',
        'f',
        'Ca',
        'Caf',
        '\u2581l',
        '\u2581li',
        '\u2581liv',
        '\u2581live',
        '\u2581lives',
    ]:
        vocab.setdefault(piece, len(vocab))
    merges = [
        ('\u2581', 'T'),
        ('T', 'h'),
        ('Th', 'e'),
        ('\u2581', 'The'),
        ('\u2581', 'i'),
        ('\u2581i', 'c'),
        ('\u2581ic', 'e'),
        ('\u2581', 'b'),
        ('\u2581b', 'e'),
        ('\u2581be', 'a'),
        ('\u2581bea', 'r'),
        ('C', 'a'),
        ('Ca', 'f'),
        ('\u2581', 'l'),
        ('\u2581l', 'i'),
        ('\u2581li', 'v'),
        ('\u2581liv', 'e'),
        ('\u2581live', 's'),
    ]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token='<unk>', byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend('\u2581'), normalizers.Replace(' ', '\u2581')])
    backend.decoder = decoders.Sequence(
        [decoders.Replace('\u2581', ' '), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(' ', 1, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token='<s>', eos_token='</s>', unk_token='<unk>', pad_token='<pad>'
    )
