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

Every file of the area is reached from the queue's directory without
following a link (``area.py``): a queue whose path leads elsewhere now (a
link, another queue) is refused, and so is a link (or a non-directory) on
the way down to the directory acted in, but for entries of a listing: a
batch or partition name that is no directory holds no manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass, field

from vsqs import Queue
from vsqs._core.limits import ADAPTER_WRITING_PREFIX, MAX_ADAPTER_FILE, SPARK_AREA
from vsqs._core.rules import load_json
from vsqs._spark import area
from vsqs._spark.options import MAX_PARTITIONS

MANIFEST_VERSION = 2  # 1: written by link (complete by construction, no seal); still read
_READABLE = (1, MANIFEST_VERSION)
_MAKE_DIRECTORY_TRIES = 3  # a directory gc removed between reaching it and the create is made again
_SUM = re.compile(rb',"sum":"([0-9a-f]{64})"\}\Z')  # the seal: SHA-256 of the bytes before it
KIND = "stream"  # .spark/stream/Q/...: gc's generic rule for the area (docs/FORMAT.md) sees Q as a tree
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


@dataclass(frozen=True)
class Place:
    """Where partition ``partition`` of batch ``batch`` of query ``query``
    keeps its manifest: ``.spark/stream/Q/N/pP`` of ``queue``."""

    queue: Queue
    query: str
    batch: int
    partition: int

    @property
    def parts(self) -> tuple[str, ...]:
        """Its directories below ``.spark``."""
        return (KIND, self.query, str(self.batch), f"p{self.partition}")

    @property
    def path(self) -> str:
        """Its path as a person knows it (for messages: no file is reached by it)."""
        return os.path.join(self.queue.path, SPARK_AREA, *self.parts)


def pending_batches(queue: Queue, query: str, through: int) -> list[tuple[int, int]]:
    """``(batch, partitions)`` of each batch up to ``through`` whose manifests
    are still there (not yet settled): two listings per such batch.

    A batch directory without a partition is settled: a task killed between
    the two removals of :func:`remove_partition` leaves it empty (it is
    removed here), or it holds only entries that are no manifest's (left to
    gc, which reports them). Reported, it would plan a batch that deletes
    nothing and leaves it there, again and again: a query that never ends.
    A batch name that is no directory (a symbolic link) holds no partition."""
    found = []
    with area.opened(queue, (KIND, query)) as tree:
        for name in _listdir(tree):
            if _BATCH.match(name) and int(name) <= through:
                with area.subdirectory(tree, name) as batch:
                    parts = [int(p[1:]) for p in _listdir(batch) if _is_partition(p)]
                if parts:
                    found.append((int(name), max(parts) + 1))
                else:
                    with contextlib.suppress(OSError):  # not empty (foreign entries), or no directory
                        os.rmdir(name, dir_fd=tree)
    return sorted(found)


@dataclass
class Manifest:
    """One partition's manifest, as found: the current receipts of each chunk."""

    place: Place
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
        return _write_new(self.place, f"{generation}.{chunk}.json", {"receipts": receipts})

    def seal(self, generation: int, chunks: int, messages: int) -> int:
        """Seal the partition at ``chunks`` chunks (``messages`` receipts in
        all); returns the chunk count that stands (another attempt's, if it
        sealed first)."""
        content = {"chunks": chunks, "messages": messages}
        if _write_new(self.place, f"{generation}.end.json", content):
            self.sealed_chunks = chunks
            return chunks
        again = read_manifest(self.place)
        stands = again.sealed_chunks if again.sealed and again.sealed_chunks is not None else chunks
        self.sealed_chunks = stands
        return stands


def claimed_in(queue: Queue, query: str, batch: int) -> int | None:
    """How many messages the sealed partitions of ``batch`` claimed (from
    their seals: one small file each); None if it has no manifest left."""
    total: int | None = None
    with area.opened(queue, (KIND, query)) as tree, area.subdirectory(tree, str(batch)) as directory:
        for name in _listdir(directory):
            if _is_partition(name):
                with area.subdirectory(directory, name) as partition:
                    total = (total or 0) + (_sealed_messages(partition) if partition is not None else 0)
    return total


def _sealed_messages(partition: int) -> int:
    """How many messages a partition's seal says it claimed (0 if it has no readable seal)."""
    for name in _listdir(partition):
        if name.endswith(".end.json") and _FILE.match(name):
            content = _read_json(partition, name)
            if content is None:  # torn, being written: another generation's seal may stand
                continue
            messages = content.get("messages")
            return messages if type(messages) is int and messages >= 0 else 0
    return 0


