"""The one comparison of numbers the tests share: a relative error and the assertion built on it.

:py:func:`assert_close` checks ``max|actual - expected| <= tol * max|expected|`` over whole tensors: one scale for
all entries (the largest relevance), so that entries near zero, which carry rounding of the large ones, do not need
an absolute tolerance of their own. Both tensors must have one shape (no broadcasting hides a missing dimension),
and ``expected`` must not be all zeros: a comparison with zeros is relative to nothing, and a test of a
computation that gives zeros asserts ``== 0`` instead.
"""

from __future__ import annotations

import torch

__all__ = ['relative_error', 'assert_close']


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|actual - expected| / max|expected|`` as a float (detached; infinite where ``expected`` is all 0)."""
    actual, expected = actual.detach(), expected.detach()
    scale = float(expected.abs().max())
    error = float((actual - expected).abs().max())
    return error / scale if scale > 0 else float('inf')


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-10) -> None:
    """Assert that ``actual`` equals ``expected`` to the relative tolerance ``tol`` of the largest ``|expected|``.

    Parameters
    ----------
    actual, expected: torch.Tensor
        Tensors of one shape; ``expected`` holds a non-zero entry.
    tol: float
        Largest allowed ``max|actual - expected| / max|expected|`` (default 1e-10: float64 after a few dozen
        operations).

    Raises
    ------
    AssertionError
        For different shapes, an all-zero ``expected``, or a relative error above ``tol``; the message gives the
        error and both tensors.
    """
    assert actual.shape == expected.shape, f'shapes differ: {tuple(actual.shape)} != {tuple(expected.shape)}'
    assert float(expected.detach().abs().max()) > 0, 'expected is all zeros: a relative comparison cannot fail'
    error = relative_error(actual, expected)
    assert error <= tol, f'relative error {error:.3g} > {tol:.3g}\nactual:   {actual}\nexpected: {expected}'
