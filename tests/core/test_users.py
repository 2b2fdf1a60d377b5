"""A spool shared by a group of Unix users: two real users and an outsider.

The driver, the executors and the operators of a cluster are often
different users sharing one group. A queue with ``file_mode=660`` in a setgid
spool lets every member publish, receive and delete, and no outsider read a
body; modes are set on each file, never through the process umask.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile

import pytest

import vsqs

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"),
    reason="needs root with useradd and setpriv to make real users",
)


@pytest.fixture
def users():
    tag = secrets.token_hex(3)
    group, a, b, outsider = f"vsqsg{tag}", f"vsqsa{tag}", f"vsqsb{tag}", f"vsqsc{tag}"
    subprocess.run(["groupadd", group], check=True)
    for name, groups in ((a, [group]), (b, [group]), (outsider, [])):
        command = ["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name]
        if groups:
            command[1:1] = ["-G", ",".join(groups)]
        subprocess.run(command, check=True)
    try:
        yield group, a, b, outsider
    finally:
        for name in (a, b, outsider):
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


def as_user(user: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    entry = pwd.getpwnam(user)
    strict = "import os; os.umask(0o077)\n"  # the queue's file_mode must win over the umask
    command = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups",
               sys.executable, "-c", strict + code, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": "/"})


PUBLISH = "import sys, vsqs; print(vsqs.Queue(sys.argv[1]).publish(sys.argv[2].encode()))"
CONSUME = "import sys, vsqs; m = vsqs.Queue(sys.argv[1]).receive(); print(m.body.decode()); m.delete()"


def test_group_members_share_a_queue_outsiders_cannot_read(users):
    group, a, b, outsider = users
    spool = tempfile.mkdtemp(prefix="vsqs-users-", dir="/tmp")
    try:
        os.chmod(os.path.dirname(spool), 0o1777)  # /tmp: traversable
        os.chown(spool, 0, grp.getgrnam(group).gr_gid)
        os.chmod(spool, 0o2770)  # setgid: new entries belong to the group
        create = "import sys, vsqs; vsqs.Spool(sys.argv[1]).create_queue('jobs', file_mode='660')"
        made = as_user(a, create, spool)
        assert made.returncode == 0, made.stderr
        path = os.path.join(spool, "jobs")
        published = as_user(a, PUBLISH, path, "secret")
        assert published.returncode == 0, published.stderr
        consumed = as_user(b, CONSUME, path)  # another member receives and deletes
        assert consumed.returncode == 0 and consumed.stdout.strip() == "secret", consumed.stderr
        assert as_user(b, PUBLISH, path, "reply").returncode == 0
        denied = as_user(outsider, CONSUME, path)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
        peek = "import os, sys; [open(os.path.join(sys.argv[1], n)).read() for n in os.listdir(sys.argv[1])]"
        assert as_user(outsider, peek, path).returncode != 0  # not a body can be read
        assert vsqs.Queue(path).receive().body == b"reply"
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                st = os.stat(os.path.join(root, name))
                assert st.st_gid == grp.getgrnam(group).gr_gid, name
                wanted = 0o2770 if name in dirs else 0o660
                assert st.st_mode & 0o7777 == wanted, (name, oct(st.st_mode))
    finally:
        shutil.rmtree(spool, ignore_errors=True)


@pytest.mark.parametrize("mode", ["abc", "1777", "400", "0o060", -1])
def test_bad_file_modes(tmp_path, mode):
    with pytest.raises(vsqs.InvalidArgument, match="file_mode"):
        vsqs.Queue(tmp_path / "q", create=True, mode=mode)


def test_an_unreadable_message_does_not_stop_the_others(users):
    group, a, b, outsider = users
    spool = tempfile.mkdtemp(prefix="vsqs-users-", dir="/tmp")
    try:
        os.chown(spool, 0, grp.getgrnam(group).gr_gid)
        os.chmod(spool, 0o2770)
        q = vsqs.Spool(spool).create_queue("jobs", file_mode="660")
        q.publish_batch([b"locked", b"fine-1", b"fine-2"])
        first = sorted(n for n in os.listdir(q.path) if not n.startswith("."))[0]
        os.chmod(os.path.join(q.path, first), 0o000)  # a foreign process left it unreadable
        take = ("import sys, vsqs; q = vsqs.Queue(sys.argv[1]); "
                "print(sorted(m.body.decode() for m in q.receive_batch(10, visibility_timeout=60)))")
        result = as_user(b, take, q.path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "['fine-1', 'fine-2']"
        assert "cannot open message file" in result.stderr  # reported, not fatal
        assert q.stats().total == 3  # nothing lost: the locked one waits in flight
    finally:
        shutil.rmtree(spool, ignore_errors=True)
