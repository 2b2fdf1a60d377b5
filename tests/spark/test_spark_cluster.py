"""Spark on a real standalone cluster whose workers are two NFS client hosts.

One cluster for the module (tests/spark/cluster.py): a master on 127.0.0.1
and two workers on 127.0.0.2 and 127.0.0.3, each in its own mount namespace
with its own NFS client of one nfs-ganesha export, mounted at the path where
this process (the driver) has its own client. Every queue lives on that
export. Applications get one one-core executor per worker, so two can run at
once (the module's session and a driver started as a separate process).

What "nothing lost, nothing twice" means here (SQS at-least-once): every
message published is processed, and the queue ends empty; a message is
processed a second time only if an attempt that held it died without
deleting it (a speculated straggler, a killed executor: its function never
returned, so its result is not in the output), or, for the streaming query,
as part of the *same* batch replayed under the same batch id after a driver
kill (a sink idempotent on the batch id writes it once). The streaming
driver is killed at each point of a micro-batch in turn, on one queue and
checkpoint (the same test as on ``local``: tests/spark/stream_driver.py).

Needs root, /dev/fuse, java and the team's netfs kit (``../shared/netfs``
beside the checkout, or ``$NETFS_KIT``): skipped with the reason otherwise,
except in CI (``NETFS_REQUIRED=1``, set by .ci/run), where it must run.
Most of the time is JVMs starting: the cluster, the module's session, and
the five streaming drivers of the driver-kill test (one cluster for all).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import vsqs
import vsqs.spark
from tests.spark.cluster import ClusterUnavailable, NfsCluster, driver_session
from tests.spark.stream_driver import driver_runner, kill_at_each_point

pytestmark = pytest.mark.timeout(900)  # a hang guard: JVMs start slowly on a shared machine

APP_CONF = {"spark.executor.cores": "1", "spark.cores.max": "2"}  # one 1-core executor per worker


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        with NfsCluster(tmp_path_factory.mktemp("nfs-cluster"), workers=2, cores=2) as running:
            yield running
    except ClusterUnavailable as why:
        if os.environ.get("NETFS_REQUIRED") == "1":
            pytest.fail(f"NFS Spark cluster required (NETFS_REQUIRED=1) but unavailable: {why}")
        pytest.skip(f"NFS Spark cluster unavailable: {why}")


@pytest.fixture(scope="module")
def spark(cluster):
    speculation = {
        "spark.speculation": "true",
        "spark.speculation.interval": "200ms",
        "spark.speculation.multiplier": "1.5",
        "spark.speculation.quantile": "0.5",
        "spark.speculation.minTaskRuntime": "1s",
    }
    with driver_session(cluster, "vsqs-cluster-tests", **APP_CONF, **speculation) as session:
        yield session


@pytest.fixture
def spool(cluster, request) -> Path:
    """A fresh directory on the NFS export (the same path on every host)."""
    path = cluster.spool / request.node.name
    path.mkdir()
    return path


def _drain(queue: vsqs.Queue) -> list[vsqs.Message]:
    messages = []
    while batch := queue.receive_batch(100, visibility_timeout=60):
        messages.extend(batch)
        for message in batch:
            message.delete()
    return messages


def _wait_until_nothing_in_flight(queue: vsqs.Queue) -> None:
    """Wait for the leases of a dead attempt to run out (bounded by their visibility timeout)."""
    deadline = time.monotonic() + 120
    while queue.stats().in_flight and time.monotonic() < deadline:
        time.sleep(0.2)


def test_the_workers_are_two_hosts_of_one_export(spark, cluster):
    """Each executor sees the spool through its own NFS client (its own mount namespace)."""
    spool = str(cluster.spool)

    def where(_: object) -> tuple[str, int]:  # this host's view of the spool
        return os.readlink("/proc/self/ns/mnt"), os.stat(spool).st_dev

    # a barrier stage runs its two tasks at once: one on each one-core executor
    seen = set(spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(
        lambda part: [where(part)]).collect())
    driver = (os.readlink("/proc/self/ns/mnt"), os.stat(spool).st_dev)
    namespaces = {ns for ns, _ in seen}
    devices = {dev for _, dev in seen}
    assert len(namespaces) == len(devices) == 2  # two hosts, each with its own client
    assert driver[0] not in namespaces and driver[1] not in devices


def test_a_speculated_stragglers_message_is_redelivered_not_lost(spark, spool, tmp_path):
    queue = vsqs.Queue(spool / "q", create=True)
    bodies = [b"m%d" % i for i in range(20)]
    ids = dict(zip(bodies, queue.publish_batch(bodies), strict=True))
    marker = tmp_path / "straggling"  # local disk: every namespace sees it

    def fn(body):
        if body == b"m0" and not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(120)  # the straggler: its copy finishes first and Spark kills it
        time.sleep(0.05)  # the other task takes a while too, so the straggler stands out
        return body

    output = str(spool / "out")
    first = vsqs.spark.process_queue(
        spark, queue, fn, output=output, parallelism=2, wait=0.2, visibility_timeout=2
    )
    # the job finished without waiting for the straggler: its speculative copy won. The counts
    # include every attempt (ProcessResult.tasks): the two that returned, and the killed
    # straggler if its first report reached the driver before Spark killed it
    assert marker.exists() and first.tasks - first.died == 2 and first.died <= 1
    assert first.processed == 19 and first.lost == 0
    [held] = list(queue.messages())  # m0: not deleted, not processed, not lost
    assert held.id == ids[b"m0"]

    _wait_until_nothing_in_flight(queue)  # the killed straggler no longer extends its lease
    second = vsqs.spark.process_queue(spark, queue, fn, output=output, parallelism=2, wait=0.2)
    assert (second.processed, second.redelivered) == (1, 1)
    assert queue.stats().total == 0
    # exactly once each: the straggler's fn never returned, so it published nothing
    assert Counter(m.body for m in _drain(vsqs.Queue(output))) == Counter(bodies)


def test_an_executor_killed_mid_job_loses_nothing(spark, spool, tmp_path):
    """SIGKILL the executor JVM (and so its Python worker) while it holds a
    message: Spark retries the task elsewhere, the message comes back after
    its visibility timeout, and every result is published exactly once."""
    queue = vsqs.Queue(spool / "q", create=True)
    bodies = [b"e%d" % i for i in range(30)]
    queue.publish_batch(bodies)
    marker = tmp_path / "killed"

    def executor_jvm() -> int:  # defined here: the executors cannot import this module
        """The pid of the executor JVM above this Python worker."""
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"CoarseGrainedExecutorBackend" in f.read():
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the parent
        raise RuntimeError("no executor JVM above this Python worker")

    def fn(body):
        if body == b"e7":
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # only the first time
            except FileExistsError:
                return body
            jvm = executor_jvm()
            os.write(fd, b"%d" % jvm)
            os.close(fd)
            os.kill(jvm, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)  # and its Python worker, holding e7
        return body

    output = str(spool / "out")
    result = vsqs.spark.process_queue(
        spark, queue, fn, output=output, parallelism=2, wait=0.2, visibility_timeout=2
    )
    killed = int(marker.read_text())
    assert not os.path.exists(f"/proc/{killed}")  # that executor is gone
    if queue.stats().total:  # the retried task ended before e7's lease ran out
        _wait_until_nothing_in_flight(queue)
        result += vsqs.spark.process_queue(spark, queue, fn, output=output, parallelism=2, wait=0.2)
    assert result.redelivered >= 1 and result.lost == 0 and result.failed == 0
    # (result.processed leaves out what the killed attempt had done: counts come
    # from the attempts that succeeded; the output below is the whole truth)
    assert queue.stats().total == 0
    assert Counter(m.body for m in _drain(vsqs.Queue(output))) == Counter(bodies)


@pytest.mark.timeout(5 * 600 + 60)  # a hang guard: five drivers, each bounded by driver_runner's 600 s
def test_a_driver_killed_at_each_point_of_the_stream_loses_nothing(cluster, spool, tmp_path):
    """The streaming driver (its Python and JVM, a process of its own) is
    SIGKILLed at each point of a micro-batch in turn (tests/spark/stream_driver.py):
    while batch 1's tasks claim on the two workers, after its sink wrote
    batch 2, once batch 2 is committed and before the next batch is planned,
    and in the last batch, which only deletes; each time a new driver
    restarts from the same checkpoint. The killed drivers' executors die with
    them (the workers kill them). Replayed batches are the same batches, one
    copy of each batch id holds every message once, the queue ends empty."""
    # one one-core executor on each worker: both hosts claim (the module's
    # session holds the other core of each worker)
    conf = {**cluster.session_conf("vsqs-cluster-stream"), "spark.executor.cores": "1", "spark.cores.max": "2"}
    (tmp_path / "out").mkdir()
    kill_at_each_point(driver_runner(conf, tmp_path), vsqs.Queue(spool / "q", create=True), tmp_path / "ck",
                       tmp_path / "out")
