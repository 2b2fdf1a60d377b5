"""Set-ups of the team's network filesystem kit (``../shared/netfs``), one at a time.

The kit's ``up`` installs its packages with apt-get the first time, and
apt-get refuses to run while another holds the dpkg lock: the NFS and sshfs
fixtures (each in its pytest-xdist worker) and the Spark cluster would fail
each other's set-up on a fresh machine. They take turns on a lock file
instead (released by the kernel if the process dies).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

LOCK = os.path.join(tempfile.gettempdir(), "vsqs-netfs-kit.lock")


@contextmanager
def one_set_up_at_a_time() -> Iterator[None]:
    """Hold the kit's set-up lock for the block (waiting for the holder, if any)."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
