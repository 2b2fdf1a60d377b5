"""What a handle remembers of the receipts it issued, and the one wording of
a stale receipt."""

from __future__ import annotations

from vsqs._core.format import SlotRef

KEPT = 1024  # receipts a handle remembers parsed (two generations of this many)


class IssuedReceipts:
    """Receipts this handle issued, with what delete needs from them, so that a
    delete of a receipt just received does not parse it again. Bounded: two
    generations of ``size`` entries; older receipts are simply parsed.

    Only an exact receipt string this handle made is found here, so nothing
    foreign gets past validation; a stale one is caught, as always, by the
    system call that fails on its name.
    """

    __slots__ = ("new", "old", "size")

    def __init__(self, size: int | None = None) -> None:
        self.size = KEPT if size is None else size  # (the module's, looked up now: a test seam)
        self.new: dict[str, tuple[str, SlotRef | None]] = {}
        self.old: dict[str, tuple[str, SlotRef | None]] = {}

    def add(self, receipt: str, name: str, slot: SlotRef | None) -> None:
        if len(self.new) >= self.size:
            self.old, self.new = self.new, {}  # each step is atomic: safe across threads
        self.new[receipt] = (name, slot)

    def take(self, receipt: str) -> tuple[str, SlotRef | None] | None:
        """(hidden name, slot) of a receipt issued here, forgotten as it is taken."""
        found = self.new.pop(receipt, None)
        return found if found is not None else self.old.pop(receipt, None)

    def __len__(self) -> int:
        return len(self.new) + len(self.old)


def stale_message(key: str) -> str:
    """The text of :class:`StaleReceipt` for the message ``key``."""
    return (
        f"receipt for message {key} is stale: the message was deleted, its visibility "
        "was changed with this receipt already, or its lease ran out and it was received again"
    )
