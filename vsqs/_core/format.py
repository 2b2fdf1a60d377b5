"""The on-disk format: the only place vsqs builds or parses a file name.

A queue is a directory. Each message is one file whose *name* carries its
state, so a listing alone tells every message's state (see docs/FORMAT.md,
which is the contract this module implements)::

    STEM                             ready, never received
    STEM.COUNT                       ready again after COUNT receives
    STEM.UNTIL.COUNT.TAG             hidden until UNTIL: in flight (COUNT >= 1)
                                     or delayed (COUNT == 0)
    STEM.new                         being written by a publisher

    STEM  = KEY [-gGROUP] [-rFIRST] [-oORIGIN] [-e]
    KEY   = P "-" SENT "-" RAND      the message id. P: 9 - priority;
                                     SENT: 16-digit epoch µs; RAND: 16 hex digits
    GROUP = 12 hex digits            hash of the message group
    FIRST = 13-digit epoch ms        when the message was first received (added by that receive)
    ORIGIN= 8 hex digits             id of the queue a dead letter came from
    -e                               the file holds an envelope (attributes), not a bare body
    UNTIL = 16-digit epoch µs        TAG: 12 lowercase hex digits, secret and new per
                                     receive (a visibility change keeps it)

Names sort in delivery order (priority first, then send time). No I/O here.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import random
import re
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from vsqs._core import limits
from vsqs._core.errors import IncompatibleFormat, InvalidArgument, InvalidReceipt
from vsqs._core.rules import check_group, load_json

FORMAT_VERSION = 3  # the newest format this vsqs reads, and the one of the queues it creates
UNSHARDED_FORMAT = 1  # format 1: no shards (what vsqs before format 3 created for a queue without shards)
SHARDED_FORMAT = 2  # format 2: format 1 and shards (format 3: format 2 and the first receive's -rFIRST)
FIRST_RECEIVE_FORMAT = 3  # the first format whose receives write -rFIRST (older readers ignore such names)
SETTINGS_FORMAT = 2  # settings versions: in queues of every format (a higher one would lock older vsqs out)
METADATA_NAME = ".vsqs.json"
SHARDS_DIR = "shards"  # in a sharded queue: shards/00 .. shards/NN hold the messages
MAX_SHARDS = limits.MAX_SHARDS
SOURCES_DIR = ".sources"  # in a dead-letter queue: QUEUE_ID -> path of the queue it serves
MAX_COUNT = limits.MAX_RECEIVE_COUNT
DEFAULT_PRIORITY = limits.DEFAULT_PRIORITY
MAX_PRIORITY = limits.MAX_PRIORITY

_KEY = r"[0-9]-[0-9]{16}-[0-9a-f]{16}"
_COUNT = r"0|[1-9][0-9]{0,8}"
# -rFIRST is not captured: its time is read from the stem only when asked (first_receive_ms)
_STEM = (rf"(?P<key>{_KEY})(?:-g(?P<group>[0-9a-f]{{12}}))?(?:-r[0-9]{{13}})?"
         rf"(?:-o(?P<origin>[0-9a-f]{{8}}))?(?P<envelope>-e)?")
_NAME_RE = re.compile(
    rf"(?P<stem>{_STEM})"
    rf"(?:\.(?P<ready_count>[1-9][0-9]{{0,8}})"
    rf"|\.(?P<until>[0-9]{{16}})\.(?P<count>{_COUNT})\.(?P<tag>[0-9a-f]{{12}})"
    rf"|(?P<new>\.new))?"
)
_KEY_RE = re.compile(_KEY)
_STEM_RE = re.compile(_STEM)
KEY_LENGTH = 35
ENVELOPE_FLAG = "-e"
FIRST_RECEIVE_FLAG = "-r"  # -rFIRST: the first receive's epoch ms, 13 digits (see received_stem)
_GROUP_FLAG_LENGTH = 14  # "-g" and 12 hex digits
_QUEUE_ID_RE = re.compile(r"[0-9a-f]{8}")
RECEIPT_SEPARATOR = ":"


class State(str, enum.Enum):
    """What a file name says about its message (before looking at the clock)."""

    READY = "ready"
    HIDDEN = "hidden"  # in flight or delayed: visible again from `until`
    WRITING = "writing"


class Name(NamedTuple):
    """A parsed message file name (a tuple: parsing is on every hot path)."""

    stem: str  # the part that stays while the message lives in one queue
    state: State
    receive_count: int = 0
    until_us: int = 0  # hidden names only
    tag: str = ""  # hidden names only
    group_hash: str = ""  # 12 hex digits for a message of a group
    origin: str = ""  # queue id a dead letter came from
    envelope: bool = False  # the file holds a header line before the body

    @property
    def key(self) -> str:
        """The message id: the first 35 characters of the stem."""
        return self.stem[:KEY_LENGTH]

    @property
    def sent_us(self) -> int:
        return int(self.stem[2:18])

    @property
    def priority(self) -> int:
        return MAX_PRIORITY - int(self.stem[0])

    @property
    def first_receive_ms(self) -> int | None:
        """When the message was first received (epoch ms), ``None`` if its name does not say."""
        return first_receive_ms(self.stem)

    def __str__(self) -> str:
        if self.state is State.READY:
            return ready_name(self.stem, self.receive_count)
        if self.state is State.HIDDEN:
            return hidden_name(self.stem, self.until_us, self.receive_count, self.tag)
        return writing_name(self.stem)


def parse_name(name: str) -> Name | None:
    """Parse a directory entry; ``None`` for anything not of the grammar."""
    if "." not in name:  # STEM alone: ready, never received (most names of a deep queue)
        if len(name) == KEY_LENGTH:  # no room for a flag: the stem can only be a KEY
            return _new_name(Name, (name, _READY, 0, 0, "", "", "", False)) if _KEY_RE.fullmatch(name) else None
        m = _STEM_RE.fullmatch(name)
        if m is None:
            return None
        _key, group, origin, envelope = m.groups()
        return _new_name(Name, (name, State.READY, 0, 0, "", group or "", origin or "", envelope is not None))
    m = _NAME_RE.fullmatch(name)
    if m is None:
        return None
    # positional groups (see _NAME_RE): cheaper than looking each up by name
    stem, _key, group, origin, envelope, ready_count, until, count, tag, new = m.groups()
    group, origin, envelope = group or "", origin or "", envelope is not None
    if until is not None:
        return _new_name(Name, (stem, State.HIDDEN, int(count), int(until), tag, group, origin, envelope))
    if new is not None:
        return _new_name(Name, (stem, State.WRITING, 0, 0, "", group, origin, envelope))
    count = int(ready_count) if ready_count else 0
    return _new_name(Name, (stem, State.READY, count, 0, "", group, origin, envelope))


# Name(...) without NamedTuple's generated Python __new__: parse_name is on every hot path
_new_name = tuple.__new__
_READY = State.READY


def is_message_name(name: str) -> bool:
    """Whether ``name`` is of the grammar (cheaper than parsing it)."""
    return _NAME_RE.fullmatch(name) is not None


class Triage(NamedTuple):
    """One directory listing sorted out by state, with as little parsing as it can."""

    visible: list[str]  # ungrouped names claimable now; dotless ones not yet validated
    hidden: list[tuple[int, str]]  # (until_us, name): ungrouped names hidden until then
    grouped: list[Name]  # messages of groups, parsed, in any state but writing
    writing: list[str]  # .new files


def triage(names: Iterable[str], visible_from_us: int) -> Triage:
    """Sort the entries of a queue directory out by state, for receive.

    A hidden name counts as visible when its UNTIL <= ``visible_from_us``.
    Most entries of a deep queue are never-received ready names, ``STEM``
    with no dot: those are passed through unparsed (a foreign dotless name
    gets in too; whoever claims a name must parse it first, see
    :func:`parse_name`). A name shaped ``STEM.UNTIL.`` with no group flag
    and an UNTIL still to come goes to ``hidden`` unparsed too: a queue whose
    consumers hold many messages in flight lists them on every listing, and
    nothing is claimed without being parsed first (a foreign name of that
    shape is tried, and skipped, once its time comes). Every other name with
    a dot, or with a group flag, is parsed here.
    """
    visible: list[str] = []
    hidden: list[tuple[int, str]] = []
    grouped: list[Name] = []
    writing: list[str] = []
    for name in names:
        if "-g" not in name:  # no KEY holds a "g": only a group flag does
            if "." not in name:
                visible.append(name)
                continue
            dot = name.find(".")
            if name[dot + 17 : dot + 18] == ".":  # (a ready count has at most 9 digits)
                until = name[dot + 1 : dot + 17]
                if until.isdigit() and until.isascii() and (until_us := int(until)) > visible_from_us:
                    hidden.append((until_us, name))
                    continue
        parsed = parse_name(name)
        if parsed is None:
            continue
        if parsed.state is State.WRITING:
            writing.append(name)
        elif parsed.group_hash:
            grouped.append(parsed)
        elif parsed.state is State.HIDDEN and parsed.until_us > visible_from_us:
            hidden.append((parsed.until_us, name))
        else:
            visible.append(name)
    return Triage(visible, hidden, grouped, writing)


def group_of(name: str) -> str:
    """The group hash of a message name already known to be of the grammar ("" if none)."""
    return name[KEY_LENGTH + 2 : KEY_LENGTH + 14] if name.startswith("-g", KEY_LENGTH) else ""


def make_stem(key: str, *, group_hash: str = "", origin: str = "", envelope: bool = False) -> str:
    """The stem of a message: its key and the flags that travel with it."""
    if not (group_hash or origin or envelope):
        return key
    return (
        key
        + (f"-g{group_hash}" if group_hash else "")
        + (f"-o{origin}" if origin else "")
        + (ENVELOPE_FLAG if envelope else "")
    )


def with_origin(name: Name, origin: str, first_receive: bool = True) -> str:
    """The stem of ``name`` marked as a dead letter of queue ``origin`` (its
    first receive kept if the dead-letter queue takes ``-r``: ``first_receive``,
    format 3), or with ``origin=""`` unmarked for redrive: back to
    a never-received stem (the receive count starts again at 0, so does the
    first receive)."""
    stem = make_stem(name.key, group_hash=name.group_hash, origin=origin, envelope=name.envelope)
    first = name.first_receive_ms if origin and first_receive else None
    return stem if first is None else _with_first(stem, name.group_hash, first)


def received_stem(name: Name, now_us: int) -> str:
    """The stem ``name`` takes when it is received at ``now_us`` in a queue of
    format 3 (older formats keep the stem: their readers may be older vsqs,
    for which ``-r`` names are foreign): at its first
    receive (count 0) the stem gains ``-rFIRST``, FIRST = now in epoch ms, so
    every later name of the message (hidden, ready again, dead letter) keeps
    when it was first received at no cost of its own; afterwards it stays.
    A name that has ``-r`` already (forged with count 0) keeps it: one flag."""
    stem = name.stem
    if name.receive_count:
        return stem
    at = KEY_LENGTH + _GROUP_FLAG_LENGTH if name.group_hash else KEY_LENGTH
    if stem.startswith(FIRST_RECEIVE_FLAG, at):
        return stem
    return "%s-r%013d%s" % (stem[:at], now_us // 1000, stem[at:])  # noqa: UP031 - cheaper than an f-string


def _with_first(stem: str, group_hash: str, first_ms: int) -> str:
    at = KEY_LENGTH + _GROUP_FLAG_LENGTH if group_hash else KEY_LENGTH
    return f"{stem[:at]}{FIRST_RECEIVE_FLAG}{first_ms:013d}{stem[at:]}"


def first_receive_ms(name: str) -> int | None:
    """The first receive's epoch ms that the stem of ``name`` (a stem or a
    whole name, known to be of the grammar) records, ``None`` if none: a
    message never received, or received only by a vsqs from before ``-r``."""
    at = KEY_LENGTH + _GROUP_FLAG_LENGTH if name.startswith("-g", KEY_LENGTH) else KEY_LENGTH
    if name.startswith(FIRST_RECEIVE_FLAG, at):
        return int(name[at + 2 : at + 15])
    return None


def is_key(text: str) -> bool:
    return _KEY_RE.fullmatch(text) is not None


def sent_us_of(key: str) -> int:
    return int(key[2:18])


def ready_name(stem: str, receive_count: int = 0) -> str:
    return stem if receive_count == 0 else f"{stem}.{min(receive_count, MAX_COUNT)}"


def hidden_name(stem: str, until_us: int, receive_count: int, tag: str | None = None) -> str:
    """``STEM.UNTIL.COUNT.TAG``, with a fresh TAG unless one is given (on every receive)."""
    count = receive_count if receive_count < MAX_COUNT else MAX_COUNT  # noqa: FURB136 - min() costs more
    # %-formatting: a quarter fewer instructions than an f-string with format specs
    return "%s.%016d.%d.%s" % (stem, until_us, count, tag or new_tag())  # noqa: UP031


def writing_name(stem: str) -> str:
    return f"{stem}.new"


def now_us() -> int:
    """Wall-clock epoch microseconds: hosts share no monotonic clock."""
    return time.time_ns() // 1000


# Two sources of randomness, kept apart. ``_ids`` (a Mersenne Twister, cheap,
# no system call) makes what is published or only keeps names apart: the
# random part of keys (message ids are public, and ~312 of them rebuild its
# state) and the skips after a lost race. A TAG is secret: who knows a hidden
# name holds its message (delete, change visibility, current_receipt), so
# tags come from the OS's cryptographic generator, never from ``_ids``.
_ids = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)  # a forked child must not repeat its parent's keys
_urandom = os.urandom
_TAGS_PER_DRAW = 256  # tags drawn from the OS at once: one system call for many receives
_tag_pool: list[str] = []  # tags drawn ahead, handed out once each (list.pop is atomic)


def _forget_tags() -> None:
    _tag_pool.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_tags)  # a forked child never hands out its parent's tags


def random_below(n: int) -> int:
    """A random integer in 0..n-1, not for secrets (reseeded in a forked child)."""
    return _ids.randrange(n)


def new_tag() -> str:
    """A fresh TAG: 48 bits from the OS's cryptographic generator. It makes
    every claim's destination name unique, and it is the secret of a
    receive: a change of visibility keeps it (only UNTIL changes), so whoever
    holds a receipt of the receive, and nobody else, can find the message's
    current name (:meth:`vsqs.Queue.current_receipt`). Drawn ahead in
    batches (a system call per receive cost about 2% of one)."""
    try:
        return _tag_pool.pop()
    except IndexError:
        drawn = _urandom(6 * _TAGS_PER_DRAW).hex()
        _tag_pool.extend([drawn[i : i + 12] for i in range(12, len(drawn), 12)])
        return drawn[:12]


class _KeyClock:
    """Hands out send times that strictly increase within this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next(self) -> int:
        with self._lock:
            self._last = max(now_us(), self._last + 1)
            return self._last


