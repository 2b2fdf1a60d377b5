"""Opt-in: speculative execution on a real (small) standalone cluster.

Spark never launches a speculative copy on ``local[N]`` (it will not run a
copy on the same host), so this module starts a standalone master on
127.0.0.1 and two one-core workers on 127.0.0.2 and 127.0.0.3 from the pyspark
wheel. It takes about a minute and a few JVMs, so it runs only with

    VSQS_SPARK_CLUSTER_TESTS=1 scripts/test tests/spark/test_spark_cluster.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import vsqs
import vsqs.spark

pytestmark = pytest.mark.skipif(
    os.environ.get("VSQS_SPARK_CLUSTER_TESTS") != "1",
    reason="opt-in: set VSQS_SPARK_CLUSTER_TESTS=1 (starts a standalone Spark cluster)",
)

WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(path: Path, text: str, count: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text(errors="replace").count(text) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} never showed {text!r} {count} times:\n{path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(home, "bin", "spark-class")
    root = tmp_path_factory.mktemp("cluster")
    conf = root / "spark-defaults.conf"
    conf.write_text("spark.master.rest.enabled false\n")
    env = {**os.environ, "SPARK_HOME": home, "PYSPARK_PYTHON": sys.executable}
    port = _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes = []
    logs = []

    def start(name: str, args: list[str], host: str) -> None:
        log = root / f"{name}.log"
        logs.append(log)
        with open(log, "wb") as out:
            processes.append(
                subprocess.Popen(  # spark-class execs java: the pid is the JVM's
                    [spark_class, *args, "--properties-file", str(conf)],
                    env={**env, "SPARK_LOCAL_IP": host},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=root,
                )
            )

    try:
        start(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", "0"],
            "127.0.0.1",
        )
        _wait_for(root / "master.log", "I have been elected leader", 1)
        for i, host in enumerate(WORKER_HOSTS):
            start(
                f"worker{i}",
                ["org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1",
                 "--memory", "1g", "--webui-port", "0", "--work-dir", str(root / f"work{i}"),
                 master_url],
                host,
            )
        _wait_for(root / "master.log", "Registering worker", len(WORKER_HOSTS))
        yield master_url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def spark(cluster):
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(cluster)
        .appName("vsqs-speculation")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "200ms")
        .config("spark.speculation.multiplier", "1.5")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.minTaskRuntime", "1s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def test_a_speculated_stragglers_message_is_redelivered_not_lost(spark, tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    bodies = [b"m%d" % i for i in range(20)]
    ids = dict(zip(bodies, queue.publish_batch(bodies), strict=True))
    marker = tmp_path / "straggling"

    def fn(body):
        if body == b"m0" and not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(120)  # the straggler: its copy finishes first and Spark kills it
        time.sleep(0.05)  # the other task takes a while too, so the straggler stands out
        return body

    output = str(tmp_path / "out")
    first = vsqs.spark.process_queue(
        spark, queue, fn, output=output, parallelism=2, wait=0.2, visibility_timeout=2
    )
    # the job finished without waiting for the straggler: its speculative copy won
    assert marker.exists() and first.tasks == 2
    assert first.processed == 19 and first.lost == 0
    [held] = list(queue.messages())  # m0: not deleted, not processed, not lost
    assert held.id == ids[b"m0"]

    # the killed straggler stops extending its lease: m0 comes back
    deadline = time.monotonic() + 90
    while queue.stats().in_flight and time.monotonic() < deadline:
        time.sleep(0.2)
    second = vsqs.spark.process_queue(spark, queue, fn, output=output, parallelism=2, wait=0.2)
    assert (second.processed, second.redelivered) == (1, 1)
    assert queue.stats().total == 0
    got = Counter(m.body for m in vsqs.Queue(output).receive_batch(100, visibility_timeout=60))
    assert got == Counter(bodies)
