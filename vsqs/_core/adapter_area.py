"""Garbage collection of ``.spark/``, the area a queue reserves for the Spark adapter.

The engine does not know the adapter's file formats (docs/FORMAT.md, "Spark
claim manifests"); gc applies one generic rule to the area, by kind of entry
and age only (docs/FORMAT.md, "Garbage collection of .spark/")::

    .spark/KIND/TREE/...      e.g. .spark/stream/QUERY/BATCH/pPART/FILE

- A TREE none of whose entries (directories included) was modified within
  ``tree_grace`` seconds belongs to a job that is gone for good (a streaming
  query whose checkpoint is not coming back): it is renamed ``.gc-HEX`` (out
  of the adapter's sight in one step) and removed whole; a ``.gc-*`` tree
  left by a gc that died is removed by the next.
- In any tree, a file being written (name ``.tmp-*``) older than ``grace``
  and a directory below TREE left empty for ``grace`` are removed.
- Only regular files of at most MAX_ADAPTER_FILE bytes and directories are
  ever removed. Anything else (a symbolic link, a FIFO, a socket, a device, a
  larger file, a directory deeper than MAX_ADAPTER_DEPTH, a file where a
  directory belongs) is reported and left, and so are the directories that
  hold it; a tree holding such an entry is never removed whole. No file is
  opened or read (``lstat``, ``scandir``, ``unlink``, ``rmdir``), and no link
  followed: every removal and rename walks down from the queue's directory
  opening each directory with ``O_NOFOLLOW``, so a directory swapped for a
  symbolic link after the scan stops it there, inside the queue.
- A directory that cannot be listed (other than gone) is reported and left
  too: what it holds is unknown, so its tree is never removed whole.
- At most MAX_ADAPTER_ENTRIES entries are looked at per pass, and at most
  half as many tree names (trees in a random order, so that one huge tree
  cannot starve the others for ever); a listing stops there, so memory is
  bounded however many entries a directory holds. A tree not seen whole is
  never removed whole (a ``.gc-*`` tree is, a part per pass); one larger than
  a pass can see is reported.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from vsqs._core.limits import (
    ADAPTER_WRITING_PREFIX,
    MAX_ADAPTER_DEPTH,
    MAX_ADAPTER_ENTRIES,
    MAX_ADAPTER_FILE,
    SPARK_AREA,
)

log = logging.getLogger("vsqs")

REMOVING_PREFIX = ".gc-"  # a tree gc took out of the adapter's sight, being removed

Report = Callable[[str, str], None]


@dataclass
class AreaSweep:
    """What one pass over the area did: files removed, trees (jobs) removed whole, entries reported."""

    files: int = 0
    trees: int = 0
    reported: list[str] = field(default_factory=list)
    complete: bool = True  # False: stopped at the entry budget; the next pass goes on


def collect_area(queue_path: str, now: float, grace: float, tree_grace: float,
                 report: Report | None = None) -> AreaSweep:
    """One gc pass over the queue's ``.spark/`` (see the module's docstring)."""
    sweep = AreaSweep()

    def damaged(path: str, why: str) -> None:
        sweep.reported.append(path)
        if report is not None:
            report(path, why)
        else:
            log.warning("queue %s: %s is %s: skipped, left in place", queue_path, path, why)

    area = os.path.join(queue_path, SPARK_AREA)
    info = _lstat(area)
    if info is None:
        return sweep
    if not stat.S_ISDIR(info.st_mode):
        damaged(area, _kind(info.st_mode))
        return sweep
    budget = [MAX_ADAPTER_ENTRIES]  # entries of trees looked at (< 0: spent)
    names = [MAX_ADAPTER_ENTRIES // 2]  # names of kinds and trees listed
    for kind_name in _listing(area, names) or []:
        kind_path = os.path.join(area, kind_name)
        kind = _lstat(kind_path)
        if kind is None:
            continue
        if not stat.S_ISDIR(kind.st_mode):
            damaged(kind_path, _kind(kind.st_mode) + " where a directory belongs")
            continue
        trees = _listing(kind_path, names)
        if trees is None:
            damaged(kind_path, "a directory that cannot be listed")
            continue
        random.shuffle(trees)
        for tree_name in trees:
            _collect_tree(queue_path, os.path.join(kind_path, tree_name), now, grace, tree_grace, budget, sweep,
                          damaged)
            if budget[0] < 0:
                break
        if budget[0] < 0 or names[0] < 0:
            sweep.complete = False
            log.warning("queue %s: gc looked at %d entries of %s and stopped; the next gc goes on",
                        queue_path, MAX_ADAPTER_ENTRIES, area)
            break
    return sweep


def _collect_tree(queue_path: str, tree: str, now: float, grace: float, tree_grace: float, budget: list[int],
                  sweep: AreaSweep, damaged: Report) -> None:
    """Apply the rules to one TREE: scan it whole first (its age is its newest entry's)."""
    info = _lstat(tree)
    if info is None:
        return
    if not stat.S_ISDIR(info.st_mode):
        damaged(tree, _kind(info.st_mode) + " where a directory belongs")
        return
    entries: list[tuple[str, os.stat_result, int]] = []  # children before their directory
    unlisted: list[str] = []  # directories that could not be listed
    at_start = budget[0]
    newest = _scan(tree, 1, budget, entries, unlisted, info.st_mtime)
    seen_whole = budget[0] >= 0
    if not seen_whole and at_start >= MAX_ADAPTER_ENTRIES // 2:
        damaged(tree, f"a tree of more entries than one gc looks at ({MAX_ADAPTER_ENTRIES})")
    for path in unlisted:
        damaged(path, "a directory that cannot be listed")
    clean = not unlisted and not any(_damage(entry, depth) for _, entry, depth in entries)
    abandoned = os.path.basename(tree).startswith(REMOVING_PREFIX) or (
        clean and seen_whole and newest <= now - tree_grace)
    if abandoned and not os.path.basename(tree).startswith(REMOVING_PREFIX):
        if not _unchanged(tree, info, entries):
            return  # written to since the scan (a query restarted just now): alive
        # out of the adapter's sight in one step: a gc that dies half-way never leaves
        # a part of a tree (a manifest without its seal, say) where the adapter looks
        gone = os.path.join(os.path.dirname(tree), REMOVING_PREFIX + secrets.token_hex(8))
        if not _below(queue_path, os.path.dirname(tree), lambda fd: os.rename(
                os.path.basename(tree), os.path.basename(gone), src_dir_fd=fd, dst_dir_fd=fd)):
            return  # gone meanwhile, or refused: the next gc tries again
        log.warning("removing %s, untouched for %.0f s: the job that wrote it is gone (its messages "
                    "came back when their leases ran out)", tree, now - newest)
        entries = [(gone + path[len(tree):], entry, depth) for path, entry, depth in entries]
        tree = gone
    # directories holding something left (or unknown): never rmdir'ed (it would fail anyway)
    kept: set[str] = set(unlisted)
    for path, entry, depth in entries:
        mode = entry.st_mode
        parent = os.path.dirname(path)
        why = _damage(entry, depth)
        if why is not None:
            damaged(path, why)
            kept.add(parent)
        elif stat.S_ISDIR(mode):
            if path in kept or not (abandoned or entry.st_mtime <= now - grace) or not _rmdir(queue_path, path):
                kept.add(parent)
        elif (abandoned or (os.path.basename(path).startswith(ADAPTER_WRITING_PREFIX)
                            and entry.st_mtime <= now - grace)) and _unlink(queue_path, path):
            sweep.files += 1
        else:
            kept.add(parent)
    if abandoned and tree not in kept and _rmdir(queue_path, tree):
        sweep.trees += 1


def _unchanged(tree: str, info: os.stat_result, entries: list[tuple[str, os.stat_result, int]]) -> bool:
    """Whether the tree's directories are as the scan found them: a file made or
    removed since changes its directory's mtime. (Checked just before the
    rename: what a writer does in between, it does to a tree gc then removes;
    its next file makes the directories again, and what it lost comes back
    after its lease, as for any claim its manifest does not hold.)"""
    for path, seen in [(tree, info), *((p, e) for p, e, _ in entries if stat.S_ISDIR(e.st_mode))]:
        now = _lstat(path)
        if now is None or (now.st_ino, now.st_mtime_ns) != (seen.st_ino, seen.st_mtime_ns):
            return False
    return True


def _damage(entry: os.stat_result, depth: int) -> str | None:
    """Why an entry of a tree is no file or directory of the adapter's (None if it may be one)."""
    if stat.S_ISDIR(entry.st_mode):
        return "a directory too deep" if depth > MAX_ADAPTER_DEPTH else None
    if not stat.S_ISREG(entry.st_mode):
        return _kind(entry.st_mode)
    if entry.st_size > MAX_ADAPTER_FILE:
        return f"a file of {entry.st_size} bytes (over {MAX_ADAPTER_FILE})"
    return None


def _scan(directory: str, depth: int, budget: list[int], entries: list[tuple[str, os.stat_result, int]],
          unlisted: list[str], newest: float) -> float:
    """Every entry below ``directory`` (``depth`` levels below its KIND), post-order,
    into ``entries`` (until the budget is spent); the directories that cannot be
    listed into ``unlisted``; the newest modification time met. Directories too
    deep are not entered."""
    names = _listing(directory, budget)
    if names is None:
        unlisted.append(directory)
        return newest
    for name in names:
        path = os.path.join(directory, name)
        info = _lstat(path)
        if info is None:
            continue
        newest = max(newest, info.st_mtime)
        if stat.S_ISDIR(info.st_mode) and depth < MAX_ADAPTER_DEPTH and budget[0] >= 0:
            newest = _scan(path, depth + 1, budget, entries, unlisted, newest)
        entries.append((path, info, depth + 1))
    return newest


def _listing(directory: str, budget: list[int]) -> list[str] | None:
    """The names in ``directory``, counted against ``budget``: at most what is
    left of it (if there are more, the budget is spent: -1, and the rest waits
    for the next pass); None if it cannot be listed. A directory gone, or no
    directory, holds nothing."""
    names: list[str] = []
    try:
        with os.scandir(directory) as listing:
            for entry in listing:
                if budget[0] <= 0:
                    budget[0] = -1
                    break
                budget[0] -= 1
                names.append(entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return names
    except OSError:
        return None
    return names


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _unlink(queue_path: str, path: str) -> bool:
    return _below(queue_path, os.path.dirname(path), lambda fd: os.unlink(os.path.basename(path), dir_fd=fd))


def _rmdir(queue_path: str, path: str) -> bool:
    # fails if not empty (something was written since), or gone
    return _below(queue_path, os.path.dirname(path), lambda fd: os.rmdir(os.path.basename(path), dir_fd=fd))


def _below(queue_path: str, directory: str, action: Callable[[int], None]) -> bool:
    """Run ``action`` on a descriptor of ``directory`` (inside ``queue_path``),
    reached from the queue's directory one ``O_NOFOLLOW`` open at a time: a
    component that is (now) a symbolic link, or no directory, fails it. False
    if anything failed."""
    relative = os.path.relpath(directory, queue_path)
    parts = [] if relative == os.curdir else relative.split(os.sep)
    if os.pardir in parts:
        return False
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(queue_path, flags)
    except OSError:
        return False
    try:
        for part in parts:
            inner = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        action(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a file"
    return "a device"