_clock = _KeyClock()


def new_key(priority: int = DEFAULT_PRIORITY) -> str:
    """A message key: fixed width, sortable, unique across hosts and processes.

    Send times strictly increase within a process (FIFO per producer); 64
    random bits make two processes' keys differ even at the same microsecond.
    They come from this process's Mersenne Twister, seeded from the OS and
    reseeded in a forked child: no system call per key. A key is published
    (the message id) and predictable from earlier ones: it is no secret, and
    nothing secret comes from that generator (see ``_ids``).
    """
    return f"{MAX_PRIORITY - priority}-{_clock.next():016d}-{_ids.getrandbits(64):016x}"


def sequence_number(key: str) -> str:
    """SQS's SequenceNumber of message ``key``: its send time (µs) and random
    part as one decimal number, SEND_US * 2**64 + RANDOM (35 digits until the
    year 2286). Keys of one priority (every message of a group has the same)
    sort as these numbers do, so within a group it increases in delivery order."""
    if not is_key(key):
        raise InvalidArgument(f"not a message id: {key!r}")
    return str(int(key[2:18]) * 2**64 + int(key[19:], 16))


# A key packed into a UUID (RFC 9562, version 8: a layout of its own): the
# 122 bits a UUID leaves free after its version and variant hold P (4 bits),
# SENT (54 bits: 16 decimal digits < 2**54) and RAND (64 bits), in that order,
# so the mapping is one to one, reversible, and keeps the keys' order.
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_LOW_62 = (1 << 62) - 1
_LOW_64 = (1 << 64) - 1
_SENT_LIMIT = 10**16


