"""A Spark standalone cluster whose workers are NFS client "hosts".

Used by tests/spark/test_spark_cluster.py and scripts/bench_spark_cluster.py.

- **The export**: the team's netfs kit (``../shared/netfs`` beside the
  checkout, or ``$NETFS_KIT``) starts nfs-ganesha (NFSv3) in a private
  network namespace and mounts it at ``BASE/mntA`` with a userspace NFS
  client; that mount is the driver's (this process's) view of the spool.
- **The workers**: each Spark worker runs in its own mount namespace
  (``unshare --mount --propagation private``) where its own NFS client (its
  own connection and caches) is mounted over that same path. So the driver
  and each worker see one export at one path, through three clients: what
  three hosts mounting one NFS export are. The workers listen on 127.0.0.2,
  127.0.0.3, ... and the master on 127.0.0.1. Given ``cpu_per_worker``,
  each worker's processes (its NFS client, its JVMs, its Python workers)
  share a CPU cgroup of that many cores, as a host of its own would.

Everything is torn down by :meth:`NfsCluster.close`, even after a failure:
every process left in a worker's mount namespace is killed (which also
drops that namespace's mount), the master is stopped, and the kit unmounts
and stops the server. Where it cannot be set up (no kit, not root, no
/dev/fuse, no java) :class:`ClusterUnavailable` says why.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from tests.netfs_kit import one_set_up_at_a_time

KIT = Path(os.environ.get("NETFS_KIT") or Path(__file__).resolve().parents[3] / "shared" / "netfs")
CACHE_S = 3  # entry/attr/negative cache seconds on every client (as NFS actimeo/lookupcache)
CLIENT_OPTS = f"entry_timeout={CACHE_S},attr_timeout={CACHE_S},negative_timeout={CACHE_S},direct_io"
STARTUP_TIMEOUT = 180.0  # seconds for a JVM to come up on a loaded machine (not a correctness bound)

# A worker: join its CPU group if it has one (every process of the "host"
# inherits it), mount its own NFS client over SPOOL (the driver's mount point,
# inherited from the parent namespace), wait until the mount is there (the
# device number of SPOOL changes), then run the Spark worker. Not exec'd, so
# the client and the JVM are both this namespace's processes.
_WORKER_SCRIPT = r"""
set -u
for procs in ${CPU_GROUP_PROCS:-}; do echo $$ >"$procs" || exit 7; done
before=$(stat -c %d "$SPOOL")
$NETNS_ENTER "$NFS_PYTHON" "$KIT/nfsfuse.py" "$NFS_URL" "$SPOOL" -o "$CLIENT_OPTS" \
    >"$CLIENT_LOG" 2>&1 </dev/null &
