"""Start a real `vsqs serve` process on loopback for the gateway tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import httpx


@dataclass
class Server:
    url: str
    spool: str
    process: subprocess.Popen[bytes]
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


# what a running gateway writes in the spool's root on its own, at any time: its
# periodic claims (housekeeping, the console's sampling) and the console's samples
_BOOKKEEPING = (".claims", ".records")


def refused_status(send: Callable[[], httpx.Response]) -> int | None:
    """The status of a request the server may refuse before reading all of it: a server
    that answers and closes while the body is still coming makes the kernel reset the
    connection, which the client may meet before it reads the answer. None for such a
    reset (a refusal too: a server that read the body on without bound would have read it
    all and answered), else the status."""
    try:
        return send().status_code
    except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError):
        return None


def tree_around(spool: str) -> list[str]:
    """Every path under the spool's parent, so a write that escaped the spool
    (``../x``) shows as well as one inside it, less the gateway's own
    bookkeeping in the spool's root (_BOOKKEEPING), which comes and goes with
    time. Tests put the spool one level down in a directory of its own."""
    parent = os.path.dirname(os.path.abspath(spool))
    skipped = tuple(os.path.join(os.path.abspath(spool), name) for name in _BOOKKEEPING)
    found = []
    for top, dirs, files in os.walk(parent):
        dirs[:] = [name for name in dirs if os.path.join(top, name) not in skipped]
        found += [os.path.relpath(os.path.join(top, name), parent) for name in dirs + files]
    return sorted(found)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_gateway(
    spool: str, *args: str, env: dict[str, str] | None = None, log_dir: str | None = None
) -> Iterator[Server]:
    """A `vsqs serve SPOOL` process on a free loopback port, stopped (SIGTERM) on exit."""
    port = free_port()
    log_path = os.path.join(log_dir or spool, f"gateway-{port}.log") if log_dir else f"/tmp/vsqs-gateway-{port}.log"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("VSQS_", "AWS_"))}
    child_env.update(env or {})
    command: Sequence[str] = [sys.executable, "-m", "vsqs", "serve", spool, "--port", str(port),
                              "--log-level", "warning", *args]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=child_env)
    server = Server(f"http://127.0.0.1:{port}", spool, process, log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vsqs serve exited with {process.returncode}:\n{server.log()}")
            try:
                if httpx.get(server.url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vsqs serve did not answer in 30 s:\n{server.log()}")
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