def key_uuid(key: str) -> str:
    """Message ``key`` as a UUID (8-4-4-4-12 lower-case hex, version 8, variant
    RFC 9562): P, SENT and RAND packed into its 122 free bits. Distinct keys
    give distinct UUIDs, which sort as the keys do; :func:`key_of_uuid` undoes it."""
    if not is_key(key):
        raise InvalidArgument(f"not a message id: {key!r}")
    packed = (int(key[0]) << 118) | (int(key[2:18]) << 64) | int(key[19:], 16)
    value = (packed >> 74) << 80 | 0x8 << 76 | ((packed >> 62) & 0xFFF) << 64 | 0b10 << 62 | (packed & _LOW_62)
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def key_of_uuid(text: str) -> str:
    """The message key that :func:`key_uuid` made ``text`` of; :class:`InvalidArgument`
    for any other text (another UUID, upper case, no UUID at all)."""
    if not isinstance(text, str) or not _UUID_RE.fullmatch(text):
        raise InvalidArgument(f"not the UUID of a message id: {text!r}")
    value = int(text.replace("-", ""), 16)
    packed = (value >> 80) << 74 | ((value >> 64) & 0xFFF) << 62 | (value & _LOW_62)
    priority, sent = packed >> 118, (packed >> 64) & ((1 << 54) - 1)
    if priority > MAX_PRIORITY or sent >= _SENT_LIMIT:
        raise InvalidArgument(f"not the UUID of a message id: {text!r}")
    return f"{priority}-{sent:016d}-{packed & _LOW_64:016x}"


