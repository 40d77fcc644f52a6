"""Write constraints.txt from the `pip freeze --all --exclude-editable` of fresh installs on the tested interpreters.

Usage (what `make constraints` runs)::

    python3 .ci/constraints.py constraints.txt 3.11=freeze-3.11.txt 3.12=freeze-3.12.txt

Each freeze is tagged with the Python version it was made with, the oldest first. A package with the same version in
every freeze is pinned without a marker; one whose version differs (zennit: 0.5.1 on 3.11, 1.0.0 on 3.12), or that
only some interpreters install, gets one line per interpreter with an environment marker: the oldest interpreter's
pin holds below the next tested version (``python_version < "3.12"``), the newest one's from its own version on.
"""
from __future__ import annotations

import re
import sys

HEADER = """\
# Tested versions of everything `make install`, `make docs` and CI (.ci/run) install: pip -c constraints.txt (and
# --build-constraint for the build of the package itself), so that a new release on PyPI changes nothing until it is
# tested. The tested matrix (README): Python 3.11 with zennit 0.5.1, Python 3.12 with zennit 1.0.0; the markers
# pick each interpreter's versions (zennit 1.0.0 needs Python >= 3.11.11).
#
# Update it on purpose, never by hand: `make constraints` installs the package with every extra into fresh
# environments on both interpreters without constraints (the newest versions PyPI serves), writes their `pip freeze`
# here (.ci/constraints.py adds the markers), then run CI (.ci/run: the suite on both stacks, the docs) and
# `make supported-models`, and commit this file with what changed (the supported-models page, fixes).
"""


def read_freeze(path: str) -> dict[str, str]:
    """``{normalised name: 'Name==version'}`` of a ``pip freeze`` output (comments and editable lines skipped)."""
    pins = {}
    with open(path, encoding='utf-8') as file:
        for line in file:
            line = line.strip()
            if not line or line.startswith('#') or line.startswith('-e'):
                continue
            if '==' not in line:
                raise ValueError(f'{path}: not a pinned requirement: {line!r} (install from an index, not a path)')
            name = line.split('==', 1)[0].strip()
            pins[re.sub(r'[-_.]+', '-', name).lower()] = line
    return pins


def markers(versions: list[str]) -> list[str]:
    """The environment marker of each interpreter's pins: from its version up to the next tested one."""
    result = []
    for index, version in enumerate(versions):
        lower = f'python_version >= "{version}"' if index else ''
        upper = f'python_version < "{versions[index + 1]}"' if index + 1 < len(versions) else ''
        result.append(' and '.join(part for part in (lower, upper) if part))
    return result


def merge(freezes: list[tuple[str, dict[str, str]]]) -> list[str]:
    """The constraint lines of the tagged freezes, sorted by name."""
    conditions = markers([version for version, _ in freezes])
    lines = []
    for name in sorted(set().union(*(pins for _, pins in freezes))):
        pinned = [pins.get(name) for _, pins in freezes]
        if all(pin is not None for pin in pinned) and len(set(pinned)) == 1:
            lines.append(pinned[0])
            continue
        lines.extend(f'{pin} ; {condition}' for pin, condition in zip(pinned, conditions) if pin is not None)
    return lines


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not all('=' in argument for argument in argv[1:]):
        raise SystemExit('usage: python3 .ci/constraints.py OUTPUT VERSION=FREEZE [VERSION=FREEZE ...]')
    freezes = []
    for argument in argv[1:]:
        version, path = argument.split('=', 1)
        freezes.append((version, read_freeze(path)))
    freezes.sort(key=lambda item: tuple(int(part) for part in item[0].split('.')))
    with open(argv[0], 'w', encoding='utf-8') as file:
        file.write(HEADER)
        file.write('\n'.join(merge(freezes)) + '\n')


if __name__ == '__main__':
    main(sys.argv[1:])
