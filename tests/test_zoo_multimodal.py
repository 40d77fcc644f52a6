"""The zoo walk over the image-text-to-text and masked-LM mappings (see ``test_zoo.py``)."""
from __future__ import annotations

import pytest

from tests.test_zoo import check_mapping


@pytest.mark.parametrize('mapping', ['image-text-to-text', 'masked-lm'])
def test_zoo(mapping):
    check_mapping(mapping)
