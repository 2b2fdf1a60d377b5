"""Claim manifests of the streaming read: what each partition of a micro-batch claimed.

A task that claims messages for partition P of micro-batch N of query Q
writes their receipts, chunk by chunk, before it returns a row of them, under
the queue's reserved ``.spark/`` directory (docs/FORMAT.md, "Spark claim
manifests", version 2)::

    .spark/stream/Q/N/pP/G.K.json   receipts of chunk K, as of generation G
    .spark/stream/Q/N/pP/G.end.json the partition is sealed: it has K chunks

A file is created under its final name with an exclusive create (it fails if
the name exists: a file is never overwritten; no hard link, which some NFS
and HDFS mounts lack), written and synced; its last field is a SHA-256 of the
bytes before it, so a file being written, or torn by a writer that died,
reads as absent. No one replaces such a file, but its name counts for the
generation, so a later attempt writes the next one. A later attempt of the
same partition (a task retry, a replay after a driver crash) reads the
chunks instead of claiming new messages; it extends their visibility, which
gives new receipts, and records them as its own generation G+1 (chunk K of
the highest generation holding it wins). A sealed partition is re-read
exactly, and so is an unsealed one (its attempt died while claiming, or is a
speculative copy's first, still running): no later attempt claims anything
new (claims.py says why).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass, field

from vsqs._core.limits import ADAPTER_WRITING_PREFIX, MAX_ADAPTER_FILE, SPARK_AREA
from vsqs._core.rules import load_json
from vsqs._spark.options import MAX_PARTITIONS

MANIFEST_VERSION = 2  # 1: written by link (complete by construction, no seal); still read
_READABLE = (1, MANIFEST_VERSION)
_MAKE_DIRECTORY_TRIES = 3  # a directory gc removed between makedirs and the create is made again
_SUM = re.compile(rb',"sum":"([0-9a-f]{64})"\}\Z')  # the seal: SHA-256 of the bytes before it
ROOT = (SPARK_AREA, "stream")  # gc's generic rule for the area (docs/FORMAT.md) sees Q as a tree
MAX_MANIFEST_FILE = MAX_ADAPTER_FILE  # a chunk file holds at most CLAIM_CHUNK receipts: far less
_QUERY = re.compile(r"[0-9a-f]{16}\Z")
_BATCH = re.compile(r"(0|[1-9][0-9]{0,17})\Z")
_PARTITION = re.compile(r"p(0|[1-9][0-9]{0,5})\Z")  # and below MAX_PARTITIONS: see _is_partition
_LEFT_PREFIX = ".left-"  # a settled partition's directory moved aside with foreign entries in it
_FILE = re.compile(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,8}|end)\.json\Z")


def new_query_id() -> str:
    """A fresh id for a query's manifests (16 hex digits)."""
    return secrets.token_hex(8)


def valid_query_id(text: object) -> bool:
    return isinstance(text, str) and _QUERY.match(text) is not None


def query_dir(queue_path: str, query: str) -> str:
    return os.path.join(queue_path, *ROOT, query)


def partition_dir(queue_path: str, query: str, batch: int, partition: int) -> str:
    return os.path.join(query_dir(queue_path, query), str(batch), f"p{partition}")


def pending_batches(queue_path: str, query: str, through: int) -> list[tuple[int, int]]:
    """``(batch, partitions)`` of each batch up to ``through`` whose manifests
    are still there (not yet settled): two listings per such batch.

    A batch directory without a partition is settled: a task killed between
    the two removals of :func:`remove_partition` leaves it empty (it is
    removed here), or it holds only entries that are no manifest's (left to
    gc, which reports them). Reported, it would plan a batch that deletes
    nothing and leaves it there, again and again: a query that never ends."""
    found = []
    for name in _listdir(query_dir(queue_path, query)):
        if _BATCH.match(name) and int(name) <= through:
            batch = int(name)
            parts = [int(p[1:]) for p in _listdir(os.path.join(query_dir(queue_path, query), name)) if _is_partition(p)]
            if parts:
                found.append((batch, max(parts) + 1))
            else:
                remove_batch_if_empty(queue_path, query, batch)
    return sorted(found)


