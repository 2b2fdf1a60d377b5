"""``vsqs check-fs``: test the filesystem properties vsqs relies on, on your mount.

Like filelock's ``verify_filesystem``, a user runs it against the directory
that will hold the spool (and, for a shared mount, the same directory as
another host sees it, ``--other``). It makes raw system calls on purpose:
it tests the filesystem, not vsqs, so it does not go through ``_fs``.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# O_WRONLY|O_CREAT|O_EXCL: the claim vsqs makes; O_CLOEXEC: no leak into children
_EXCL = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


@dataclass
class Check:
    name: str
    status: str  # "ok", "warn" or "FAIL"
    detail: str


def _excl_racer(directory: str, names: list[str], flags: int, barrier: Any, out: Any) -> None:
    won: list[str] = []
    lost: Counter[str] = Counter()
    barrier.wait()
    for name in names:
        try:
            os.close(os.open(os.path.join(directory, name), flags, 0o644))
            won.append(name)
        except OSError as exc:
            lost[errno.errorcode.get(exc.errno or 0, str(exc.errno))] += 1
    out.put((won, dict(lost)))


def _rename_racer(directory: str, names: list[str], me: int, barrier: Any, out: Any) -> None:
    won: list[str] = []
    lost: Counter[str] = Counter()
    barrier.wait()
    for name in names:
        try:  # each racer renames to a name of its own, as vsqs claims do
            os.rename(os.path.join(directory, name), os.path.join(directory, f"{name}.{me}"))
            won.append(name)
        except OSError as exc:
            lost[errno.errorcode.get(exc.errno or 0, str(exc.errno))] += 1
    out.put((won, dict(lost)))


def _race(target: Callable[..., None], argsets: list[tuple[object, ...]]) -> list[tuple[list[str], dict[str, int]]]:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(len(argsets)), ctx.Queue()
    procs = [ctx.Process(target=target, args=args + (barrier, out)) for args in argsets]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(60)
    return results


def run_checks(directory: str, other: str | None, processes: int, rounds: int) -> Iterator[Check]:
    """Run every check in a scratch directory under ``directory``; yield results as they come."""
    scratch_name = f".vsqs-check-fs-{secrets.token_hex(4)}"
    scratch = os.path.join(directory, scratch_name)
    os.mkdir(scratch)
    try:
        yield from _checks(scratch, other and os.path.join(other, scratch_name), processes, rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _checks(scratch: str, other: str | None, processes: int, rounds: int) -> Iterator[Check]:
    names = [f"m{i:05d}" for i in range(rounds)]
    yield _exclusive_create(scratch, other, names, processes)
    yield _rename_race(scratch, other, names, processes)
    yield _fsync(scratch)
    yield _clock(scratch)
    yield _rename_over_a_name(scratch)
    if other:
        yield _cross_host_listing(scratch, other)
    yield _speed(scratch, rounds)


def _exclusive_create(scratch: str, other: str | None, names: list[str], processes: int) -> Check:
    """Exactly one winner per name."""
    sub = os.path.join(scratch, "excl")
    os.mkdir(sub)
    dirs = [sub] + ([os.path.join(other, "excl")] if other else [])
    results = _race(_excl_racer, [(dirs[i % len(dirs)], names, _EXCL) for i in range(processes)])
    winners = Counter(name for won, _ in results for name in won)
    errnos: Counter[str] = Counter()
    for _, lost in results:
        errnos.update(lost)
    double = [name for name, count in winners.items() if count > 1]
    missing = [name for name in names if winners[name] == 0]
    shown = ", ".join(f"{code} x{count}" for code, count in errnos.most_common())
    if double or missing:
        return Check("exclusive create", "FAIL", f"{len(double)} names won twice, {len(missing)} never: not safe")
    note = " (vsqs maps EPERM/EIO for a lost race)" if set(errnos) - {"EEXIST"} else ""
    return Check("exclusive create", "ok", f"one winner for each of {len(names)} names; losers saw {shown}{note}")


def _rename_race(scratch: str, other: str | None, names: list[str], processes: int) -> Check:
    """A rename of one source to distinct targets: exactly one winner."""
    sub = os.path.join(scratch, "rename")
    os.mkdir(sub)
    for name in names:
        os.close(os.open(os.path.join(sub, name), _EXCL, 0o644))
    dirs = [sub] + ([os.path.join(other, "rename")] if other else [])
    results = _race(_rename_racer, [(dirs[i % len(dirs)], names, i) for i in range(processes)])
    winners = Counter(name for won, _ in results for name in won)
    errnos: Counter[str] = Counter()
    for _, lost in results:
        errnos.update(lost)
    double = [name for name, count in winners.items() if count > 1]
    left = [n for n in os.listdir(sub) if "." not in n]
    if double:
        return Check("rename race", "FAIL", f"{len(double)} files renamed by two racers: claims are not safe")
    shown = ", ".join(f"{code} x{count}" for code, count in errnos.most_common())
    status = "ok" if not left else "warn"
    return Check("rename race", status, f"one winner for each of {len(names)} files; losers saw {shown}"
                 + (f"; {len(left)} never renamed" if left else ""))


def _fsync(scratch: str) -> Check:
    """fsync of a file and of a directory."""
    path = os.path.join(scratch, "durable")
    fd = os.open(path, _EXCL, 0o644)
    os.write(fd, b"x")
    os.fsync(fd)
    os.close(fd)
    try:
        dfd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
            return Check("fsync", "ok", "files and directories can be fsynced")
        finally:
            os.close(dfd)
    except OSError as exc:
        return Check("fsync", "warn", f"directory fsync fails ({exc.strerror}): vsqs tolerates EINVAL/ENOTSUP")


def _clock(scratch: str) -> Check:
    """Does the filesystem's time agree with this host's?"""
    path = os.path.join(scratch, "clock")
    before = time.time()
    os.close(os.open(path, _EXCL, 0o644))
    skew = os.stat(path).st_mtime - before
    status = "ok" if abs(skew) < 1 else "warn"
    return Check("clock", status, f"file times are {skew:+.3f} s from this host's clock"
                 + ("" if status == "ok" else ": sync clocks (NTP) or set clock_skew"))


def _rename_over_a_name(scratch: str) -> Check:
    """Does rename replace an existing name? (vsqs never relies on either answer.)"""
    a, b = os.path.join(scratch, "over-a"), os.path.join(scratch, "over-b")
    for p in (a, b):
        os.close(os.open(p, _EXCL, 0o644))
    try:
        os.rename(a, b)
        replaced = "rename replaces an existing name (POSIX)"
    except OSError as exc:
        replaced = f"rename onto an existing name fails ({exc.strerror}, as on HDFS)"
    return Check("rename over a name", "ok", replaced + "; vsqs never renames onto an existing name")


def _cross_host_listing(scratch: str, other: str) -> Check:
    """Another host sees a new name, and how soon."""
    name = f"seen-{secrets.token_hex(4)}"
    os.close(os.open(os.path.join(scratch, name), _EXCL, 0o644))
    start = time.monotonic()
    seen = False
    while time.monotonic() - start < 120:
        if name in os.listdir(other):
            seen = True
            break
        time.sleep(0.05)
    delay = time.monotonic() - start
    if not seen:
        return Check("cross-host listing", "FAIL", "a new file never showed in the other mount's listing (120 s)")
    return Check("cross-host listing", "ok" if delay < 10 else "warn",
                 f"a new file shows in the other mount's listing after {delay:.2f} s (a delay, never a loss)")


def _speed(scratch: str, rounds: int) -> Check:
    """The speed of the claim cycle on this mount."""
    sub = os.path.join(scratch, "speed")
    os.mkdir(sub)
    count = max(100, rounds)
    start = time.perf_counter()
    for i in range(count):
        p = os.path.join(sub, f"s{i}")
        os.close(os.open(p, _EXCL, 0o644))
        os.rename(p, p + ".r")
        os.unlink(p + ".r")
    rate = count / (time.perf_counter() - start)
    return Check("speed", "ok", f"{rate:,.0f} create+rename+unlink cycles per second")
