"""Prompt-pair tasks built from templates: indirect-object identification (IOI, Wang et al. 2023) and subject-verb
agreement (Linzen et al. 2016; Arras et al. 2025), generated deterministically from a seed with a tokenizer that
checks every name, noun and answer is one token (so that each corrupted prompt is as long as its clean one).

- IOI: clean ``"When Mary and John went to the store, John gave a drink to"`` -> ``" Mary"`` (wrong: ``" John"``);
  corrupted: the second mention of the subject replaced by a third name (``", Tom gave"``), which leaves the model
  no name to exclude; or (``corruption='abc'``) all three names replaced by three others.
- Agreement: clean ``"The key near the tables"`` -> ``" is"`` (wrong: ``" are"``); corrupted: the subject's other
  number (``"The keys near the tables"``), so the verb's number flips; or (``corruption='both'``) the subject's and
  the attractor's (``"The keys near the table"``), two tokens.

Each task has a set of templates of one length (:py:data:`IOI_TEMPLATES`, :py:data:`AGREEMENT_TEMPLATES`: their pairs
batch together) and a set of others (:py:data:`IOI_OTHER_TEMPLATES`, :py:data:`AGREEMENT_OTHER_TEMPLATES`: other
wordings and lengths, e.g. to choose a method on one set and report it on the other). Every pair records its
template (:py:attr:`PromptPair.template`); :py:func:`by_template` groups pairs so that each group can be batched.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

__all__ = [
    'PromptPair',
    'IOI_TEMPLATES',
    'IOI_OTHER_TEMPLATES',
    'IOI_NAMES',
    'IOI_CORRUPTIONS',
    'AGREEMENT_TEMPLATES',
    'AGREEMENT_OTHER_TEMPLATES',
    'AGREEMENT_CORRUPTIONS',
    'AGREEMENT_NOUNS',
    'ioi_pairs',
    'agreement_pairs',
    'save_pairs',
    'load_pairs',
    'pair_ids',
    'by_template',
    'TASKS',
    'task_pairs',
]

#: IOI templates: ``{io}``, ``{s}`` and the second mention ``{s2}`` (the subject in clean prompts).
IOI_TEMPLATES = (
    'When{a} and{b} went to the store,{s2} gave a drink to',
    'When{a} and{b} went to the park,{s2} gave a ball to',
    'When{a} and{b} went to the office,{s2} gave a book to',
    'After{a} and{b} went to the school,{s2} gave a gift to',
)
#: IOI templates of other wordings and lengths (after the templates of Wang et al. 2023), one length each.
IOI_OTHER_TEMPLATES = (
    'Then,{a} and{b} went to the beach.{s2} gave a shell to',
    'While{a} and{b} were working at the hospital,{s2} gave a bone to',
    'Yesterday{a} and{b} visited the museum, and{s2} handed a map to',
    'Then,{a} and{b} had a long argument, and afterwards{s2} said to',
)
#: Names that SmolLM2's tokenizer encodes as one token each (with their leading space).
IOI_NAMES = (' Mary', ' John', ' Tom', ' Sarah', ' James', ' Anna', ' David', ' Emma', ' Paul', ' Lisa')

#: Agreement templates: subject ``{n}``, attractor ``{m}``; the answer is the verb's form.
AGREEMENT_TEMPLATES = ('The{n} near the{m}', 'The{n} behind the{m}', 'The{n} with the{m}', 'The{n} beside the{m}')
#: Agreement templates of other wordings and lengths (prepositional and relative-clause attractors).
AGREEMENT_OTHER_TEMPLATES = (
    'The{n} next to the old{m}',
    'The{n} that saw the{m}',
    'The{n} of the{m}',
    'In the morning, the{n} across from the{m}',
)
#: (singular, plural) nouns, each one token.
AGREEMENT_NOUNS = (
    (' key', ' keys'),
    (' dog', ' dogs'),
    (' boy', ' boys'),
    (' girl', ' girls'),
    (' author', ' authors'),
    (' teacher', ' teachers'),
    (' doctor', ' doctors'),
    (' farmer', ' farmers'),
    (' student', ' students'),
    (' cat', ' cats'),
    (' friend', ' friends'),
)
#: (singular, plural) verb forms: the answers.
AGREEMENT_VERBS = ((' is', ' are'),)
#: Attractor nouns (singular, plural).
ATTRACTORS = ((' table', ' tables'), (' house', ' houses'), (' car', ' cars'), (' book', ' books'))
#: ``corruption`` of :py:func:`agreement_pairs` -> the name of its task: the subject's number flipped (``'subject'``,
#: one token), or the subject's and the attractor's (``'both'``, two tokens; the answer still follows the subject)
AGREEMENT_CORRUPTIONS = {'subject': 'agreement', 'both': 'agreement_both'}


@dataclass(frozen=True)
class PromptPair:
    """A clean and a corrupted prompt of one task, the right and the wrong answer (texts of one token each)."""

    task: str
    clean: str
    corrupted: str
    answer: str
    wrong: str
    #: the template the prompts were written from (None for pairs of a file without one)
    template: str | None = None


def _check_templates(templates: Sequence[str], fields: tuple[str, ...]) -> tuple[str, ...]:
    """``templates`` as a tuple, each holding every one of ``fields`` once.

    Raises
    ------
    ValueError
        For no templates, or a template that misses a field or repeats one.
    """
    templates = (templates,) if isinstance(templates, str) else tuple(templates)
    if not templates:
        raise ValueError('templates is empty: give at least one template')
    for template in templates:
        if not isinstance(template, str) or any(template.count(name) != 1 for name in fields):
            raise ValueError(f'template {template!r} must hold each of {", ".join(fields)} once')
    return templates


def _one_token(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f'{text!r} is {len(ids)} tokens for this tokenizer: the tasks need single-token words')
    return ids[0]


def _check(tokenizer, pairs: list[PromptPair]) -> list[PromptPair]:
    """Refuse pairs whose answers are not one token each or whose prompts differ in length."""
    for pair in pairs:
        _one_token(tokenizer, pair.answer)
        _one_token(tokenizer, pair.wrong)
        clean = tokenizer.encode(pair.clean, add_special_tokens=False)
        corrupted = tokenizer.encode(pair.corrupted, add_special_tokens=False)
        if len(clean) != len(corrupted):
            raise ValueError(f'{pair.clean!r} and {pair.corrupted!r} differ in length ({len(clean)}, {len(corrupted)})')
    return pairs


#: ``corruption`` of :py:func:`ioi_pairs` -> the name of its task: the second mention of the subject replaced by a
#: third name (``'s2'``), or all three names by three others (``'abc'``, the ABC distribution of Wang et al. 2023)
IOI_CORRUPTIONS = {'s2': 'ioi', 'abc': 'ioi_abc'}


def ioi_pairs(
    tokenizer, count: int = 120, seed: int = 0, corruption: str = 's2', templates: Sequence[str] = IOI_TEMPLATES
) -> list[PromptPair]:
    """``count`` IOI prompt pairs (names :py:data:`IOI_NAMES`, half with the indirect object named first, the
    ``templates`` in turn: :py:data:`IOI_TEMPLATES` by default, of one length), the same for the same ``seed``;
    ``corruption`` one of :py:data:`IOI_CORRUPTIONS` (task name ``'ioi'`` or ``'ioi_abc'``).

    Raises
    ------
    ValueError
        For an unknown corruption, where the tokenizer splits a name or the prompts of a pair differ in length.
    """
    if corruption not in IOI_CORRUPTIONS:
        raise ValueError(f'unknown IOI corruption {corruption!r}; known: {", ".join(IOI_CORRUPTIONS)}')
    templates = _check_templates(templates, ('{a}', '{b}', '{s2}'))
    rng = random.Random(seed)
    pairs = []
    for index in range(count):
        template = templates[index % len(templates)]
        if corruption == 's2':
            io, s, other = rng.sample(IOI_NAMES, 3)
            others = (io, s, other) if index % 2 == 0 else (s, io, other)
        else:
            io, s, *others = rng.sample(IOI_NAMES, 5)
        a, b = (io, s) if index % 2 == 0 else (s, io)
        clean = template.format(a=a, b=b, s2=s)
        corrupted = template.format(a=others[0], b=others[1], s2=others[2])
        pairs.append(PromptPair(IOI_CORRUPTIONS[corruption], clean, corrupted, io, s, template))
    return _check(tokenizer, pairs)


def agreement_pairs(
    tokenizer,
    count: int = 120,
    seed: int = 0,
    corruption: str = 'subject',
    templates: Sequence[str] = AGREEMENT_TEMPLATES,
) -> list[PromptPair]:
    """``count`` subject-verb agreement prompt pairs (nouns :py:data:`AGREEMENT_NOUNS`, the attractor of either
    number, half of the clean subjects singular, the ``templates`` in turn: :py:data:`AGREEMENT_TEMPLATES` by default,
    of one length); ``corruption`` one of :py:data:`AGREEMENT_CORRUPTIONS` (task name ``'agreement'`` or
    ``'agreement_both'``).

    Raises
    ------
    ValueError
        For an unknown corruption, where the tokenizer splits a word or the prompts of a pair differ in length.
    """
    if corruption not in AGREEMENT_CORRUPTIONS:
        raise ValueError(f'unknown agreement corruption {corruption!r}; known: {", ".join(AGREEMENT_CORRUPTIONS)}')
    templates = _check_templates(templates, ('{n}', '{m}'))
    rng = random.Random(seed)
    pairs = []
    for index in range(count):
        template = templates[index % len(templates)]
        noun = rng.choice(AGREEMENT_NOUNS)
        attractor, attractor_number = rng.choice(ATTRACTORS), rng.randrange(2)
        verb = rng.choice(AGREEMENT_VERBS)
        number = index % 2  # 0: singular clean subject
        clean = template.format(n=noun[number], m=attractor[attractor_number])
        flipped = 1 - attractor_number if corruption == 'both' else attractor_number
        corrupted = template.format(n=noun[1 - number], m=attractor[flipped])
        pairs.append(
            PromptPair(AGREEMENT_CORRUPTIONS[corruption], clean, corrupted, verb[number], verb[1 - number], template)
        )
    return _check(tokenizer, pairs)


#: The tasks by name: the generator of their pairs and its ``corruption`` (from the corruptions' declarations).
TASKS: dict[str, tuple[Callable[..., list[PromptPair]], str]] = {
    task: (generator, corruption)
    for generator, corruptions in ((ioi_pairs, IOI_CORRUPTIONS), (agreement_pairs, AGREEMENT_CORRUPTIONS))
    for corruption, task in corruptions.items()
}


def task_pairs(
    tokenizer, task: str, count: int = 120, seed: int = 0, templates: Sequence[str] | None = None
) -> list[PromptPair]:
    """``count`` pairs of the task named ``task`` (:py:data:`TASKS`), of its generator's default templates or of
    ``templates``.

    Raises
    ------
    ValueError
        For an unknown task, and as the task's generator does.
    """
    if task not in TASKS:
        raise ValueError(f'unknown task {task!r}; known: {", ".join(TASKS)}')
    generator, corruption = TASKS[task]
    options = {} if templates is None else {'templates': templates}
    return generator(tokenizer, count, seed=seed, corruption=corruption, **options)


def save_pairs(pairs: list[PromptPair], path) -> Path:
    """Write ``pairs`` as JSON (a list of objects with the fields of :py:class:`PromptPair`)."""
    path = Path(path)
    path.write_text(json.dumps([asdict(pair) for pair in pairs], indent=1) + '\n')
    return path


def load_pairs(path, task: str | None = None) -> list[PromptPair]:
    """The pairs of a file of :py:func:`save_pairs` (only those of ``task``, if given)."""
    pairs = [PromptPair(**entry) for entry in json.loads(Path(path).read_text())]
    return [pair for pair in pairs if task is None or pair.task == task]


def by_template(pairs: Sequence[PromptPair]) -> list[list[PromptPair]]:
    """``pairs`` grouped by :py:attr:`PromptPair.template`, in the order of each template's first pair: the pairs of
    one template are of one length and batch together in :py:func:`pair_ids`."""
    groups: dict[str | None, list[PromptPair]] = {}
    for pair in pairs:
        groups.setdefault(pair.template, []).append(pair)
    return list(groups.values())


def pair_ids(tokenizer, pairs: list[PromptPair]) -> dict[str, torch.Tensor]:
    """Token ids of ``pairs`` (all of one length): ``clean`` and ``corrupted`` ``[pairs, seq]``, ``answers`` and
    ``wrong`` ``[pairs]``, the arguments of :py:func:`~.scores.relevance_patching`.

    Raises
    ------
    ValueError
        For prompts of different lengths.
    """
    clean = [tokenizer.encode(pair.clean, add_special_tokens=False) for pair in pairs]
    corrupted = [tokenizer.encode(pair.corrupted, add_special_tokens=False) for pair in pairs]
    lengths = {len(ids) for ids in clean + corrupted}
    if len(lengths) != 1:
        raise ValueError(f'the prompts have {len(lengths)} lengths ({sorted(lengths)}): patch pairs of one length')
    return {
        'clean': torch.tensor(clean),
        'corrupted': torch.tensor(corrupted),
        'answers': torch.tensor([_one_token(tokenizer, pair.answer) for pair in pairs]),
        'wrong': torch.tensor([_one_token(tokenizer, pair.wrong) for pair in pairs]),
    }