@dataclass
class Manifest:
    """One partition's manifest, as found: the current receipts of each chunk."""

    path: str
    chunks: dict[int, list[str]] = field(default_factory=dict)
    generation: int = -1  # the highest generation found (-1: none)
    sealed_chunks: int | None = None  # set once the partition was sealed

    @property
    def sealed(self) -> bool:
        return self.sealed_chunks is not None

    def receipts(self) -> list[str]:
        """The current receipts, chunk by chunk (up to the seal, if sealed)."""
        last = self.sealed_chunks if self.sealed_chunks is not None else len(self.chunks)
        return [r for k in sorted(self.chunks) if k < last for r in self.chunks[k]]

    def write_chunk(self, generation: int, chunk: int, receipts: list[str]) -> bool:
        """Record ``receipts`` as chunk ``chunk`` of ``generation``; False if
        another attempt recorded that chunk of that generation first."""
        return _write_new(self.path, f"{generation}.{chunk}.json", {"receipts": receipts})

    def seal(self, generation: int, chunks: int, messages: int) -> int:
        """Seal the partition at ``chunks`` chunks (``messages`` receipts in
        all); returns the chunk count that stands (another attempt's, if it
        sealed first)."""
        content = {"chunks": chunks, "messages": messages}
        if _write_new(self.path, f"{generation}.end.json", content):
            self.sealed_chunks = chunks
            return chunks
        again = read_manifest(self.path)
        self.sealed_chunks = again.sealed_chunks if again.sealed else chunks
        return self.sealed_chunks


def claimed_in(queue_path: str, query: str, batch: int) -> int | None:
    """How many messages the sealed partitions of ``batch`` claimed (from
    their seals: one small file each); None if it has no manifest left."""
    directory = os.path.join(query_dir(queue_path, query), str(batch))
    names = [name for name in _listdir(directory) if _is_partition(name)]
    if not names:
        return None
    total = 0
    for name in names:
        for entry in _listdir(os.path.join(directory, name)):
            if entry.endswith(".end.json") and _FILE.match(entry):
                content = _read_json(os.path.join(directory, name, entry))
                if content is None:  # torn, being written: another generation's seal may stand
                    continue
                messages = content.get("messages")
                total += messages if type(messages) is int and messages >= 0 else 0
                break
    return total


def read_manifest(path: str) -> Manifest:
    """The manifest in ``path`` (empty if there is none). Files that do not
    parse or fail their seal are skipped: a chunk being written, torn, written
    by no one or damaged is no chunk."""
    manifest = Manifest(path)
    best: dict[int, int] = {}  # chunk -> generation of the receipts kept
    for name in _listdir(path):
        match = _FILE.match(name)
        if match is None:
            continue
        generation = int(match.group(1))
        # a name counts even if its content does not (being written, torn): a later
        # attempt must write a higher generation, since no file is ever replaced
        manifest.generation = max(manifest.generation, generation)
        content = _read_json(os.path.join(path, name))
        if content is None:
            continue
        if match.group(2) == "end":
            chunks = content.get("chunks")
            if type(chunks) is int and chunks >= 0:
                manifest.sealed_chunks = min(chunks, manifest.sealed_chunks if manifest.sealed else chunks)
            continue
        chunk = int(match.group(2))
        receipts = content.get("receipts")
        if not isinstance(receipts, list) or not all(isinstance(r, str) for r in receipts):
            continue
        if best.get(chunk, -1) < generation:
            best[chunk] = generation
            manifest.chunks[chunk] = receipts
    return manifest


