"""Two "hosts" sharing one spool over a real network filesystem.

The team's kit (``../shared/netfs`` beside the checkout, or ``$NETFS_KIT``)
mounts one server directory twice: nfs-ganesha (NFSv3) with two userspace NFS
clients, and sshfs over a throwaway sshd, each mount with its own client
caches. The fixture skips with the reason where that cannot be done (not
root, no /dev/fuse, no kit); ``NETFS_REQUIRED=1`` (set by .ci/run) turns the
skip into a failure, so a broken set-up cannot hide.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.netfs_kit import one_set_up_at_a_time

KIT = os.environ.get("NETFS_KIT") or str(Path(__file__).resolve().parents[4] / "shared" / "netfs")
CACHE_S = 3  # entry/attr/negative cache seconds on both mounts: listings go stale
ENV = {
    "sshfs": {"SSHFS_CACHE_OPTS": ",".join(f"{o}={CACHE_S}" for o in (
        "dcache_timeout", "entry_timeout", "attr_timeout", "negative_timeout"))},
    "nfs": {"NFSFUSE_OPTS": f"entry_timeout={CACHE_S},attr_timeout={CACHE_S},"
                            f"negative_timeout={CACHE_S},direct_io"},
}
SCRIPTS = {"sshfs": "setup_sshfs.sh", "nfs": "setup_nfsfuse.sh"}
SLOW_START = (5, 6)  # the kit's exit codes: the server, a client, not up in time
SET_UP_TRIES = 3
SharedFS = collections.namedtuple("SharedFS", "host_a host_b kind")


def _unavailable(reason: str) -> None:
    if os.environ.get("NETFS_REQUIRED") == "1":
        pytest.fail("network filesystem required (NETFS_REQUIRED=1) but unavailable: " + reason)
    pytest.skip("network filesystem unavailable: " + reason)


@pytest.fixture(scope="session", params=["nfs", "sshfs"])
def shared_fs(request, tmp_path_factory):
    kind = request.param
    script = os.path.join(KIT, SCRIPTS[kind])
    if not os.path.exists(script):
        _unavailable(f"no netfs kit at {KIT} (set NETFS_KIT; a plain clone has no ../shared)")
    if os.geteuid() != 0:
        _unavailable("needs root (FUSE allow_other, sshd/ganesha, a network namespace)")
    if not os.path.exists("/dev/fuse"):
        _unavailable("no /dev/fuse")
    base = str(tmp_path_factory.mktemp("netfs-" + kind))
    env = dict(os.environ, **ENV[kind])
    if shutil.which("ip") and shutil.which("nsenter"):
        env["NETFS_NETNS"] = f"vsqs-{kind}-{uuid.uuid4().hex[:6]}"
    down = ["bash", script, "down", base]
    for attempt in range(SET_UP_TRIES):
        try:
            with one_set_up_at_a_time():  # (apt-get, the first time: one at a time)
                result = subprocess.run(["bash", script, "up", base], env=env, capture_output=True,
                                        text=True, timeout=600, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            subprocess.run(down, env=env, capture_output=True, stdin=subprocess.DEVNULL)
            _unavailable(f"{kind} set-up timed out")
        if result.returncode not in SLOW_START or attempt == SET_UP_TRIES - 1:
            break
        # the kit gives a server or client a fixed time to come up (10 s for the NFS
        # server): on a loaded machine (CI's two workers) that is sometimes too short
        subprocess.run(down, env=env, capture_output=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        subprocess.run(down, env=env, capture_output=True, stdin=subprocess.DEVNULL)
        _unavailable(f"{kind} set-up failed ({result.returncode}): {(result.stderr or result.stdout)[-800:]}")
    try:
        yield SharedFS(os.path.join(base, "mntA"), os.path.join(base, "mntB"), kind)
    finally:
        subprocess.run(down, env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
