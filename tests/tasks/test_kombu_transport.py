"""The ``vsqs://`` kombu transport through kombu's own API (no Celery, no worker):
what each AMQP operation does to the vsqs queue underneath."""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

kombu = pytest.importorskip("kombu")

import vsqs  # noqa: E402
import vsqs.kombu  # noqa: E402,F401  (registers vsqs://)
from vsqs._core.limits import MAX_DELAY  # noqa: E402
from vsqs.kombu import eta_delay, spool_path  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def spool(tmp_path):
    return tmp_path / "spool"


def connect(spool, **options):
    return kombu.Connection(f"vsqs://{spool}", transport_options=options)


def publish(conn, queue_name, *bodies, **kwargs):
    queue = kombu.Queue(queue_name, kombu.Exchange(queue_name), routing_key=queue_name)
    with conn.Producer() as producer:
        for body in bodies:
            producer.publish(body, exchange=queue.exchange, routing_key=queue_name, declare=[queue],
                             serializer="json", **kwargs)
    return queue


class Collector:
    """A consumer that keeps what it is given (and acks nothing by itself)."""

    def __init__(self, conn, queues, prefetch=None, no_ack=False):
        self.messages = []
        self.consumer = conn.Consumer(queues, callbacks=[self.got], no_ack=no_ack, accept=["json"])
        if prefetch:
            self.consumer.qos(prefetch_count=prefetch)
        self.consumer.consume()

    def got(self, body, message):
        self.messages.append(message)

    def drain(self, conn, timeout=2.0, until=None):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (until is None or len(self.messages) < until):
            try:
                conn.drain_events(timeout=0.2)
            except TimeoutError:
                pass
        return [m.payload for m in self.messages]


def vsqs_queue(spool, name="jobs"):
    return vsqs.Spool(spool).queue(name)


