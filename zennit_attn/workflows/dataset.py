"""Explain whole datasets: batches sorted by length, results written in shards as they are done, resumable, and
shared between the processes of a ``torchrun`` / ``accelerate launch`` run.

On disk an output directory holds

- ``settings.json``: what was run (method, target, position, batch and shard sizes, method parameters, the model's
  class, dtype and configuration, a hash of the texts); a later run on the directory must use the same settings;
- ``shard-NNNNN.safetensors``: the explanations of up to ``shard_size`` texts, each tensor named
  ``<input index>.<field>`` (fields ``input_ids``, ``relevance``, ``target``, ``logit``, and where they apply
  ``position``, ``decoder_input_ids``, ``decoder_relevance``, ``position_relevance``,
  ``decoder_position_relevance``), written to a temporary name, then renamed; before it
  ``shard-NNNNN.safetensors.sha256``, the SHA-256 of its bytes (``sha256sum`` format: ``sha256sum -c`` checks it);
- ``index.json``: written when every shard is done: the settings, the number of texts and each shard's file, size,
  SHA-256 and input indices.

A re-run skips the shards that are intact (the safetensors header parses, the tensors fit the file, the SHA-256 is
the recorded one) and explains a damaged one (truncated, a changed byte) again, with a warning;
:py:func:`load_explanations` checks every shard against the index and names a damaged one.

Texts are tokenised one by one (no special handling beyond the tokenizer's own), sorted by length (longest first,
ties in input order) and cut into batches of ``batch_size``; consecutive batches form the shards. With several
processes, shard ``k`` is done by rank ``k % world_size``; rank 0 writes the index after a barrier. The plan depends
only on the texts and the settings, so the merged result equals that of one process.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save
from tqdm.auto import tqdm

from ..core.modules import is_encoder_decoder
from ..explain import encode_texts, explain
from ..inputs.checks import model_pad_token
from ..methods.declarations import positive
from ..methods.propagation import method_of
from ..methods.registry import check_params
from ..results.explanation import Explanation

__all__ = [
    'explain_dataset',
    'load_explanations',
    'check_fingerprint',
    'check_output_dir',
    'read_texts',
    'SettingsMismatchError',
    'INDEX_FILE',
    'SETTINGS_FILE',
]

#: The index written when all shards are done.
INDEX_FILE = 'index.json'
#: The settings of the run that made a directory.
SETTINGS_FILE = 'settings.json'
FORMAT = 'zennit-attn explanations'
#: 2: shards with a SHA-256 (sidecar file and index entry)
VERSION = 2
#: bytes per element of the safetensors dtypes
_DTYPE_BYTES = {'BOOL': 1, 'U8': 1, 'I8': 1, 'I16': 2, 'F16': 2, 'BF16': 2, 'I32': 4, 'F32': 4, 'I64': 8, 'F64': 8}


class SettingsMismatchError(ValueError):
    """The output directory holds results made with other settings (or other texts, or another model)."""


# ------------------------------------------------------------------------------------------------------------ input
def read_texts(source) -> list[str]:
    """The texts of ``source``: a ``.jsonl`` file (one JSON object per line with a ``"text"`` field; blank lines are
    skipped) given as a path, or an iterable of strings.

    Parameters
    ----------
    source: str, os.PathLike or iterable of str

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        For a line that is not a JSON object with a string ``"text"``, an empty input, or a single string that is
        not a ``.jsonl`` file.
    FileNotFoundError
        For a missing file.
    """
    if isinstance(source, (str, os.PathLike)):
        texts = _read_jsonl(source)
    elif isinstance(source, Iterable):
        texts = list(source)
        bad = next((index for index, text in enumerate(texts) if not isinstance(text, str)), None)
        if bad is not None:
            raise TypeError(f'texts must all be str; item {bad} is {type(texts[bad]).__name__}')
    else:
        raise TypeError(f'texts must be an iterable of str or the path of a .jsonl file, got {type(source).__name__}')
    if not texts:
        raise ValueError('there are no texts to explain')
    return texts


def _read_jsonl(source: str | os.PathLike) -> list[str]:
    """The ``"text"`` fields of the ``.jsonl`` file ``source``, blank lines skipped; a string that does not name a
    ``.jsonl`` file (most likely a single text) is refused."""
    path = Path(source)
    if isinstance(source, str) and path.suffix != '.jsonl':
        raise ValueError(
            f'texts must be a list of texts or the path of a .jsonl file, got the string '
            f'{source[:60]!r}: pass a single text as [text]'
        )
    if not path.is_file():
        raise FileNotFoundError(f'the input file {str(path)!r} does not exist')
    texts = []
    with path.open(encoding='utf-8') as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f'{path}:{number} is not valid JSON ({error.msg})') from None
            if not isinstance(record, dict) or not isinstance(record.get('text'), str):
                raise ValueError(f'{path}:{number} must be a JSON object with a string "text" field')
            texts.append(record['text'])
    return texts


# ------------------------------------------------------------------------------------------------------------- plan
def _plan(lengths: Sequence[int], batch_size: int, shard_size: int) -> list[list[list[int]]]:
    """Shards as lists of batches of input indices: longest first (ties in input order)."""
    order = sorted(range(len(lengths)), key=lambda index: (-lengths[index], index))
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    per_shard = max(1, shard_size // batch_size)
    return [batches[start : start + per_shard] for start in range(0, len(batches), per_shard)]


def _target_per_text(target, count: int) -> list[int | None]:
    """One target per text (None: the argmax)."""
    if target is None:
        return [None] * count
    if isinstance(target, numbers.Integral) and not isinstance(target, bool):
        return [int(target)] * count
    if isinstance(target, (str, bytes)) or not isinstance(target, Iterable):
        raise ValueError(f'target must be None, an integer or one integer per text, got {target!r}')
    targets = list(target.tolist() if isinstance(target, torch.Tensor) else target)
    if len(targets) != count or not all(
        isinstance(item, numbers.Integral) and not isinstance(item, bool) for item in targets
    ):
        raise ValueError(
            f'target must be None, an integer or one integer per text ({count}); got {len(targets)} '
            'entries' + ('' if len(targets) != count else ' that are not all integers')
        )
    return [int(item) for item in targets]


def _fingerprint(model: torch.nn.Module) -> dict:
    config = getattr(model, 'config', None)
    to_json = getattr(config, 'to_json_string', None)
    text = to_json(use_diff=False) if callable(to_json) else repr(config)
    parameter = next(model.parameters(), None)
    weights = hashlib.sha256()  # a sample of up to 1024 entries of every parameter: other weights, other hash
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if tensor.is_meta:  # offloaded (accelerate): not readable here
                continue
            flat = tensor.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 1024)][:1024].double()
            weights.update(f'{name}:{float(sample.sum()):.12e}:{float(sample.abs().sum()):.12e};'.encode())
    return {
        'class': type(model).__name__,
        'dtype': None if parameter is None else str(parameter.dtype),
        'config_sha256': hashlib.sha256(text.encode()).hexdigest(),
        'weights_sha256': weights.hexdigest(),
    }


def _describe(value) -> str:
    """A parameter as recorded in the settings: its repr, or for objects whose repr is their address (composites)
    the class and attributes."""
    text = repr(value)
    if ' at 0x' in text:
        attributes = {
            key: repr(item)
            for key, item in sorted(vars(value).items())
            if not key.startswith('_') and isinstance(item, (numbers.Number, str, bool, type(None), tuple))
        }
        text = f'{type(value).__module__}.{type(value).__qualname__}({attributes})'
    return text


def _settings(model, texts, targets, method, position, batch_size, shard_size, params, checkpointing) -> dict:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode('utf-8')).digest())
    target_digest = hashlib.sha256(json.dumps(targets).encode()).hexdigest()
    return {
        'format': FORMAT,
        'version': VERSION,
        'method': method,
        'position': position,
        'batch_size': batch_size,
        'shard_size': shard_size,
        'params': {key: _describe(value) for key, value in sorted(params.items())},
        'checkpointing': checkpointing,
        'count': len(texts),
        'texts_sha256': digest.hexdigest(),
        'targets_sha256': target_digest,
        'model': _fingerprint(model),
    }


def _differing(recorded: dict, current: dict) -> list[str]:
    """The keys whose values differ between two settings dictionaries (missing keys count as None), sorted."""
    return sorted(key for key in set(recorded) | set(current) if recorded.get(key) != current.get(key))


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; a damaged file is named (ValueError) with what to do."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f'{str(path)!r} is damaged ({error}): delete the output directory and run explain_dataset() again'
        ) from error


def _check_settings(directory: Path, settings: dict, write: bool) -> None:
    path = directory / SETTINGS_FILE
    if path.exists():
        differing = _differing(read_json(path), settings)
        if differing:
            raise SettingsMismatchError(
                f'{str(directory)!r} holds explanations made with other settings (differing: {", ".join(differing)}): '
                'use another output directory, or delete this one to start again'
            )
    elif write:
        stray = sorted(path.name for path in directory.glob('shard-*.safetensors'))
        if stray:
            raise SettingsMismatchError(
                f'{str(directory)!r} holds shards ({stray[0]}, ...) but no {SETTINGS_FILE}: '
                'use an empty output directory'
            )
        _write_atomically(path, json.dumps(settings, indent=1).encode(), '.tmp')


def _shard_name(number: int) -> str:
    return f'shard-{number:05d}.safetensors'


def _write_atomically(path: Path, data: bytes, suffix: str) -> None:
    """Write ``data`` to a temporary name, then rename it to ``path``: the file appears only complete."""
    temporary = path.with_name(path.name + suffix)
    temporary.write_bytes(data)
    os.replace(temporary, path)


def _write_shard(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str], suffix: str) -> None:
    """The shard and, before it, its SHA-256 (``sha256sum`` format) next to it."""
    data = save(tensors, metadata=metadata)
    digest = hashlib.sha256(data).hexdigest()
    _write_atomically(path.with_name(path.name + '.sha256'), f'{digest}  {path.name}\n'.encode(), suffix)
    _write_atomically(path, data, suffix)


def _recorded_sha256(path: Path) -> str | None:
    """The SHA-256 recorded next to a shard when it was written (None: no or no readable record)."""
    try:
        digest = (path.with_name(path.name + '.sha256')).read_text().split()[0]
    except (OSError, UnicodeDecodeError, IndexError):
        return None
    return digest if len(digest) == 64 and all(char in '0123456789abcdef' for char in digest) else None


def _damage(path: Path, sha256: str | None) -> str | None:
    """What is wrong with a shard file, or None if it is intact: it is missing, its safetensors header does not parse,
    its tensors do not fit the file, or its SHA-256 is not ``sha256`` (None: nothing recorded)."""
    if not path.is_file():
        return 'missing'
    problem = _layout_damage(path)
    if problem is not None:
        return problem
    if sha256 is None:
        return 'no SHA-256 was recorded for it'
    digest = hashlib.sha256()
    with path.open('rb') as handle:
        for block in iter(lambda: handle.read(1 << 20), b''):
            digest.update(block)
    if digest.hexdigest() != sha256:
        return f'its SHA-256 is {digest.hexdigest()[:16]}..., not the recorded {sha256[:16]}... (changed bytes)'
    return None


def _layout_damage(path: Path) -> str | None:
    """What is wrong with the layout of the safetensors file ``path`` (None: nothing): fewer bytes than its header
    needs, a header that is not a JSON object, or tensors that do not fit the bytes after the header."""
    size = path.stat().st_size
    with path.open('rb') as handle:
        length = int.from_bytes(handle.read(8), 'little')
        if size < 8 or length > size - 8:
            return f'truncated: {size} bytes, fewer than its safetensors header needs'
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            header = None
    if not isinstance(header, dict):
        return 'its safetensors header is not a JSON object'
    return _extent_damage(header, size - 8 - length)


def _extent_damage(header: dict, data: int) -> str | None:
    """Whether the tensors of a safetensors ``header`` fill exactly the ``data`` bytes after it (None) or not: a
    malformed entry, fewer bytes than the tensors need (truncated), or bytes after them."""
    end = 0
    for name, entry in header.items():
        if name == '__metadata__':
            continue
        stop = _entry_end(entry)
        if stop is None:
            return f'its safetensors header entry {name!r} is malformed'
        end = max(end, stop)
    if end != data:
        return (
            f'truncated: its tensors need {end} bytes after the header, the file has {data}'
            if end > data
            else f'{data - end} bytes after its tensors'
        )
    return None


def _entry_end(entry) -> int | None:
    """Where the data of a safetensors header entry ends (bytes after the header), or None for a malformed entry:
    offsets missing, reversed or negative, or a size other than its shape and dtype need."""
    try:
        begin, stop = entry['data_offsets']
        fits = stop - begin == math.prod(entry['shape']) * _DTYPE_BYTES[entry['dtype']] and 0 <= begin <= stop
    except (TypeError, KeyError, ValueError):
        return None
    return stop if fits else None


def check_output_dir(output_dir: str | os.PathLike) -> Path:
    """Refuse a place where :py:func:`explain_dataset` cannot write its results, before any work is done.

    Parameters
    ----------
    output_dir: str or os.PathLike
        A directory (new, or that of an earlier run to resume it).

    Returns
    -------
    pathlib.Path
        ``output_dir``.

    Raises
    ------
    NotADirectoryError
        If ``output_dir`` or the first of its parents that exists is a file.
    PermissionError
        If that directory is not writable.
    """
    directory = Path(output_dir)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(
            f'the output directory {str(directory)!r} is a file: pass the path of a new '
            'directory, or of the directory of an earlier run to resume it'
        )
    existing = next(path for path in (directory, *directory.absolute().parents) if path.exists())
    if not existing.is_dir():
        raise NotADirectoryError(
            f'the output directory {str(directory)!r} cannot be created: {str(existing)!r} is a file'
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(
            f'the output directory {str(directory)!r} cannot be written: {str(existing)!r} is not writable'
        )
    try:  # also tried: some file systems refuse while os.access says yes (/proc, read-only mounts for root)
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix='.zennit-attn-check-'))
    except OSError as error:
        raise PermissionError(
            f'the output directory {str(directory)!r} cannot be written: {str(existing)!r} '
            f'refuses new entries ({error.strerror})'
        ) from error
    return directory


# ------------------------------------------------------------------------------------------------------ distributed
def _world(model: torch.nn.Module) -> tuple[int, int, bool]:
    """``(rank, world_size, created)``: from an initialised ``torch.distributed``, or initialised here from the
    environment of ``torchrun`` / ``accelerate launch`` (``WORLD_SIZE`` > 1; gloo for CPU models, nccl for GPU
    models)."""
    if not torch.distributed.is_available():
        return 0, 1, False
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size(), False
    if int(os.environ.get('WORLD_SIZE', '1')) > 1:
        parameter = next(model.parameters(), None)
        cuda = parameter is not None and parameter.device.type == 'cuda'
        torch.distributed.init_process_group(backend='nccl' if cuda else 'gloo')
        return torch.distributed.get_rank(), torch.distributed.get_world_size(), True
    return 0, 1, False


# ------------------------------------------------------------------------------------------------------------ run
def _row(explanation: Explanation, row: int, index: int) -> dict[str, torch.Tensor]:
    """The tensors of one text, padding removed (encoder positions counted in the unpadded text; decoder positions
    as they are)."""
    mask = explanation.attention_mask
    keep = torch.ones_like(explanation.input_ids[row], dtype=torch.bool) if mask is None else mask[row] != 0
    tensors = {
        f'{index}.input_ids': explanation.input_ids[row][keep],
        f'{index}.relevance': explanation.relevance[row][keep.to(explanation.relevance.device)],
        f'{index}.target': explanation.target[row].reshape(1),
        f'{index}.logit': explanation.logit[row].reshape(1),
    }
    if explanation.position is not None:
        position = int(explanation.position[row])
        if explanation.decoder_input_ids is None:
            position = int(keep[:position].sum())
        tensors[f'{index}.position'] = torch.tensor([position])
    if explanation.decoder_relevance is not None:
        tensors[f'{index}.decoder_input_ids'] = explanation.decoder_input_ids[row]
        tensors[f'{index}.decoder_relevance'] = explanation.decoder_relevance[row]
    if explanation.position_relevance is not None:  # PA-LRP
        positions = explanation.position_relevance[row]
        tensors[f'{index}.position_relevance'] = positions[keep.to(positions.device)]
    if explanation.decoder_position_relevance is not None:  # PA-LRP of an encoder-decoder model: the decoder's
        tensors[f'{index}.decoder_position_relevance'] = explanation.decoder_position_relevance[row]
    return {key: value.detach().cpu().contiguous() for key, value in tensors.items()}


class _Batches:
    """The :py:func:`~zennit_attn.explain` calls of one :py:func:`explain_dataset` run: the texts, their targets and
    token counts, and the arguments every call gets; :py:meth:`explain` explains one batch of texts."""

    def __init__(self, model, tokenizer, texts: list[str], targets: list, lengths: list[int], options: dict):
        self.model, self.tokenizer, self.texts, self.targets, self.lengths = model, tokenizer, texts, targets, lengths
        #: method, position, checkpointing and the method's parameters
        self.options = options
        self.encoder_decoder = is_encoder_decoder(model)

    def explain(self, batch: list[int]) -> dict[str, torch.Tensor]:
        """The tensors (:py:func:`_row`) of the texts ``batch`` (input indices), from one explain() call."""
        encoding = encode_texts(self.tokenizer, [self.texts[index] for index in batch], model_pad_token(self.model))
        targets = [self.targets[index] for index in batch]
        options = dict(self.options, position=self.positions(encoding['attention_mask'], batch))
        explanation = explain(
            self.model,
            encoding,
            target=None if all(item is None for item in targets) else targets,
            **options,
        )
        tensors = {}
        for row, index in enumerate(batch):
            tensors.update(_row(explanation, row, index))
        return tensors

    def positions(self, mask: torch.Tensor, batch: list[int]):
        """The explained position of each row: ``position`` counted in each text's own tokens (after its left
        padding), or for an encoder-decoder model the decoder position, the same for every row."""
        position = self.options['position']
        if self.encoder_decoder:
            return position
        starts = [int((row != 0).nonzero()[0]) for row in mask]
        return [start + (position % self.lengths[index]) for start, index in zip(starts, batch)]


def _prepare_directory(directory: Path, settings: dict, rank: int, world: int) -> None:
    """Rank 0 makes the output directory and writes its settings (or refuses it: other settings, shards without
    settings, a file system error); every rank then checks the settings."""
    refusal = [None]
    if rank == 0:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            _check_settings(directory, settings, write=True)
        except (SettingsMismatchError, OSError) as error:
            refusal = [f'{type(error).__name__}: {error}']
            if world == 1:
                raise
    if world > 1:  # every rank gets rank 0's refusal (instead of waiting for it at a barrier)
        torch.distributed.broadcast_object_list(refusal, src=0)
        if refusal[0] is not None:
            raise SettingsMismatchError(f'rank 0 refused the output directory: {refusal[0]}')
    _check_settings(directory, settings, write=False)


def _shards_to_do(directory: Path, count: int, rank: int, world: int) -> list[int]:
    """The numbers of this rank's shards (every ``world``-th from ``rank``) that are not written or not intact; a
    damaged one is named in a warning (at the caller of :py:func:`explain_dataset`)."""
    todo = []
    for number in range(rank, count, world):
        path = directory / _shard_name(number)
        problem = _damage(path, _recorded_sha256(path))
        if problem not in (None, 'missing'):
            warnings.warn(f'{str(path)!r} is damaged ({problem}): explaining its texts again', stacklevel=3)
        if problem is not None:
            todo.append(number)
    return todo


def _explain_shards(batches: _Batches, plan: list, todo: list[int], directory: Path, rank: int, progress: bool):
    """Explain the shards ``todo`` of ``plan`` batch by batch, and write each shard as soon as it is done."""
    method = batches.options['method']
    with tqdm(
        total=sum(len(batch) for number in todo for batch in plan[number]),
        unit='text',
        disable=not progress or rank != 0,
        desc=f'explaining ({method})',
    ) as bar:
        for number in todo:
            tensors = {}
            for batch in plan[number]:
                tensors.update(batches.explain(batch))
                bar.update(len(batch))
            items = [index for batch in plan[number] for index in batch]  # one metadata key: the same bytes every run
            _write_shard(
                directory / _shard_name(number),
                tensors,
                {'zennit-attn': json.dumps({'method': method, 'items': items})},
                f'.tmp{rank}',
            )


def _write_index(directory: Path, plan: list, settings: dict, count: int) -> None:
    """The index of a finished run (rank 0, once every rank's shards are written): the settings, the number of texts
    and each shard's file, size, SHA-256 and input indices."""
    paths = [directory / _shard_name(number) for number in range(len(plan))]
    digests = [_recorded_sha256(path) for path in paths]
    missing = [path.name for path, digest in zip(paths, digests) if digest is None or not path.is_file()]
    if missing:
        raise RuntimeError(f'shards {missing[:5]} of {str(directory)!r} were not written by their ranks')
    index = {
        'format': FORMAT,
        'version': VERSION,
        'settings': settings,
        'count': count,
        'shards': [
            {
                'file': path.name,
                'bytes': path.stat().st_size,
                'sha256': digest,
                'items': [item for batch in shard for item in batch],
            }
            for path, digest, shard in zip(paths, digests, plan)
        ],
    }
    _write_atomically(directory / INDEX_FILE, json.dumps(index).encode(), '.tmp')


def explain_dataset(
    model: torch.nn.Module,
    tokenizer,
    texts,
    output_dir: str | os.PathLike,
    batch_size: int = 8,
    method: str | None = None,
    target=None,
    position: int = -1,
    shard_size: int = 256,
    checkpointing: bool = False,
    progress: bool = True,
    **params,
) -> Path:
    """Explain every text of a dataset with :py:func:`~zennit_attn.explain` and write the results to ``output_dir``
    (see :py:mod:`zennit_attn.workflows.dataset` for the format); read them with :py:func:`load_explanations`.

    Texts are sorted by length and explained ``batch_size`` at a time (little padding); every ``shard_size`` texts
    are written as one safetensors shard as soon as they are done. A second call on the same directory resumes:
    shards already written and intact are skipped (a damaged one is explained again, with a warning); a directory
    made with other settings is refused. Under ``torchrun`` or ``accelerate launch`` (``torch.distributed``
    initialised, or ``WORLD_SIZE`` > 1 in the environment, which initialises it with gloo on CPU and nccl on GPUs),
    each process does every ``world_size``-th shard and rank 0 writes the index once all are done.

    Parameters
    ----------
    model: torch.nn.Module
        A language model in eval mode, as for :py:func:`~zennit_attn.explain`.
    tokenizer
        Its Hugging Face tokenizer.
    texts: iterable of str, or str / os.PathLike of a ``.jsonl`` file
        The texts; a file holds one JSON object per line with a ``"text"`` field.
    output_dir: str or os.PathLike
        Created if missing.
    batch_size: int
        Texts per :py:func:`~zennit_attn.explain` call.
    method: str, optional
        As for :py:func:`~zennit_attn.explain` (default the LRP method of ``composite=``, ``'attnlrp'`` without one).
    target: None, int or sequence of int
        None: the argmax; an int for every text, or one per text (in input order).
    position: int
        The explained position, counted in each text's own tokens (-1, the default: its last token).
    shard_size: int
        Texts per shard (rounded down to whole batches, at least one batch).
    checkpointing: bool
        As for :py:func:`~zennit_attn.explain`.
    progress: bool
        Show a tqdm progress bar (on rank 0).
    **params
        The method's hyperparameters and ``composite``, as for :py:func:`~zennit_attn.explain` (checked by
        :py:func:`~zennit_attn.methods.registry.check_params` before any work, and recorded in the settings).

    Returns
    -------
    pathlib.Path
        ``output_dir``.

    Raises
    ------
    SettingsMismatchError
        If ``output_dir`` holds results made with other settings, texts or model.
    NotADirectoryError, PermissionError
        If ``output_dir`` is a file or cannot be written (see :py:func:`check_output_dir`).
    ValueError, TypeError
        For bad arguments (before any text is explained).
    """
    batch_size = positive(batch_size, 'batch_size')
    shard_size = positive(shard_size, 'shard_size')
    if isinstance(position, bool) or not isinstance(position, numbers.Integral):
        raise ValueError(f"position must be an integer (counted in each text's tokens), got {position!r}")
    position = int(position)
    method = method_of(method, params.get('composite'))
    params = check_params(method, params)  # names and values, before any work
    directory = check_output_dir(output_dir)
    texts = read_texts(texts)
    targets = _target_per_text(target, len(texts))
    lengths = _token_counts(tokenizer, texts)
    options = dict(method=method, position=position, checkpointing=checkpointing, **params)
    batches = _Batches(model, tokenizer, texts, targets, lengths, options)
    _check_position(position, lengths, batches.encoder_decoder)
    plan = _plan(lengths, batch_size, shard_size)
    settings = _settings(model, texts, targets, method, position, batch_size, shard_size, params, checkpointing)
    rank, world, created = _world(model)
    try:
        _prepare_directory(directory, settings, rank, world)
        todo = _shards_to_do(directory, len(plan), rank, world)
        _explain_shards(batches, plan, todo, directory, rank, progress)
        if world > 1:
            torch.distributed.barrier()
        if rank == 0:
            _write_index(directory, plan, settings, len(texts))
        if world > 1:
            torch.distributed.barrier()
    finally:
        if created:
            torch.distributed.destroy_process_group()
    return directory


def _token_counts(tokenizer, texts: list[str]) -> list[int]:
    """The number of tokens of each text (tokenised alone); a text without tokens is refused."""
    encoded = [tokenizer(text)['input_ids'] for text in texts]
    empty = next((index for index, ids in enumerate(encoded) if len(ids) == 0), None)
    if empty is not None:
        raise ValueError(f'text {empty} ({texts[empty][:60]!r}) gives no tokens: nothing to explain in it')
    return [len(ids) for ids in encoded]


def _check_position(position: int, lengths: list[int], encoder_decoder: bool) -> None:
    """Refuse a position outside a text (counted in its own tokens); for an encoder-decoder model it is a decoder
    position, which the texts do not bound."""
    short = next((index for index, length in enumerate(lengths) if not -length <= position < length), None)
    if short is not None and not encoder_decoder:
        raise ValueError(f'position {position} is out of range for text {short}, which has {lengths[short]} tokens')


def check_fingerprint(directory: str | os.PathLike, model: torch.nn.Module) -> None:
    """Refuse a model other than the one that made the explanations in ``directory`` (class, dtype, configuration
    and a sample of every weight, as recorded in its settings), e.g. before evaluating them with the model.

    Parameters
    ----------
    directory: str or os.PathLike
        An :py:func:`explain_dataset` output.
    model: torch.nn.Module

    Raises
    ------
    FileNotFoundError
        If ``directory`` has no settings (not an :py:func:`explain_dataset` output).
    SettingsMismatchError
        If the model differs; the message names what differs.
    """
    path = Path(directory) / SETTINGS_FILE
    if not path.is_file():
        raise FileNotFoundError(f'{str(directory)!r} has no {SETTINGS_FILE}: not an explain_dataset() output')
    differing = _differing(read_json(path).get('model', {}), _fingerprint(model))
    if differing:
        raise SettingsMismatchError(
            f'{str(directory)!r} was made with another model than this {type(model).__name__} (differing: '
            f'{", ".join(differing)}): load the model the explanations were made with'
        )


def load_explanations(directory: str | os.PathLike, tokenizer=None) -> list[Explanation]:
    """The explanations written by :py:func:`explain_dataset`, in input order, one :py:class:`Explanation` (batch
    of one, no padding) per text.

    Parameters
    ----------
    directory: str or os.PathLike
    tokenizer: optional
        Stored on each explanation (for ``show``, ``to_html``, ``save``).

    Returns
    -------
    list of Explanation

    Raises
    ------
    FileNotFoundError
        If ``directory`` has no index (missing, or the run is not finished: run it again to resume).
    ValueError
        If the index is not one this version reads, a shard is damaged (missing, truncated, or bytes changed since
        it was written: the message names the file; running :py:func:`explain_dataset` again with the same
        arguments explains its texts again), or a shard lacks an entry.
    """
    directory = Path(directory)
    path = directory / INDEX_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f'{str(directory)!r} has no {INDEX_FILE}: not an explain_dataset() output, or the run '
            'is not finished (run explain_dataset again on it to resume)'
        )
    index = read_json(path)
    if index.get('format') != FORMAT or index.get('version') != VERSION:
        raise ValueError(f'{str(path)!r} is not a {FORMAT} index of version {VERSION}')
    method = index['settings']['method']
    explanations: list[Explanation | None] = [None] * index['count']
    for shard in index['shards']:
        for item, explanation in _shard_explanations(directory, shard, method, tokenizer).items():
            explanations[item] = explanation
    missing = [number for number, explanation in enumerate(explanations) if explanation is None]
    if missing:
        raise ValueError(f'the index of {str(directory)!r} misses texts {missing[:5]}')
    return explanations


