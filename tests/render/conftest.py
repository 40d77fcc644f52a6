"""A real headless browser for the HTML tests: Debian's ``chromium``, installed with apt where it is missing and this
runs as root (once per session, a few minutes at most), else the tests that need it are skipped with the reason."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

#: what every headless run gets: no sandbox (root in a container), no GPU, no network chatter, a fresh profile
CHROMIUM_FLAGS = ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
                  '--disable-sync', '--no-first-run', '--hide-scrollbars']


def _find() -> str | None:
    return next((path for path in map(shutil.which, ('chromium', 'chromium-browser')) if path), None)


def _install() -> str:
    """Install Debian's chromium with apt-get, or say why not."""
    if not hasattr(os, 'geteuid') or os.geteuid() != 0:
        return 'chromium is not installed and installing it needs root (apt-get install -y chromium)'
    if not shutil.which('apt-get'):
        return 'chromium is not installed and there is no apt-get to install it'
    environment = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    command = ['apt-get', 'install', '-y', '--no-install-recommends', 'chromium']
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=420, env=environment)
        if result.returncode != 0:  # the package lists may be missing: update once and try again
            subprocess.run(['apt-get', 'update'], capture_output=True, text=True, timeout=300, env=environment)
            result = subprocess.run(command, capture_output=True, text=True, timeout=420, env=environment)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f'installing chromium failed: {error}'
    if result.returncode != 0:
        return f'apt-get install chromium failed: {result.stderr.strip()[-300:]}'
    return ''


@pytest.fixture(scope='session')
def chromium() -> str:
    """The path of a chromium binary (installed if needed and possible); skips the test otherwise."""
    path = _find()
    if path is None:
        reason = _install()
        path = _find()
        if path is None:
            pytest.skip(reason or 'chromium could not be installed')
    return path