def test_publish_and_consume_each_message_once_in_priority_order(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", {"n": 1}, priority=1)
        publish(conn, "jobs", {"n": 9}, priority=9)
        publish(conn, "jobs", {"n": 5}, priority=5)
        collector = Collector(conn, [kombu.Queue("jobs")])
        assert collector.drain(conn, until=3) == [{"n": 9}, {"n": 5}, {"n": 1}]
        assert vsqs_queue(spool).stats().in_flight == 3  # held until acked
        for message in collector.messages:
            message.ack()
        assert vsqs_queue(spool).stats().total == 0
        assert collector.drain(conn, timeout=0.3) == [{"n": 9}, {"n": 5}, {"n": 1}]  # nothing more


def test_a_requeue_makes_the_message_visible_again_at_once(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", "x")
        collector = Collector(conn, [kombu.Queue("jobs")])
        collector.drain(conn, until=1)
        collector.messages[0].requeue()
        collector.drain(conn, until=2)
        first, second = collector.messages
        assert "redelivered" not in first.delivery_info
        assert second.payload == "x" and second.delivery_info["redelivered"] is True
        assert second.delivery_tag != first.delivery_tag
        second.ack()
        assert vsqs_queue(spool).stats().total == 0


def test_a_reject_without_requeue_dead_letters_or_drops(spool):
    with connect(spool) as conn:  # (a queue it makes has a dead-letter queue)
        publish(conn, "jobs", "poison")
        collector = Collector(conn, [kombu.Queue("jobs")])
        collector.drain(conn, until=1)
        collector.messages[0].reject()
        jobs = vsqs_queue(spool)
        assert jobs.stats().total == 0
        [dead] = jobs.dead_letter_queue().messages(bodies=True)
        assert b"poison" in dead.body
    with connect(spool, queue_settings={"max_receives": None}) as conn:  # no dead-letter queue: dropped, as in AMQP
        publish(conn, "plain", "x")
        collector = Collector(conn, [kombu.Queue("plain")])
        collector.drain(conn, until=1)
        collector.messages[0].reject()
        assert vsqs_queue(spool, "plain").stats().total == 0


def test_prefetch_is_honoured_and_an_ack_lets_the_next_in(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", *range(5))
        collector = Collector(conn, [kombu.Queue("jobs")], prefetch=2)
        collector.drain(conn, until=2)
        collector.drain(conn, timeout=0.5)  # no more, however long it drains
        assert len(collector.messages) == 2
        assert vsqs_queue(spool).stats().in_flight == 2
        collector.messages[0].ack()
        collector.drain(conn, until=3)
        collector.drain(conn, timeout=0.5)
        assert len(collector.messages) == 3
        assert vsqs_queue(spool).stats().in_flight == 2


def test_a_consumer_with_its_prefetch_used_wakes_when_another_thread_acks(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", 1, 2)
        collector = Collector(conn, [kombu.Queue("jobs")], prefetch=1)
        collector.drain(conn, until=1)
        acker = threading.Timer(0.2, collector.messages[0].ack)
        acker.start()
        conn.drain_events(timeout=30)  # returns once the ack freed the slot and the next came
        acker.join()
        assert [m.payload for m in collector.messages] == [1, 2]


def test_closing_the_connection_gives_back_what_it_held(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", *range(3))
        collector = Collector(conn, [kombu.Queue("jobs")], prefetch=3)
        collector.drain(conn, until=3)
        collector.messages[0].ack()
        assert vsqs_queue(spool).stats().in_flight == 2
    stats = vsqs_queue(spool).stats()
    assert (stats.ready, stats.in_flight) == (2, 0)


def test_a_consumer_that_dies_loses_nothing(spool):
    """Unacknowledged messages stay in the queue, hidden: after the visibility timeout another consumer gets them."""
    conn = connect(spool, visibility_timeout=1)
    publish(conn, "jobs", "x")
    collector = Collector(conn, [kombu.Queue("jobs")])
    collector.drain(conn, until=1)
    conn.transport.keeper.stop()  # a process that dies extends nothing (and restores nothing)
    with connect(spool) as other:
        second = Collector(other, [kombu.Queue("jobs")])
        assert second.drain(other, timeout=10, until=1) == ["x"]
        assert second.messages[0].delivery_info["redelivered"] is True
        second.messages[0].ack()
    conn.release()


def test_a_held_message_keeps_its_lease_while_its_task_runs(spool):
    with connect(spool, visibility_timeout=1.5) as conn:
        publish(conn, "jobs", "long")
        collector = Collector(conn, [kombu.Queue("jobs")])
        collector.drain(conn, until=1)
        time.sleep(4)  # several visibility timeouts: the keeper extends the lease meanwhile
        with connect(spool) as other:
            assert Collector(other, [kombu.Queue("jobs")]).drain(other, timeout=0.5) == []
        collector.messages[0].ack()
        assert vsqs_queue(spool).stats().total == 0


def test_a_no_ack_consumer_deletes_on_delivery(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", "x")
        collector = Collector(conn, [kombu.Queue("jobs")], no_ack=True)
        assert collector.drain(conn, until=1) == ["x"]
        assert vsqs_queue(spool).stats().total == 0


def test_a_wait_on_several_queues_takes_from_whichever_has_messages(spool):
    with connect(spool) as conn:
        for name in ("a", "b", "c"):
            conn.default_channel.queue_declare(name)
        collector = Collector(conn, [kombu.Queue(name) for name in ("a", "b", "c")], prefetch=1)
        threading.Timer(0.3, lambda: publish(connect(spool), "c", "late")).start()
        assert collector.drain(conn, timeout=10, until=1) == ["late"]
        publish(conn, "a", "one")
        publish(conn, "b", "two")
        collector.messages[0].ack()
        collector.drain(conn, until=2)
        assert len(collector.messages) == 2  # prefetch 1: one at a time, never both queues' at once
        in_flight = sum(vsqs_queue(spool, name).stats().in_flight for name in ("a", "b", "c"))
        assert in_flight == 1
        collector.messages[1].ack()
        collector.drain(conn, until=3)
        assert sorted(m.payload for m in collector.messages[1:]) == ["one", "two"]


def test_basic_get(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", "x")
        queue = kombu.Queue("jobs", channel=conn.default_channel)
        message = queue.get(accept=["json"])
        assert message.payload == "x"
        assert queue.get() is None
        message.ack()
        assert vsqs_queue(spool).stats().total == 0


def test_size_purge_and_delete(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", *range(4))
        channel = conn.default_channel
        assert channel.queue_declare("jobs", passive=True).message_count == 4
        held = kombu.Queue("jobs", channel=channel).get(accept=["json"])
        assert channel.queue_purge("jobs") == 3  # the waiting ones; the held one stays
        held.ack()
        channel.queue_delete("jobs")
        assert "jobs" not in vsqs.Spool(spool)


def test_an_eta_in_the_future_is_a_native_delay(spool):
    eta = (datetime.now(timezone.utc) + timedelta(seconds=30)).isoformat()
    with connect(spool) as conn:
        publish(conn, "jobs", "later", headers={"eta": eta})
        stats = vsqs_queue(spool).stats()
        assert (stats.ready, stats.delayed) == (0, 1)
    with connect(spool, native_delays=False) as conn:
        publish(conn, "jobs", "now", headers={"eta": eta})
        collector = Collector(conn, [kombu.Queue("jobs")])
        [message] = [m for m in collector.drain(conn, until=1)]
        assert message == "now" and collector.messages[0].headers["eta"] == eta  # left to Celery


def test_a_message_delivered_at_its_eta_is_handed_over_without_it():
    now = time.time()
    assert eta_delay({"eta": datetime.fromtimestamp(now + 5, timezone.utc).isoformat()}, now) == pytest.approx(5)
    assert eta_delay({"eta": datetime.fromtimestamp(now - 5, timezone.utc).isoformat()}, now) is None
    assert eta_delay({"eta": datetime.fromtimestamp(now + 5).isoformat()}, now) is None  # naive: Celery's
    assert eta_delay({"eta": "not a time"}, now) is None
    assert eta_delay({"eta": "-999999-01-01T00:00:00+00:00"}, now) is None
    assert eta_delay({"eta": 5}, now) is None
    assert eta_delay({}, now) is None
    assert eta_delay({"eta": "9999-01-01T00:00:00+00:00"}, now) == MAX_DELAY


def test_a_body_that_is_no_kombu_message_is_set_aside_and_others_go_on(spool, caplog):
    with connect(spool, queue_settings={"max_receives": 5}) as conn:
        conn.default_channel.queue_declare("jobs")
        jobs = vsqs_queue(spool)
        for planted in (b"not json", b"[1, 2]", b'{"properties": 5}', b"[" * 200_000,
                        b'{"body": "AAA", "properties": {"body_encoding": "base64"}}'):
            jobs.publish(planted, priority=9)
        publish(conn, "jobs", "fine")
        collector = Collector(conn, [kombu.Queue("jobs")])
        with caplog.at_level(logging.ERROR, "vsqs.kombu"):
            assert collector.drain(conn, until=1) == ["fine"]
        assert "is not a kombu message" in caplog.text
        assert jobs.dead_letter_queue().stats().total == 5
        assert jobs.stats().in_flight == 1  # the good one, held: nothing else is


def test_a_bad_body_without_a_dead_letter_queue_is_hidden_not_deleted(spool):
    with connect(spool, queue_settings={"max_receives": None}) as conn:
        conn.default_channel.queue_declare("jobs")
        jobs = vsqs_queue(spool)
        jobs.publish(b"not json")
        collector = Collector(conn, [kombu.Queue("jobs")])
        assert collector.drain(conn, timeout=0.5) == []
        assert jobs.stats().in_flight == 1


def test_fanout_and_topic_exchanges_are_refused_with_the_reason(spool):
    with connect(spool) as conn:
        channel = conn.default_channel
        with pytest.raises(NotImplementedError, match="no fanout exchanges across processes.*docs/tasks.md"):
            channel.exchange_declare("celery.pidbox", type="fanout")
        channel.exchange_declare("celeryev", type="topic")  # publishing events: dropped with no listener
        with pytest.raises(NotImplementedError, match="no topic exchanges"):
            channel.queue_bind("monitor", "celeryev", "task.#")


@pytest.mark.parametrize("url", ["vsqs://host/spool", "vsqs://relative", "sqs:///x", ""])
def test_a_url_that_names_no_local_spool_is_refused(url):
    with pytest.raises(vsqs.InvalidArgument, match="vsqs:///absolute/path"):
        spool_path(url, {})
    assert spool_path("vsqs:///srv/my%20spool", {}) == "/srv/my spool"
    assert spool_path(None, {"spool": "/x"}) == "/x"


def test_a_bad_queue_name_is_refused_with_the_rule(spool):
    with connect(spool) as conn:
        with pytest.raises(vsqs.InvalidArgument, match="bad queue name"):
            conn.default_channel.queue_declare("../escape")


def test_bad_transport_options_are_refused(spool):
    for bad in (-1, 0, 0.5, "soon"):
        with pytest.raises(vsqs.InvalidArgument, match="visibility_timeout"):
            connect(spool, visibility_timeout=bad).connect()
    with pytest.raises(vsqs.InvalidArgument):
        connect(spool, queue_settings={"max_receives": "many"}).default_channel.queue_declare("jobs")


def test_a_drain_with_no_timeout_to_spare_still_looks_once(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", "x")
        collector = Collector(conn, [kombu.Queue("jobs")])
        conn.drain_events(timeout=0)
        assert [m.payload for m in collector.messages] == ["x"]
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=0)


def test_a_binary_body_travels_in_base64_and_a_text_body_as_it_is(spool):
    with connect(spool) as conn:
        queue = kombu.Queue("jobs", channel=conn.default_channel)
        with conn.Producer() as producer:
            producer.publish(b"\x00\xff", routing_key="jobs", declare=[queue],
                             content_type="application/data", content_encoding="binary")
        [stored] = vsqs_queue(spool).messages(bodies=True)
        assert b'"body_encoding": "base64"' in stored.body
        message = queue.get(accept=["application/data", "json"])
        assert message.body == b"\x00\xff"
        message.ack()
        publish(conn, "text", {"text": "r\u00e9sum\u00e9"})
        [stored] = vsqs_queue(spool, "text").messages(bodies=True)
        assert b'\\"text\\"' in stored.body and b"base64" not in stored.body


def test_a_direct_route_another_process_declared_reaches_its_queue(spool, caplog):
    with connect(spool) as conn:
        conn.default_channel.queue_declare("jobs")
    with connect(spool) as conn:  # knows no binding: the routing key names the spool's queue
        with conn.Producer() as producer:
            producer.publish("x", exchange="jobs", routing_key="jobs", serializer="json")
            with caplog.at_level(logging.WARNING, "vsqs.kombu"):
                producer.publish("y", exchange="jobs", routing_key="nowhere", serializer="json")
    assert vsqs_queue(spool).stats().ready == 1
    assert "no queue is bound to exchange 'jobs' with routing key 'nowhere'" in caplog.text
    assert "nowhere" not in vsqs.Spool(spool)


def test_closing_gives_back_what_was_claimed_and_never_delivered(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", *range(5))
        collector = Collector(conn, [kombu.Queue("jobs")], prefetch=5)
        conn.drain_events(timeout=5)  # one delivered; the other four claimed with it, not yet delivered
        assert len(collector.messages) == 1
        assert vsqs_queue(spool).stats().in_flight == 5
    stats = vsqs_queue(spool).stats()
    assert (stats.ready, stats.in_flight) == (5, 0)


def test_a_reconnect_gives_back_only_what_was_not_delivered(spool):
    """kombu collects a connection it takes for lost: a task being run keeps its message, whose late ack deletes it."""
    conn = connect(spool)
    publish(conn, "jobs", *range(3))
    collector = Collector(conn, [kombu.Queue("jobs")], prefetch=3)
    conn.drain_events(timeout=5)
    conn.collect()
    stats = vsqs_queue(spool).stats()
    assert (stats.ready, stats.in_flight) == (2, 1)
    collector.messages[0].ack()
    assert vsqs_queue(spool).stats().total == 2


def test_a_no_ack_consumer_deletes_each_message_as_it_is_delivered(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", *range(10))
        Collector(conn, [kombu.Queue("jobs")], no_ack=True)
        conn.drain_events(timeout=5)
    assert vsqs_queue(spool).stats().ready == 9  # the claimed rest went back


def test_a_no_ack_get_deletes(spool):
    with connect(spool) as conn:
        publish(conn, "jobs", "x")
        assert kombu.Queue("jobs", channel=conn.default_channel).get(no_ack=True).payload == "x"
    assert vsqs_queue(spool).stats().total == 0


def test_a_suspended_queue_is_waited_out_not_raised(spool, caplog):
    with connect(spool) as conn:
        publish(conn, "jobs", "x", "y")
        collector = Collector(conn, [kombu.Queue("jobs")], prefetch=1)
        jobs = conn.transport.queue("jobs")  # (another handle sees a change of settings within a second)
        jobs.suspend("receive")
        with caplog.at_level(logging.WARNING, "vsqs.kombu"), pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.5)
        assert caplog.text.count("cannot receive from queue jobs") == 1
        jobs.resume("receive")
        assert collector.drain(conn, until=1) == ["x"]
        jobs.suspend("delete")
        collector.messages[0].ack()  # cannot delete now: kept, its lease extended, settled later
        assert jobs.stats().in_flight == 1
        jobs.resume("delete")
        collector.drain(conn, until=2)
        assert jobs.stats().in_flight == 1  # x deleted at the next wait; y delivered
        collector.messages[1].ack()
    assert vsqs_queue(spool).stats().total == 0


def test_a_wait_on_several_queues_outlives_one_that_is_suspended(spool):
    with connect(spool) as conn:
        for name in ("a", "b"):
            conn.default_channel.queue_declare(name)
        conn.transport.queue("a").suspend("receive")
        collector = Collector(conn, [kombu.Queue("a"), kombu.Queue("b")], prefetch=1)
        publish(conn, "a", "held back")
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.5)
        publish(conn, "b", "fine")
        assert collector.drain(conn, timeout=10, until=1) == ["fine"]
        assert vsqs_queue(spool, "a").stats().ready == 1


def test_durable_false_publishes_without_fsync(spool, monkeypatch):
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    with connect(spool) as conn:
        publish(conn, "jobs", "durable")
        assert synced
    synced.clear()
    with connect(spool, durable=False) as conn:
        publish(conn, "jobs", "fast")
    assert synced == []
    assert vsqs_queue(spool).stats().ready == 2