# -- stages: private directories whose messages a commit publishes at once --

_STAGE_RE = re.compile(rf"[A-Za-z0-9_-]{{1,{limits.MAX_STAGE_NAME}}}")
STAGE_PREFIX = ".stage."


def stage_dir_name(stage: str) -> str:
    """The directory (inside the queue) that holds a stage's messages."""
    if not isinstance(stage, str) or not _STAGE_RE.fullmatch(stage):
        raise InvalidArgument(f"stage must be 1-128 characters of A-Z a-z 0-9 _ -, not {stage!r}")
    return STAGE_PREFIX + stage


def parse_stage_dir(name: str) -> str | None:
    """The stage name of a queue entry, or ``None`` if it is no stage directory."""
    if name.startswith(STAGE_PREFIX) and _STAGE_RE.fullmatch(name[len(STAGE_PREFIX) :]):
        return name[len(STAGE_PREFIX) :]
    return None


# -- receive throttling: one token file per receive in .throttle/ ------------

THROTTLE_DIR = ".throttle"
_THROTTLE_RE = re.compile(r"([0-9]{1,15})\.(0|[1-9][0-9]{0,9})")


def throttle_token(window: int, index: int) -> str:
    """Token ``index`` of time window ``window`` (epoch seconds // window length)."""
    return f"{window}.{index}"


