"""Over Spark Connect, a server whose Python cannot import vsqs: the client
is told that vsqs is missing there. Its own module: a second Connect
server, started alone.

The server's Python: a fresh venv that sees pyspark's site-packages through a
path file (a plain path: the editable install's .pth files in there are not
processed), working in an empty directory.
"""

from __future__ import annotations

import os
import subprocess
import venv

import pytest

import vsqs
import vsqs.spark
from tests.spark.connect_server import ConnectServer, ConnectUnavailable, check_available, spark_home

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory):
    try:
        check_available()
    except ConnectUnavailable as exc:
        if os.environ.get("SPARK_CONNECT_REQUIRED") == "1":
            pytest.fail(f"SPARK_CONNECT_REQUIRED=1 but {exc}")
        pytest.skip(str(exc))
    base = tmp_path_factory.mktemp("bare")
    venv.create(base / "venv", with_pip=False)
    python = str(base / "venv" / "bin" / "python")
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.check_output([python, "-c", where], text=True)
    with open(os.path.join(site.strip(), "pyspark_path.pth"), "w") as stream:
        stream.write(str(spark_home().parent) + "\n")
    if subprocess.run([python, "-c", "import vsqs"], cwd=base, capture_output=True).returncode == 0:
        pytest.skip("vsqs is installed beside pyspark (not editable): no Python without it to be had")
    (base / "empty").mkdir()
    server = ConnectServer(python=python, root=base / "empty", log_dir=str(base))
    server.start()
    saved = {key: os.environ.get(key) for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _session(server):
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(server.url).create()


def test_without_register(bare_server, flat_queue):
    spark = _session(bare_server)
    try:
        with pytest.raises(Exception) as caught:
            spark.read.format("vsqs").load(flat_queue.path).collect()
    finally:
        spark.stop()
    print(f"\nunregistered, server without vsqs: {type(caught.value).__name__}: {caught.value}")
    assert "DATA_SOURCE_NOT_FOUND" in str(caught.value)


def test_with_register(bare_server, flat_queue):
    spark = _session(bare_server)
    try:
        vsqs.spark.register(spark)  # over Connect: sends the pickled class; checked on use
        with pytest.raises(Exception) as caught:
            spark.read.format("vsqs").load(flat_queue.path).collect()
    finally:
        spark.stop()
    print(f"\nregistered, server without vsqs: {type(caught.value).__name__}: {caught.value}")
    assert "vsqs" in str(caught.value)


def test_process_queue_says_that_the_executors_lack_vsqs(bare_server, flat_queue, tmp_path):
    flat_queue.publish_batch([b"a", b"b"])
    spark = _session(bare_server)
    try:
        with pytest.raises(Exception) as caught:
            vsqs.spark.process_queue(spark, flat_queue.path, bytes.upper, output=str(tmp_path / "out"),
                                     parallelism=1, wait=0.2)
    finally:
        spark.stop()
    assert "the executors' Python cannot import vsqs" in "\n".join(getattr(caught.value, "__notes__", []))
    assert flat_queue.stats().total == 2  # nothing taken