for _ in $(seq 400); do [ "$(stat -c %d "$SPOOL")" != "$before" ] && break; sleep 0.05; done
if [ "$(stat -c %d "$SPOOL")" = "$before" ]; then echo "vsqs-cluster: NFS client mount failed" >&2; exit 6; fi
echo "vsqs-cluster: own NFS client mounted at $SPOOL (device $(stat -c %d "$SPOOL"))"
"$SPARK_CLASS" org.apache.spark.deploy.worker.Worker "$@"
"""


_KIT_SLOW_START = (5, 6)  # setup_nfsfuse.sh: the server, a client, not up within its 10 s
_NFS_START_TRIES = 3


class ClusterUnavailable(Exception):
    """This machine cannot run the NFS cluster (the message says why)."""


CGROUP = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000


class CpuGroup:
    """A cgroup that holds its processes to ``cores`` of CPU (cgroup v2's
    ``cpu.max``, else v1's ``cpu`` controller, with a ``cpuacct`` group
    beside it where that hierarchy is apart): one host's worth of CPU on a
    machine that runs several "hosts". It counts the CPU its processes used,
    those gone included, and how long the cap held them back."""

    def __init__(self, name: str, cores: float) -> None:
        if cores <= 0:
            raise ValueError(f"a CPU group needs some CPU, not {cores} cores")
        quota = max(1000, round(cores * CPU_PERIOD_US))
        self.v2 = (CGROUP / "cgroup.controllers").exists()
        self.paths: list[Path] = []
        try:
            if self.v2:  # the cpu controller must be on for children
                controllers = (CGROUP / "cgroup.subtree_control").read_text().split()
                if "cpu" not in controllers:
                    _write(CGROUP / "cgroup.subtree_control", "+cpu")
                self._make(CGROUP / name)
                _write(self.paths[0] / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            else:
                self._make(CGROUP / "cpu" / name)
                _write(self.paths[0] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(self.paths[0] / "cpu.cfs_quota_us", str(quota))
                if not (self.paths[0] / "cpuacct.usage").exists():  # (cpuacct in a hierarchy of its own)
                    self._make(CGROUP / "cpuacct" / name)
        except BaseException:
            self.remove()
            raise
        self.procs = " ".join(str(path / "cgroup.procs") for path in self.paths)  # (no spaces in the names)

    def _make(self, path: Path) -> None:
        path.mkdir()
        self.paths.append(path)

    def used(self) -> tuple[float, int, int]:
        """Seconds of CPU its processes have used; the scheduling periods in
        which they ran, and those in which the cap held them back."""
        stat = dict(line.split() for line in (self.paths[0] / "cpu.stat").read_text().splitlines())
        if self.v2:
            seconds = int(stat["usage_usec"]) / 1e6
        else:
            seconds = int((self.paths[-1] / "cpuacct.usage").read_text()) / 1e9
        return seconds, int(stat["nr_periods"]), int(stat["nr_throttled"])

    def remove(self) -> None:
        """Remove the group (once its processes are gone; a warning if some stay)."""
        for path in reversed(self.paths):
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                print(f"vsqs-cluster: CPU group {path} left behind: processes still in it", file=sys.stderr)


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def check_cpu_groups() -> None:
    """Raise ClusterUnavailable where CPU groups cannot be made here."""
    try:
        group = CpuGroup(f"vsqs-check-{uuid.uuid4().hex[:6]}", 0.5)
        try:
            group.used()
        finally:
            group.remove()
    except (OSError, KeyError) as error:
        raise ClusterUnavailable(f"cannot make a CPU cgroup under {CGROUP}: {error}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(path: Path, text: str, count: int, process: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until ``path`` shows ``text`` ``count`` times (a start-up log line)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if path.exists() and path.read_text(errors="replace").count(text) >= count:
            return
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.2)
    tail = path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"
    raise RuntimeError(f"{path.name} never showed {text!r} {count} times:\n{tail}")


def _mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _pids_in_mount_ns(ns: str) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _mount_ns(int(p)) == ns]


def check_available() -> None:
    """Raise :class:`ClusterUnavailable` with the reason if this machine cannot run it."""
    if not (KIT / "setup_nfsfuse.sh").exists():
        raise ClusterUnavailable(f"no netfs kit at {KIT} (set NETFS_KIT; a plain clone has no ../shared)")
    if os.geteuid() != 0:
        raise ClusterUnavailable("needs root (mount namespaces, FUSE allow_other, the NFS server)")
    if not os.path.exists("/dev/fuse"):
        raise ClusterUnavailable("no /dev/fuse")
    for tool in ("unshare", "nsenter", "ip", "java"):
        if not shutil.which(tool):
            raise ClusterUnavailable(f"{tool} is not installed")


class NfsCluster:
    """The NFS export, a standalone master and workers in their own mount namespaces.

    ``spool`` is the directory every host sees at the same path (put queues
    in it); ``master_url`` is what a SparkSession connects to. Workers are
    added with :meth:`add_worker` (the constructor adds ``workers``).
    ``cpu_per_worker``: cores of CPU each worker "host" may use (all its
    processes: its NFS client, its JVMs, its Python workers), so that
    several fit on one machine as hosts of their own would.
    """

    def __init__(self, root: Path, *, workers: int = 2, cores: int = 2, memory: str = "1g",
                 cpu_per_worker: float | None = None) -> None:
        check_available()
        if cpu_per_worker is not None:
            check_cpu_groups()
        self.root = Path(root)
        self.cores = cores
        self.cpu_per_worker = cpu_per_worker
        self.memory = memory
        self.nfs_base = self.root / "nfs"
        self.spool = self.nfs_base / "mntA"
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._netns = f"vsqs-cl-{uuid.uuid4().hex[:6]}"
        self._kit_env = {**os.environ, "NFSFUSE_OPTS": CLIENT_OPTS, "NETFS_NETNS": self._netns}
        import pyspark

        self.spark_home = os.path.dirname(pyspark.__file__)
        self._env = {**os.environ, "SPARK_HOME": self.spark_home, "PYSPARK_PYTHON": sys.executable}
        self._conf = self.root / "spark-defaults.conf"
        self._conf.write_text("spark.master.rest.enabled false\n")
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[tuple[subprocess.Popen[bytes], str | None]] = []
        self._cpu_groups: list[CpuGroup] = []
        self._nfs_up = False
        self.master_url = ""
        try:
            self._start_nfs()
            self._start_master()
            for _ in range(workers):
                self.add_worker()
        except BaseException:
            self.close()
            raise

    # -- start ---------------------------------------------------------------------------

    def _kit(self, action: str) -> subprocess.CompletedProcess[str]:
        with one_set_up_at_a_time():  # ("up" runs apt-get the first time: one at a time)
            return subprocess.run(
                ["bash", str(KIT / "setup_nfsfuse.sh"), action, str(self.nfs_base)],
                check=False, env=self._kit_env, capture_output=True, text=True, timeout=600,
                stdin=subprocess.DEVNULL,
            )

    def _start_nfs(self) -> None:
        self._nfs_up = True  # from here on, close() runs the kit's "down"
        result = self._kit("up")
        for _ in range(_NFS_START_TRIES - 1):
            if result.returncode not in _KIT_SLOW_START:
                break
            # the kit gives the server (or a client) a fixed 10 s to come up: on a loaded
            # machine (CI, its two workers) that is sometimes too short; down, and again
            self._kit("down")
            result = self._kit("up")
        if result.returncode != 0:
            raise ClusterUnavailable(
                f"NFS set-up failed ({result.returncode}): {(result.stderr or result.stdout)[-800:]}"
            )

    def _spark_class(self) -> str:
        return os.path.join(self.spark_home, "bin", "spark-class")

    def _start_master(self) -> None:
        port = _free_port()
        log = self.logs / "master.log"
        with open(log, "wb") as out:
            self._master = subprocess.Popen(  # spark-class execs java: the pid is the JVM's
                [self._spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", "0", "--properties-file", str(self._conf)],
                env={**self._env, "SPARK_LOCAL_IP": "127.0.0.1"}, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.root, start_new_session=True,
            )
        self.master_url = f"spark://127.0.0.1:{port}"
        _wait_for(log, "I have been elected leader", 1, self._master)

    def add_worker(self) -> str:
        """Start one more worker (own mount namespace, own NFS client); return its host."""
        index = len(self._workers)
        host = f"127.0.0.{index + 2}"
        log = self.logs / f"worker{index}.log"
        env = {
            **self._env,
            "SPARK_LOCAL_IP": host,
            "SPOOL": str(self.spool),
            "KIT": str(KIT),
            "NFS_URL": f"nfs://127.0.0.1{self.nfs_base / 'export'}",
            "NFS_PYTHON": str(self.nfs_base / "venv" / "bin" / "python"),
            "NETNS_ENTER": f"nsenter --net=/run/netns/{self._netns}",
            "CLIENT_OPTS": CLIENT_OPTS,
            "CLIENT_LOG": str(self.logs / f"nfsclient{index}.log"),
            "SPARK_CLASS": self._spark_class(),
        }
        if self.cpu_per_worker is not None:
            group = CpuGroup(f"{self._netns}-w{index}", self.cpu_per_worker)
            self._cpu_groups.append(group)
            env["CPU_GROUP_PROCS"] = group.procs
        args = ["--host", host, "--cores", str(self.cores), "--memory", self.memory, "--webui-port", "0",
                "--work-dir", str(self.root / f"work{index}"), "--properties-file", str(self._conf),
                self.master_url]
        with open(log, "wb") as out:
            process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", _WORKER_SCRIPT,
                 "vsqs-worker", *args],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.root, start_new_session=True,
            )
        namespace = None
        for _ in range(100):  # unshare execs bash once the namespace exists
            namespace = _mount_ns(process.pid)
            if namespace != _mount_ns(os.getpid()) or process.poll() is not None:
                break
            time.sleep(0.02)
        self._workers.append((process, namespace))
        _wait_for(log, "Successfully registered with master", 1, process)
        return host

    def cpu_used(self) -> tuple[float, int, int]:
        """Seconds of CPU the capped workers' processes have used in all; the
        scheduling periods they ran in, and those their caps held them back
        in (zeros without ``cpu_per_worker``)."""
        used = [group.used() for group in self._cpu_groups]
        return sum(u[0] for u in used), sum(u[1] for u in used), sum(u[2] for u in used)

    @property
    def worker_count(self) -> int:
        return len(self._workers)

    # -- a driver ------------------------------------------------------------------------

    def session_conf(self, app: str, executors: int | None = None) -> dict[str, str]:
        """The Spark conf of a driver on this cluster (this process or a child).

        One executor per worker, each with all of that worker's cores, unless
        ``executors`` asks for fewer (``spark.cores.max``).
        """
        executors = self.worker_count if executors is None else executors
        return {
            "spark.master": self.master_url,
            "spark.app.name": app,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * executors),
            "spark.pyspark.python": sys.executable,
            "spark.sql.shuffle.partitions": str(self.cores * executors),
            # the first job waits for every executor (standalone's default is not to wait)
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{STARTUP_TIMEOUT:.0f}s",
        }

    # -- stop ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop everything this cluster started; safe to call twice and after a failure."""
        for process, namespace in self._workers:
            _stop(process, namespace)
        self._workers = []
        for group in self._cpu_groups:
            group.remove()
        self._cpu_groups = []
        if self._master is not None:
            _stop(self._master, None)
            self._master = None
        if self._nfs_up:
            self._kit("down")
            self._nfs_up = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False once the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _stop(process: subprocess.Popen[bytes], namespace: str | None) -> None:
    """Stop a process, its process group and everything left in its mount namespace.

    The executors' Python daemons make their own process groups, so the mount
    namespace is what finds them all; when its last process is gone, the
    kernel drops the namespace and its NFS client mount with it.
    """
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    for _ in range(100):
        left = _pids_in_mount_ns(namespace) if namespace else []
        group = _signal_group(process.pid, signal.SIGKILL)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if process.poll() is None:
            try:
                process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        if not left and not group and process.poll() is not None:
            return
        time.sleep(0.1)


@contextmanager
def driver_session(cluster: NfsCluster, app: str, executors: int | None = None, **conf: Any) -> Iterator[Any]:
    """A SparkSession in this process, connected to ``cluster``; stopped afterwards."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder
    for key, value in {**cluster.session_conf(app, executors), **conf}.items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
