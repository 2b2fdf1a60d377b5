"""Group runs under a review's attacks (issue 12): the slot lease keeps
covering every member in flight whatever the sweep left of the chain."""

from __future__ import annotations

import os

import vsqs
from vsqs._core import format as _format


def newest_lease(queue: vsqs.Queue, group: str) -> int:
    """The UNTIL of the newest generation of the group's slot 0 (0 if free)."""
    directory = os.path.join(queue.path, _format.GROUPS_DIR)
    gens = [p[2] for p in map(_format.parse_lease_name, os.listdir(directory))
            if p and p[0] == _format.group_hash(group) and p[1] == 0]
    with open(os.path.join(directory, _format.lease_name(_format.group_hash(group), 0, max(gens))), "rb") as f:
        return _format.decode_lease(f.read())


def until_of(message: vsqs.Message) -> int:
    return _format.parse_receipt(message.queue.id, message.receipt)[0].until_us


def test_an_extension_from_generation_1_after_a_sweep_raises_the_newest_lease(queue):
    # A run taken at generation 1 (a group's first claim): one member raises
    # the lease three times (generations 2..4), the sweep removes 2 and 3 (it
    # keeps 1 and the newest). A member whose receipt still says generation 1
    # must raise the newest lease, not recreate generation 2 beside it: else
    # the newest lease runs out while that member is in flight, and another
    # receiver takes the group.
    queue.publish_batch(["a0", "a1", "a2"], group="g")
    first, second, _ = queue.receive_batch(10, visibility_timeout=100, group_runs=True)
    for timeout in (200, 300, 400):
        second.change_visibility(timeout)
    assert queue._groups.sweep(grace=0) == 2
    other = vsqs.Queue(queue.path)  # (a handle that knows nothing of the chain: it reads it from the receipt on)
    receipt = other.change_visibility(first.receipt, 1000)
    assert newest_lease(queue, "g") >= _format.parse_receipt(queue.id, receipt)[0].until_us
    assert newest_lease(queue, "g") >= until_of(second)
