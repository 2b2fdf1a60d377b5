"""The lease keeper, through its interface: hold, extend_due, settle, start/stop.

Rounds are driven by hand with ``extend_due(now=...)`` (no sleeping, no
timing); one test runs the keeper's own thread and waits for what it does.
"""

from __future__ import annotations

import threading
import time

import pytest

import vsqs
from vsqs._core.leases import LeaseKeeper

LONG = 600.0  # a keeper's visibility timeout that no test outlives


class Flaky:
    """A received message whose next ``failures`` extensions raise ``error``."""

    def __init__(self, message: vsqs.Message, failures: int = 0, error: Exception | None = None) -> None:
        self.message = message
        self.id = message.id
        self.failures = failures
        self.error = error or vsqs.StorageError("a passing I/O error")
        self.calls: list[float] = []
        self.called = threading.Event()

    def change_visibility(self, seconds: float) -> str:
        self.calls.append(seconds)
        self.called.set()
        if self.failures:
            self.failures -= 1
            raise self.error
        return self.message.change_visibility(seconds)


def _received(queue: vsqs.Queue, body: bytes = b"job") -> vsqs.Message:
    queue.publish(body)
    message = queue.receive(visibility_timeout=5)
    assert message is not None
    return message


def _due(keeper: LeaseKeeper) -> float:
    """A monotonic time at which every lease held now is due."""
    return time.monotonic() + keeper.visibility_timeout


def test_a_lease_is_extended_once_half_of_it_has_passed(queue):
    message = Flaky(_received(queue))
    keeper = LeaseKeeper(LONG)
    keeper.hold(message)
    keeper.extend_due()
    assert message.calls == []  # just received: not due
    first = message.message.receipt
    now = time.monotonic() + LONG / 2
    keeper.extend_due(now)
    assert message.calls == [LONG] and message.message.receipt != first
    [info] = queue.messages()
    assert info.state == "in_flight" and info.visible_at > time.time() + LONG / 2
    keeper.extend_due(now + LONG / 4)  # extended a moment ago: not due again yet
    assert message.calls == [LONG]
    keeper.extend_due(now + LONG / 2)
    assert message.calls == [LONG, LONG]


def test_a_settled_message_is_no_longer_held(queue):
    message = _received(queue)
    keeper = LeaseKeeper(LONG)
    keeper.hold(message)
    assert message in keeper
    assert keeper.settle(message, message.delete) is True
    assert message not in keeper and queue.stats().total == 0
    keeper.extend_due(_due(keeper))  # nothing held: nothing to extend


def test_a_storage_error_keeps_the_message_for_the_next_round(queue):
    message = Flaky(_received(queue), failures=2)
    keeper = LeaseKeeper(LONG)
    keeper.hold(message)
    first = message.message.receipt
    keeper.extend_due(_due(keeper))
    keeper.extend_due(_due(keeper))
    assert len(message.calls) == 2 and message in keeper  # still ours
    assert message.message.receipt == first
    keeper.extend_due(_due(keeper))  # the trouble passed
    assert len(message.calls) == 3 and message.message.receipt != first
    assert keeper.settle(message, message.message.delete) is True
    assert queue.stats().total == 0


def test_a_stale_receipt_drops_the_message_and_the_settle_says_lost(queue):
    message = _received(queue)
    keeper = LeaseKeeper(LONG)
    keeper.hold(message)
    vsqs.Queue(queue.path).delete(message.receipt)  # settled behind the keeper's back
    keeper.extend_due(_due(keeper))
    assert message not in keeper
    assert keeper.settle(message, message.delete) is False


def test_a_lease_lost_to_another_consumer_is_dropped(queue):
    flaky = Flaky(_received(queue), failures=1, error=vsqs.StaleReceipt("re-delivered"))
    keeper = LeaseKeeper(LONG)
    keeper.hold(flaky)
    keeper.extend_due(_due(keeper))
    assert flaky not in keeper
    keeper.extend_due(_due(keeper))
    assert len(flaky.calls) == 1  # not tried again


def test_settle_lets_other_errors_through_and_holds_no_more(queue):
    message = _received(queue)
    keeper = LeaseKeeper(LONG)
    keeper.hold(message)

    def broken() -> None:
        raise vsqs.StorageError("cannot delete")

    with pytest.raises(vsqs.StorageError):
        keeper.settle(message, broken)
    assert message not in keeper


def test_the_keepers_thread_extends_until_stopped(queue):
    # an unexpected error in one round does not end the keeper's thread
    message = Flaky(_received(queue), failures=1, error=RuntimeError("a bug"))
    with LeaseKeeper(0.2) as keeper:
        keeper.hold(message)
        assert message.called.wait(60)
        message.called.clear()
        assert message.called.wait(60)  # a second round, after the failed one
        assert message in keeper
    assert not [t for t in threading.enumerate() if t.name == "vsqs-lease-keeper"]


def test_a_keeper_needs_a_positive_timeout():
    with pytest.raises(vsqs.InvalidArgument, match="visibility_timeout"):
        LeaseKeeper(0)