def read_manifest(place: Place) -> Manifest:
    """The manifest at ``place`` (empty if there is none, or if its
    partition's name is no directory: a symbolic link is not followed).
    Files that do not parse or fail their seal are skipped: a chunk being
    written, torn, written by no one or damaged is no chunk."""
    manifest = Manifest(place)
    best: dict[int, int] = {}  # chunk -> generation of the receipts kept
    with area.opened(place.queue, place.parts[:-1]) as batch, area.subdirectory(batch, place.parts[-1]) as partition:
        if partition is None:
            return manifest
        for name in _listdir(partition):
            match = _FILE.match(name)
            if match is None:
                continue
            generation = int(match.group(1))
            # a name counts even if its content does not (being written, torn): a later
            # attempt must write a higher generation, since no file is ever replaced
            manifest.generation = max(manifest.generation, generation)
            content = _read_json(partition, name)
            if content is None:
                continue
            if match.group(2) == "end":
                chunks = content.get("chunks")
                if type(chunks) is int and chunks >= 0:
                    sealed = manifest.sealed_chunks
                    manifest.sealed_chunks = chunks if sealed is None else min(chunks, sealed)
                continue
            chunk = int(match.group(2))
            receipts = content.get("receipts")
            if not isinstance(receipts, list) or not all(isinstance(r, str) for r in receipts):
                continue
            if best.get(chunk, -1) < generation:
                best[chunk] = generation
                manifest.chunks[chunk] = receipts
    return manifest


def remove_partition(place: Place) -> None:
    """Remove a settled partition's manifest (and its batch directory once empty).

    A partition directory that holds entries of no manifest's (put there by
    hand, a client's leftovers) is moved aside under a name that is no
    partition's (``.left-pP-HEX``): else the next plans would find the
    partition again and plan its settling without end. Its entries stay for
    gc, which reports them and removes the query's tree after its grace. A
    ``pP`` that is no directory (a symbolic link, a file) is moved aside
    unfollowed: settling must never unlink a file outside the queue."""
    batch_name, name = place.parts[-2:]
    with area.opened(place.queue, place.parts[:-2]) as tree:
        if tree is None:
            return
        with area.subdirectory(tree, batch_name, os.path.dirname(place.path)) as batch:
            if batch is None:
                return
            if not _emptied(batch, name):
                _move_aside(batch, name)
                return
        with contextlib.suppress(OSError):  # not empty (another partition, a foreign entry), or gone
            os.rmdir(batch_name, dir_fd=tree)


def _emptied(batch: int, name: str) -> bool:
    """Unlink the manifest's files in partition directory ``name`` of
    ``batch``, then remove it: True (also if it is gone); False if it is no
    directory (a symbolic link: never followed) or holds foreign entries."""
    with area.subdirectory(batch, name) as partition:
        for entry in _listdir(partition):
            if _FILE.match(entry) or entry.startswith(ADAPTER_WRITING_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=partition)
    try:
        os.rmdir(name, dir_fd=batch)
    except FileNotFoundError:
        return True
    except OSError:  # not empty (foreign entries), or no directory (a link, a file)
        return False
    return True


def _move_aside(batch: int, name: str) -> None:
    """Rename partition directory ``name`` of ``batch`` to ``.left-pP-HEX`` (no partition's name), for gc."""
    with contextlib.suppress(OSError):
        os.rename(name, f"{_LEFT_PREFIX}{name}-{secrets.token_hex(4)}", src_dir_fd=batch, dst_dir_fd=batch)


def _is_partition(name: str) -> bool:
    """Whether ``name`` is a partition's directory name: ``pP`` with P below
    MAX_PARTITIONS (no batch has more). A higher one is a foreign entry: as a
    partition, it would plan a settle list that no offset of the source may
    hold, and the query would fail on it at every restart."""
    return _PARTITION.match(name) is not None and int(name[1:]) < MAX_PARTITIONS


def _listdir(directory: int | None) -> list[str]:
    """The names in ``directory`` (a descriptor; None: none)."""
    return [] if directory is None else area.names(directory)


def _read_json(directory: int, name: str) -> dict | None:
    """The object in file ``name`` of ``directory`` if it is a complete
    manifest file of a version read here (version 2: its seal matches), else None."""
    data = area.read_file(directory, name, MAX_MANIFEST_FILE)
    if data is None:
        return None
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


def _write_new(place: Place, name: str, content: dict) -> bool:
    """Write ``content`` durably as file ``name`` of ``place`` (its
    directories made where missing) unless that name exists (False:
    another attempt has it, complete or not)."""
    data = encode(content)
    for attempt in range(_MAKE_DIRECTORY_TRIES):
        with area.opened(place.queue, place.parts, create=True) as directory:
            assert directory is not None  # (made where missing)
            try:
                return area.create_file(directory, name, data)
            except FileNotFoundError:
                # gc removed the directory after it was reached (an empty one past its
                # grace, or the whole tree of a query idle for the stage grace): make it again
                if attempt == _MAKE_DIRECTORY_TRIES - 1:
                    raise
    raise AssertionError("unreachable")  # (the last attempt returns or raises)