def parse_throttle_token(name: str) -> int | None:
    """The window of a token name, or ``None``."""
    m = _THROTTLE_RE.fullmatch(name)
    return int(m[1]) if m else None


# -- waiting processes: one empty file per process in .waiting/ -------------

WAITING_DIR = ".waiting"
_WAITER_RE = re.compile(r"([0-9a-f]{16})-([1-9][0-9]{0,9})-([0-9]{1,20})")


def waiter_name(boot: str, pid: int, start: int) -> str:
    """The entry of a process with waiting receives: its host's boot (16 hex digits), pid,
    and start time (clock ticks after boot: with the pid, one process of that boot)."""
    return f"{boot}-{pid}-{start}"


def parse_waiter_name(name: str) -> tuple[str, int, int] | None:
    """The boot, pid and start time of a waiter entry, or ``None``."""
    m = _WAITER_RE.fullmatch(name)
    return (m[1], int(m[2]), int(m[3])) if m else None


def waiter_key(name: str, waiter: str) -> tuple[int, str]:
    """Where ``waiter`` comes in the order of the message ``name``: a hash of the two
    (ties by the entry), so each message has its own order and every process computes
    the same one without talking to the others."""
    return zlib.crc32(f"{name}/{waiter}".encode()), waiter


def waiter_rank(name: str, waiters: Iterable[str], me: str) -> int:
    """How many of ``waiters`` come before ``me`` in the order of the message ``name``."""
    mine = waiter_key(name, me)
    return sum(1 for waiter in waiters if waiter_key(name, waiter) < mine)


# -- spool-wide claims: one token file per task and period in .claims/ -------

CLAIMS_DIR = ".claims"
CLAIM_TASK_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_CLAIM_RE = re.compile(r"([a-z][a-z0-9_-]{0,31})\.([0-9]{1,15})")


def claim_token(task: str, period: int) -> str:
    """The token of ``task`` for time period ``period`` (epoch seconds // period length)."""
    return f"{task}.{period}"


def parse_claim_token(name: str) -> tuple[str, int] | None:
    """The task and period of a claim token name, or ``None``."""
    m = _CLAIM_RE.fullmatch(name)
    return (m[1], int(m[2])) if m else None


RECORDS_DIR = ".records"  # a task's records per period (Spool.put_record), named as its claims


# -- when a queue was deleted (the spool's .deleted/) and purged (a queue's .purged/) --

DELETED_DIR = ".deleted"  # in the spool's root: one empty file per deletion, NAME.WHEN
PURGED_DIR = ".purged"  # in a queue: one empty file per purge of the whole queue, WHEN
_DELETED_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,79})\.([0-9]{16})")
_PURGED_RE = re.compile(r"[0-9]{16}")


def deleted_record(name: str, when_us: int) -> str:
    """``NAME.WHEN``: queue ``name`` was deleted at ``when_us`` (16-digit epoch µs)."""
    return "%s.%016d" % (name, when_us)  # noqa: UP031


def parse_deleted_record(entry: str) -> tuple[str, int] | None:
    """The queue name and time (µs) of a ``.deleted/`` entry, or ``None``."""
    m = _DELETED_RE.fullmatch(entry)
    return (m[1], int(m[2])) if m and ".." not in m[1] else None


