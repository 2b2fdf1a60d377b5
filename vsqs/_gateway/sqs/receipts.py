"""Receipt handles that outlive a visibility change.

SQS keeps a receipt handle across ChangeMessageVisibility; vsqs renames the
message and hands out a new receipt. :class:`ReceiptAliases` bridges the two.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from vsqs import Queue, StaleReceipt

T = TypeVar("T")


class ReceiptAliases:
    """SQS keeps a receipt handle across ChangeMessageVisibility; vsqs renames
    the message and hands out a new receipt. This maps a handle a client holds
    to its message's current receipt, in this process (bounded, oldest dropped)."""

    def __init__(self, capacity: int = 65536) -> None:
        self._current: OrderedDict[str, str] = OrderedDict()
        self._capacity = capacity

    def current(self, handle: str) -> str:
        return self._current.get(handle, handle)

    def moved(self, handle: str, receipt: str) -> None:
        self._current[handle] = receipt
        self._current.move_to_end(handle)
        while len(self._current) > self._capacity:
            self._current.popitem(last=False)

    def settled(self, handle: str) -> None:
        self._current.pop(handle, None)

    def follow(self, queue: Queue, handle: str, action: Callable[[str], T]) -> T:
        """``action(receipt)`` on the receipt that holds ``handle``'s message now
        (blocking: call it on the thread pool). This process's memory answers
        first; if the message moved elsewhere (another gateway, another worker),
        :meth:`vsqs.Queue.current_receipt` finds it with one listing."""
        receipt = self.current(handle)
        try:
            return action(receipt)
        except StaleReceipt:
            current = queue.current_receipt(handle)  # StaleReceipt again if it is gone
            if current == receipt:
                raise
            return action(current)
