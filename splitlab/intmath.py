"""Integer helpers with the exact semantics of the upstream languages (C++, Mojo, Python).

The planner ports, the wave model and the kernels import these instead of re-deriving them, so that one
definition of ``cdiv`` and ``next_power_of_two`` is diffed against upstream once. No splitlab import: the bottom layer.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division ``(a + b - 1) // b`` for positive ``b`` (C++ ``cdiv``, Mojo ``ceildiv``)."""
    return -(-a // b)


def next_power_of_two(n: int) -> int:
    """Smallest power of two ``>= n``; 1 for ``n <= 1`` (Mojo ``next_power_of_two``, ``triton.next_power_of_2``)."""
    if n <= 1:
        return 1
    return 1 << (n - 1).bit_length()


def clamp(v: int, lo: int, hi: int) -> int:
    """Mojo ``clamp(v, lo, hi) = max(min(v, hi), lo)``."""
    return max(min(v, hi), lo)