def purged_record(when_us: int) -> str:
    """``WHEN``: the queue was purged at ``when_us`` (16-digit epoch µs)."""
    return "%016d" % when_us  # noqa: UP031


def parse_purged_record(entry: str) -> int | None:
    """The time (µs) of a ``.purged/`` entry, or ``None``."""
    return int(entry) if _PURGED_RE.fullmatch(entry) else None


def newest_time(times: Iterable[int], now_us: int) -> int | None:
    """The newest of ``times`` (µs), for a record of when something happened:
    a time more than ``RECORD_AHEAD`` seconds ahead of ``now_us`` is none
    (planted, or from a clock far off), one less ahead is taken as ``now_us``;
    ``None`` if none is left."""
    limit = now_us + int(limits.RECORD_AHEAD * 1_000_000)
    newest = max((t for t in times if t <= limit), default=None)
    return None if newest is None else min(newest, now_us)


# -- receipts ---------------------------------------------------------------


class SlotRef(NamedTuple):
    """Which group slot lease a receipt holds: slot ``index``, lease generation ``gen``
    (the newest one its holder knows of); for a member of a run (several
    messages of a group taken by one receive, see :mod:`vsqs._core.groups`),
    the generation that took the slot for the run (``run``), the message's
    place in it (``member``) and how many messages it has (``size``).
    (A named tuple: one is made on every claim, and a frozen dataclass costs
    several times as much to make.)"""

    index: int  # type: ignore[assignment]  # the field hides tuple.index, which nothing here calls
    gen: int
    run: int = 0  # 0: a message alone on its slot
    member: int = 0
    size: int = 1


_SLOT_REF_RE = re.compile(
    r"(0|[1-9][0-9]{0,5})\.([1-9][0-9]{0,17})(?:\.([1-9][0-9]{0,17})\.(0|[1-9][0-9]{0,2})\.([1-9][0-9]{0,2}))?"
)


def make_receipt(queue_id: str, hidden: str, slot: SlotRef | None = None) -> str:
    if slot is None:
        return queue_id + RECEIPT_SEPARATOR + hidden
    if slot.run:  # S.GEN.RUN.MEMBER.SIZE: a form vsqs before runs refuses (InvalidReceipt), see FORMAT.md
        return (f"{queue_id}{RECEIPT_SEPARATOR}{hidden}{RECEIPT_SEPARATOR}"
                f"{slot.index}.{slot.gen}.{slot.run}.{slot.member}.{slot.size}")
    return f"{queue_id}{RECEIPT_SEPARATOR}{hidden}{RECEIPT_SEPARATOR}{slot.index}.{slot.gen}"


def _slot_ref(text: str) -> SlotRef | None:
    """The slot part of a receipt, or None if it is not one (a run's numbers must agree)."""
    m = _SLOT_REF_RE.fullmatch(text)
    if m is None:
        return None
    if m[3] is None:
        return SlotRef(int(m[1]), int(m[2]))
    gen, run, member, size = int(m[2]), int(m[3]), int(m[4]), int(m[5])
    if not (run <= gen and 1 <= size <= limits.MAX_RUN and member < size):  # (K = 1: a hand-over's)
        return None
    return SlotRef(int(m[1]), gen, run, member, size)


def parse_receipt(queue_id: str, receipt: object) -> tuple[Name, str, SlotRef | None]:
    """Validate a receipt of queue ``queue_id``; return its in-flight name
    (parsed, and as text) and, for a message of a group, the slot lease it holds.

    A receipt can only ever name a hidden message file of this queue: no
    separator, path or foreign name gets through.
    """
    if not isinstance(receipt, str):
        raise InvalidReceipt(f"receipt must be a str, not {type(receipt).__name__}")
    parts = receipt.split(RECEIPT_SEPARATOR)
    parsed = parse_name(parts[1]) if len(parts) in (2, 3) else None
    slot = None
    if parsed is not None and len(parts) == 3:
        slot = _slot_ref(parts[2]) if parsed.group_hash else None
        if slot is None:
            parsed = None
    if parsed is not None and parsed.group_hash and slot is None:
        parsed = None  # a message of a group is always received with a slot
    if parsed is None or parsed.state is not State.HIDDEN or not _QUEUE_ID_RE.fullmatch(parts[0]):
        shown = receipt if len(receipt) <= 80 else receipt[:77] + "..."
        raise InvalidReceipt(f"malformed receipt: {shown!r}")
    if parts[0] != queue_id:
        raise InvalidReceipt(
            f"receipt belongs to another queue (queue id {parts[0]}, this queue is {queue_id})"
        )
    return parsed, parts[1], slot


