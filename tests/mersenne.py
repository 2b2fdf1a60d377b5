"""An attacker's tool, for the tests that show it no longer works: rebuild a
Python ``random.Random`` (Mersenne Twister) from 624 consecutive 32-bit
outputs, here read off published vsqs message ids, and predict what the
generator draws next.

Used by tests/core/test_receipt_forgery.py and
tests/gateway/test_hardening_access.py.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

STATE_WORDS = 624  # the Mersenne Twister's state: this many 32-bit outputs rebuild it
KEYS_NEEDED = STATE_WORDS // 2  # a key's RAND is getrandbits(64): two outputs


def _undo_right(y: int, shift: int) -> int:
    x = y
    for _ in range(32 // shift + 1):
        x = y ^ (x >> shift)
    return x & 0xFFFFFFFF


def _undo_left(y: int, shift: int, mask: int) -> int:
    x = y
    for _ in range(32 // shift + 1):
        x = y ^ ((x << shift) & mask)
    return x & 0xFFFFFFFF


def untemper(output: int) -> int:
    """The state word behind one 32-bit output (the tempering undone)."""
    y = _undo_right(output, 18)
    y = _undo_left(y, 15, 0xEFC60000)
    y = _undo_left(y, 7, 0x9D2C5680)
    return _undo_right(y, 11)


def outputs_of_keys(keys: Iterable[str]) -> list[int]:
    """The 32-bit outputs behind the RAND part of message ids, in draw order
    (``getrandbits(64)`` puts its first output in the low 32 bits)."""
    outputs: list[int] = []
    for key in keys:
        rand = int(key.rsplit("-", 1)[1], 16)
        outputs += [rand & 0xFFFFFFFF, rand >> 32]
    return outputs


def clone(outputs: list[int]) -> random.Random:
    """A generator in the state the one that drew ``outputs`` (the last 624) is in now."""
    assert len(outputs) >= STATE_WORDS
    state = tuple(untemper(o) for o in outputs[-STATE_WORDS:])
    twin = random.Random()
    twin.setstate((3, (*state, STATE_WORDS), None))
    return twin


def next_tag_after(keys: list[str]) -> str:
    """The TAG the generator that made ``keys`` would give the next hidden name
    (``getrandbits(48)`` as 12 hex digits), if tags came from it."""
    return f"{clone(outputs_of_keys(keys)).getrandbits(48):012x}"