def _shard_explanations(directory: Path, shard: dict, method: str, tokenizer) -> dict[int, Explanation]:
    """The explanations in one shard (its entry of the index), by input index; a damaged shard is refused first."""
    path = directory / shard['file']
    problem = _damage(path, shard['sha256'])
    if problem is not None:
        raise ValueError(
            f'{str(path)!r} is damaged ({problem}): run explain_dataset() again '
            'with the same arguments on the directory to explain its texts again'
        )
    with safe_open(str(path), framework='pt') as handle:
        keys = set(handle.keys())
        return {
            item: _item_explanation(handle, keys, item, shard['file'], method, tokenizer) for item in shard['items']
        }


def _item_explanation(handle, keys: set[str], item: int, file: str, method: str, tokenizer) -> Explanation:
    """The :py:class:`Explanation` (batch of one) of text ``item`` in an open shard whose tensor names are ``keys``;
    its tensors are copies, not mapped from the file."""

    def get(field):
        key = f'{item}.{field}'
        return handle.get_tensor(key)[None].clone() if key in keys else None  # not mapped

    if f'{item}.relevance' not in keys:
        raise ValueError(f'{file} lacks the explanation of text {item}')
    position = get('position')
    return Explanation(
        relevance=get('relevance'),
        embedding_relevance=None,
        target=get('target')[:, 0],
        logit=get('logit')[:, 0],
        position=None if position is None else position[:, 0],
        input_ids=get('input_ids'),
        decoder_relevance=get('decoder_relevance'),
        decoder_input_ids=get('decoder_input_ids'),
        method=method,
        tokenizer=tokenizer,
        position_relevance=get('position_relevance'),
        decoder_position_relevance=get('decoder_position_relevance'),
    )