# -- message groups: slot leases in .groups/ -----------------------------------

GROUPS_DIR = ".groups"
_LEASE_RE = re.compile(r"([0-9a-f]{12})\.(0|[1-9][0-9]{0,5})\.([1-9][0-9]{0,17})")


def group_hash(group: object) -> str:
    """The 12 hex digits that stand for a message group in names."""
    return hashlib.sha256(check_group(group).encode("utf-8")).hexdigest()[:12]


def lease_name(group: str, index: int, gen: int) -> str:
    """Generation ``gen`` of slot ``index`` of a group (``group`` is its hash)."""
    return f"{group}.{index}.{gen}"


def parse_lease_name(name: str) -> tuple[str, int, int] | None:
    m = _LEASE_RE.fullmatch(name)
    return (m[1], int(m[2]), int(m[3])) if m else None


# A member of a run that is done (deleted, released, made visible) leaves a
# mark GROUP.S.RUN.dMEMBER beside the slot's chain, and one whose message left
# the queue (deleted, dead-lettered) GROUP.S.RUN.xMEMBER first; names vsqs
# before runs does not parse as a lease, so it ignores them (FORMAT.md, Runs).
_RUN_MARK_RE = re.compile(r"([0-9a-f]{12})\.(0|[1-9][0-9]{0,5})\.([1-9][0-9]{0,17})\.[dx](0|[1-9][0-9]{0,2})")
DONE_MARK = "d"  # the member is done for its run: deleted, released, made visible, taken over
GONE_MARK = "x"  # the member's message left the queue (written before DONE_MARK)


def run_mark_name(group: str, index: int, run: int, member: int, kind: str = DONE_MARK) -> str:
    """The mark that member ``member`` of the run begun by generation ``run`` of the slot is done
    (``kind`` DONE_MARK), or that its message left the queue (GONE_MARK)."""
    return f"{group}.{index}.{run}.{kind}{member}"


def parse_run_mark(name: str) -> tuple[str, int, int, int] | None:
    m = _RUN_MARK_RE.fullmatch(name)
    return (m[1], int(m[2]), int(m[3]), int(m[4])) if m else None


# The record of a generation of a slot's chain, GROUP.S.GEN.r: the runs it holds
# (see FORMAT.md, Runs: Records). Not a lease's name nor a mark's: vsqs before
# records ignores it.
_RUN_RECORD_RE = re.compile(r"([0-9a-f]{12})\.(0|[1-9][0-9]{0,5})\.([1-9][0-9]{0,17})\.r")
_RECORD_LINE_RE = re.compile(rf"([1-9][0-9]{{0,17}})((?: {_KEY}){{1,{limits.MAX_RUN}}})")
MAX_RECORD_RUNS = 100  # lines of a record


class RunEntry(NamedTuple):
    """A run a record names: the generation that took it and its members' KEYs, in order."""

    run: int
    keys: tuple[str, ...]


def run_record_name(group: str, index: int, gen: int) -> str:
    """The record of generation ``gen`` of slot ``index`` of a group."""
    return f"{group}.{index}.{gen}.r"


def parse_run_record_name(name: str) -> tuple[str, int, int] | None:
    m = _RUN_RECORD_RE.fullmatch(name)
    return (m[1], int(m[2]), int(m[3])) if m else None


def encode_run_record(runs: list[RunEntry]) -> bytes | None:
    """A record's content; None if it would be too large to be read back."""
    data = "".join(f"{entry.run} {' '.join(entry.keys)}\n" for entry in runs).encode()
    return data if len(runs) <= MAX_RECORD_RUNS and len(data) <= limits.MAX_CONTROL_FILE else None


def decode_run_record(data: bytes, gen: int) -> list[RunEntry] | None:
    """The runs a record of generation ``gen`` names; None if it is unknown (empty:
    being written; anything that does not parse in full, or breaks a bound)."""
    if not data or len(data) > limits.MAX_CONTROL_FILE or not data.endswith(b"\n"):
        return None
    try:
        lines = data.decode("ascii").split("\n")[:-1]
    except UnicodeDecodeError:
        return None
    if len(lines) > MAX_RECORD_RUNS:
        return None
    runs: list[RunEntry] = []
    for line in lines:
        m = _RECORD_LINE_RE.fullmatch(line)
        if m is None or int(m[1]) > gen:
            return None
        runs.append(RunEntry(int(m[1]), tuple(m[2].split())))
    return runs


FREE_LEASE = b"free\n"