def remove_partition(path: str) -> None:
    """Remove a settled partition's manifest (and its batch directory once empty).

    A partition directory that holds entries of no manifest's (put there by
    hand, a client's leftovers) is moved aside under a name that is no
    partition's (``.left-pP-HEX``): else the next plans would find the
    partition again and plan its settling without end. Its entries stay for
    gc, which reports them and removes the query's tree after its grace. A
    ``pP`` that is no directory (a symbolic link, a file) is moved aside
    unfollowed: settling must never unlink a file outside the queue."""
    try:  # never followed: a link (or a file) in a partition's place is moved aside as it is
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    except OSError:
        _move_aside(path)
        return
    if fd is not None:
        try:
            for name in os.listdir(fd):
                if _FILE.match(name) or name.startswith(ADAPTER_WRITING_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:  # not empty: foreign entries
        _move_aside(path)
        return
    with contextlib.suppress(OSError):  # not empty (another partition, a foreign entry) or gone
        os.rmdir(os.path.dirname(path))


def _move_aside(path: str) -> None:
    """Rename a partition's directory to ``.left-pP-HEX`` (no partition's name), for gc."""
    aside = os.path.join(os.path.dirname(path), f"{_LEFT_PREFIX}{os.path.basename(path)}-{secrets.token_hex(4)}")
    with contextlib.suppress(OSError):
        os.rename(path, aside)


def remove_batch_if_empty(queue_path: str, query: str, batch: int) -> None:
    """Remove batch ``batch``'s directory if it is empty (else leave it)."""
    with contextlib.suppress(OSError):
        os.rmdir(os.path.join(query_dir(queue_path, query), str(batch)))


def _is_partition(name: str) -> bool:
    """Whether ``name`` is a partition's directory name: ``pP`` with P below
    MAX_PARTITIONS (no batch has more). A higher one is a foreign entry: as a
    partition, it would plan a settle list that no offset of the source may
    hold, and the query would fail on it at every restart."""
    return _PARTITION.match(name) is not None and int(name[1:]) < MAX_PARTITIONS


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _read_json(path: str) -> dict | None:
    """The object in file ``path`` if it is a complete manifest file of a
    version read here (version 2: its seal matches), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MANIFEST_FILE:
            return None
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(MAX_MANIFEST_FILE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    sealed = _SUM.search(data)
    if sealed is not None and hashlib.sha256(data[: sealed.start()]).hexdigest().encode() != sealed.group(1):
        return None  # torn, or still being written (or damaged)
    try:
        content = load_json(data)
    except ValueError:
        return None
    if not isinstance(content, dict) or content.get("v") not in _READABLE:
        return None
    if content["v"] != 1 and sealed is None:
        return None  # version 2 without its seal: incomplete
    return content


def encode(content: dict) -> bytes:
    """The bytes of a manifest file: compact JSON whose last field, ``"sum"``,
    is the SHA-256 (hex) of the bytes before ``,"sum":``."""
    head = json.dumps({"v": MANIFEST_VERSION, **content}, separators=(",", ":")).encode()[:-1]
    return head + b',"sum":"' + hashlib.sha256(head).hexdigest().encode() + b'"}'


def _write_new(directory: str, name: str, content: dict) -> bool:
    """Write ``content`` durably as ``directory/name`` unless that name
    exists (False: another attempt has it, complete or not)."""
    target = os.path.join(directory, name)
    for attempt in range(_MAKE_DIRECTORY_TRIES):
        os.makedirs(directory, exist_ok=True)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            break
        except FileExistsError:
            return False
        except FileNotFoundError:
            # gc removed the directory after makedirs (an empty one past its grace,
            # or the whole tree of a query idle for the stage grace): make it again
            if attempt == _MAKE_DIRECTORY_TRIES - 1:
                raise
        except OSError as error:
            # a lost exclusive create on HDFS's NFS gateway is EIO (EACCES, EPERM elsewhere): look
            if error.errno in (errno.EIO, errno.EACCES, errno.EPERM) and os.path.lexists(target):
                return False
            raise
    try:
        with os.fdopen(fd, "wb", closefd=False) as stream:
            stream.write(encode(content))
        os.fsync(fd)
    except BaseException:
        # never complete: take the name back (it counts as a generation until then)
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise
    finally:
        os.close(fd)
    _sync_directory(directory)
    return True


def _sync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
