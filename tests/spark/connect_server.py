"""A local Spark Connect server from pyspark's own jars, for the tests.

pyspark's wheel ships the server (``jars/spark-connect_*.jar``) and its
launcher (``bin/spark-submit``; ``sbin/start-connect-server.sh`` is the same
call through ``spark-daemon.sh``, which daemonizes and writes pid files under
``$SPARK_HOME``: not wanted here). The server runs in the foreground, in a
process group of its own, so that stopping it ends the JVM and the Python
workers it forked:

    spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer
        --master local[2,2] --conf spark.connect.grpc.binding.address=127.0.0.1
        --conf spark.connect.grpc.binding.port=PORT ...

Everything listens on loopback only (gRPC, the driver's RPC, the block
manager; no UI). The server's Python workers run ``python`` (this
interpreter by default) with the project root first on ``PYTHONPATH`` and as
their working directory, so they import this checkout's vsqs, not another
install's.

``connect_url`` (a module-scoped fixture) yields ``sc://127.0.0.1:PORT``. It
skips, with the reason, where Java, the jar or the Connect client's packages
(pandas, grpcio, ...: ``pip install 'pyspark[connect]'``) are missing, unless
``SPARK_CONNECT_REQUIRED=1``, where it fails instead.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT = 180.0  # seconds; about 11 s on the 2-core machine, idle
STOP_TIMEOUT = 30.0


class ConnectUnavailable(Exception):
    """What this machine lacks to run a Spark Connect server and client."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def check_available() -> None:
    """Raise ConnectUnavailable naming what is missing."""
    try:
        home = spark_home()
    except ImportError as exc:
        raise ConnectUnavailable(f"pyspark is not installed: {exc}") from exc
    if not glob.glob(str(home / "jars" / "spark-connect_*.jar")):
        raise ConnectUnavailable(f"no spark-connect jar in {home / 'jars'} (pyspark without the Connect server)")
    if not (home / "bin" / "spark-submit").exists():
        raise ConnectUnavailable(f"no {home / 'bin' / 'spark-submit'}")
    java_home = os.environ.get("JAVA_HOME")
    if not ((java_home and Path(java_home, "bin", "java").exists()) or shutil.which("java")):
        raise ConnectUnavailable("no Java (neither JAVA_HOME nor java on PATH): the Connect server is a JVM")
    try:
        import pyspark.sql.connect.session  # noqa: F401  (checks pandas, grpcio, ... itself)
    except Exception as exc:  # PySparkImportError, ImportError
        raise ConnectUnavailable(
            f"the Spark Connect client cannot load ({exc}); pip install 'pyspark[connect]'"
        ) from exc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ConnectServer:
    """One Spark Connect server process (group); ``url`` once started."""

    def __init__(
        self,
        *,
        master: str = "local[2,2]",
        python: str | None = None,
        root: Path = ROOT,
        log_dir: str | None = None,
        conf: dict[str, str] | None = None,
    ) -> None:
        self.master = master
        self.python = python or os.environ.get("VSQS_SPARK_PYTHON") or sys.executable
        self.root = root
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.log_path = os.path.join(log_dir or tempfile.mkdtemp(prefix="vsqs-connect-"), "server.log")
        self.conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.connect.grpc.port.maxRetries": "0",  # this port or fail, never another one
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            # tables (a pipeline's streaming tables) go here, not into the working directory
            "spark.sql.warehouse.dir": os.path.join(os.path.dirname(self.log_path), "warehouse"),
            **(conf or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None

    def command(self) -> list[str]:
        command = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        command += ["--name", "vsqs-tests-connect", "--master", self.master]
        for key, value in self.conf.items():
            command += ["--conf", f"{key}={value}"]
        return command

    def environment(self) -> dict[str, str]:
        unwanted = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")  # the server is no client
        env = {key: value for key, value in os.environ.items() if key not in unwanted}
        env.update(
            SPARK_HOME=str(spark_home()),
            PYSPARK_PYTHON=self.python,
            PYSPARK_DRIVER_PYTHON=self.python,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_CONNECT_MODE="0",  # as sbin/start-connect-server.sh: the server's own pyspark is classic
            PYTHONPATH=os.pathsep.join(filter(None, [str(self.root), os.environ.get("PYTHONPATH")])),
        )
        return env

    def start(self, timeout: float = START_TIMEOUT) -> str:
        began = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.root,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the JVM and its Python workers
            )
        deadline = began + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the Spark Connect server exited ({self.process.returncode}) before it listened "
                    f"on {self.port}:\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the Spark Connect server did not listen on {self.port} in {timeout:.0f} s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.2)
        self.started_in = time.monotonic() - began
        return self.url

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            # the leader is gone; the group may still hold Python workers
            deadline = time.monotonic() + wait
            while _group_alive(process.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _group_alive(process.pid):
                return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(log.readlines()[-lines:])
        except OSError:
            return ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _required() -> bool:
    return os.environ.get("SPARK_CONNECT_REQUIRED") == "1"


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    try:
        check_available()
    except ConnectUnavailable as exc:
        if _required():
            pytest.fail(f"SPARK_CONNECT_REQUIRED=1 but {exc}")
        pytest.skip(str(exc))
    server = ConnectServer(log_dir=str(tmp_path_factory.mktemp("connect-server")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def connect_url(connect_server: ConnectServer) -> str:
    return connect_server.url