def encode_lease(until_us: int) -> bytes:
    return f"{until_us:016d}\n".encode()


def decode_lease(data: bytes) -> int | None:
    """The time a lease runs out (0 if free), or ``None`` if unreadable (being written)."""
    if data == FREE_LEASE:
        return 0
    text = data.decode("ascii", "replace").strip()
    return int(text) if len(text) == 16 and text.isdigit() else None


# -- queue metadata -----------------------------------------------------------


def is_queue_id(text: str) -> bool:
    return _QUEUE_ID_RE.fullmatch(text) is not None


def new_queue_id() -> str:
    return secrets.token_hex(4)


class Metadata(NamedTuple):
    """What ``.vsqs.json`` fixes for the life of a queue."""

    queue_id: str
    shards: int  # 1: messages in the queue directory; else in shards/00 .. shards/NN
    # format >= 3: a first receive writes -rFIRST (older formats: never, so older vsqs still reads every name)
    first_receive: bool = False


def check_shards(shards: object) -> int:
    """A shard count: a power of two from 1 to MAX_SHARDS."""
    if (isinstance(shards, bool) or not isinstance(shards, int)
            or not 1 <= shards <= MAX_SHARDS or shards & (shards - 1)):
        raise InvalidArgument(f"shards must be a power of two from 1 to {MAX_SHARDS}, not {shards!r}")
    return shards


def encode_metadata(queue_id: str, shards: int = 1, *, first_receive: bool = True) -> bytes:
    """The metadata of a new queue: format 3; without ``first_receive``, the
    format 1 or 2 that vsqs before format 3 writes (a queue it can share)."""
    version = FORMAT_VERSION if first_receive else UNSHARDED_FORMAT if shards == 1 else SHARDED_FORMAT
    doc: dict[str, Any] = {"format": version, "queue_id": queue_id, "created": time.time()}
    if version != UNSHARDED_FORMAT:
        doc["shards"] = shards
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


def decode_metadata(data: bytes, where: str) -> Metadata:
    """Check the format version; return the queue id, its shard count and
    whether its receives record the first one (format 3)."""
    try:
        doc = load_json(data)
        version, queue_id = doc["format"], doc["queue_id"]
        if version not in (UNSHARDED_FORMAT, SHARDED_FORMAT, FORMAT_VERSION) or isinstance(version, bool):
            raise IncompatibleFormat(
                f"{where}: queue format {version!r}, this vsqs reads formats {UNSHARDED_FORMAT} to {FORMAT_VERSION}"
            )
        shards = 1 if version == UNSHARDED_FORMAT else doc["shards"]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise IncompatibleFormat(f"{where}: unreadable queue metadata ({exc})") from None
    if not isinstance(queue_id, str) or not _QUEUE_ID_RE.fullmatch(queue_id):
        raise IncompatibleFormat(f"{where}: bad queue_id {queue_id!r} in queue metadata")
    try:
        check_shards(shards)
        if version == SHARDED_FORMAT and shards == 1:
            raise InvalidArgument("format 2 is for shards >= 2")
    except InvalidArgument:
        raise IncompatibleFormat(f"{where}: bad shards {shards!r} in queue metadata") from None
    return Metadata(queue_id, shards, version >= FIRST_RECEIVE_FORMAT)


# -- shards ---------------------------------------------------------------------


def shard_dir_name(index: int) -> str:
    """The directory of shard ``index``, relative to the queue: ``shards/0a``."""
    return f"{SHARDS_DIR}/{index:02x}"


def shard_locator(places: list[str]) -> Callable[[str], str]:
    """A function from a message name of the grammar to ``places[shard_of(name)]``,
    for the hot paths: a table lookup instead of parsing hex digits."""
    mask = len(places) - 1
    by_digits = {f"{i:02x}": places[i & mask] for i in range(256)}
    assert KEY_LENGTH == 35  # the literal slices below: RAND's first digits, then "-g" GROUP

    def locate(name: str) -> str:
        return by_digits[name[37:39] if name[35:37] == "-g" else name[19:21]]

    return locate


def shard_of(name: str, shards: int) -> int:
    """The shard a message of the grammar lives in: chosen by the first two hex
    digits of its GROUP if it has one (a group stays in one directory, in
    order), else of its RAND. Every name of a message's life (the stem stays)
    maps to the same shard; a dead letter's maps by the same rule in its
    dead-letter queue."""
    if name.startswith("-g", KEY_LENGTH):
        return int(name[KEY_LENGTH + 2 : KEY_LENGTH + 4], 16) & (shards - 1)
    return int(name[19:21], 16) & (shards - 1)
