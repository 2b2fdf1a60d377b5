"""The console's records: one sample of every queue a period, as the spool
keeps it (``.records/console.PERIOD``, docs/FORMAT.md, Spools), written and
checked.

A record is hostile until checked: whoever can write the spool can plant
one for any period, ahead of time too (the first writer of a period's
record wins). A reader takes it for a sample only if it holds together:

* its time lies in its period: its sampling started (``t - d``) in the
  period its file is named for, and ended (``t``) no later than the
  reader's clock allows (:data:`SKEW`);
* each of its entries (the first :data:`MAX_QUEUES` are read) is a queue
  name with four counts, integers 0 <= n < 2**63 (no bools, no floats), and
  an age, a finite number 0 <= x < 2**63; ``t`` and ``d`` are there, finite,
  and ``d`` >= 0.

Any other record that parses is damaged: reported and left out, never
drawn (:class:`DamagedRecord`).

A gateway signs its own records (``"m"``: HMAC-SHA256, under a key its
workers share, of the period's file name and the record), so that its
workers can tell its samples from records anyone else wrote: only a signed
sample stands in for a queue's live counts (``views.StatsCache``); another
gateway's records (another key) are drawn in the charts if they hold
together, never taken for live counts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass
from itertools import islice
from typing import Any, TypeGuard

from vsqs import QueueStats, VsqsError
from vsqs._core.rules import is_queue_name, load_json

TASK = "console"
MAX_QUEUES = 500  # queues a sample holds (the first by name): bounds a record and the memory
FIELDS = ("ready", "in_flight", "delayed", "dead_lettered", "oldest_ready_age")
MAX_COUNT = 2**63  # counts, ages and times are below it
SKEW = 60.0  # seconds a record's time may lie ahead of the reader's clock (hosts are NTP-synchronised)
_ROUNDING = 0.001  # "d" is written to the millisecond
_SIGNATURE_HEAD, _SIGNATURE_TAIL = b',"m":"', b'"}'
_SIGNED_LENGTH = len(_SIGNATURE_HEAD) + 64 + len(_SIGNATURE_TAIL)


class DamagedRecord(VsqsError, ValueError):
    """A record that parses but does not hold together; the message says why."""


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds: when the sampling ended
    queues: dict[str, tuple[float, ...]]  # name -> the FIELDS
    took: float = 0.0  # seconds the sampling took
    signed: bool = False  # written by a worker of this gateway (its key checks the record's signature)


def key_of(secret: str | bytes) -> bytes:
    """The key that signs records, derived from the workers' shared secret."""
    return hmac.new(secret.encode() if isinstance(secret, str) else secret, b"vsqs console records",
                    hashlib.sha256).digest()


def encode(at: float, stats: dict[str, QueueStats], took: float = 0.0, *, period: int = 0,
           key: bytes | None = None) -> bytes:
    """A record of ``stats``; signed for ``period`` with ``key`` if one is given."""
    queues = {name: [s.ready, s.in_flight, s.delayed, s.dead_lettered, round(s.oldest_ready_age, 3)]
              for name, s in stats.items()}
    body = json.dumps({"t": at, "d": round(took, 3), "queues": queues}, separators=(",", ":")).encode()
    if key is None:
        return body
    return body[:-1] + _SIGNATURE_HEAD + _signature(key, period, body) + _SIGNATURE_TAIL


def decode(data: bytes, period: int, seconds: float, now: float, key: bytes | None = None) -> Sample | None:
    """The sample of ``period``'s record (periods of ``seconds``); None if it does not
    parse (being written, or not JSON); :class:`DamagedRecord` if it does not hold
    together. Reading costs at most what parsing the (1 MiB at most) record costs."""
    try:
        doc = load_json(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("queues"), dict):
        raise DamagedRecord("not an object with queues")
    at, took = doc.get("t"), doc.get("d")
    if not _finite(at) or not _finite(took) or took < 0:
        raise DamagedRecord("its time or duration is missing, or no finite number (or a negative duration)")
    started = at - took
    if not period * seconds - _ROUNDING <= started < (period + 1) * seconds + _ROUNDING:
        raise DamagedRecord(f"its sampling started at {started:.3f}, outside its period ({period * seconds:.0f} "
                            f"to {(period + 1) * seconds:.0f})")
    if at > now + SKEW:
        raise DamagedRecord(f"its time ({at:.3f}) has not come yet")
    queues: dict[str, tuple[float, ...]] = {}
    for name, values in islice(doc["queues"].items(), MAX_QUEUES):
        if not is_queue_name(name):
            raise DamagedRecord("an entry is no queue name")
        if not (isinstance(values, list) and len(values) == len(FIELDS) and all(_count(v) for v in values[:-1])
                and _finite(values[-1]) and values[-1] >= 0):
            raise DamagedRecord(f"queue {name!r}: not four counts and an age within bounds")
        queues[name] = tuple(values)
    return Sample(float(at), queues, float(took), key is not None and _signed(data, key, period))


def stats_of(values: tuple[float, ...]) -> QueueStats:
    """A sample's entry as the stats it records."""
    ready, in_flight, delayed, dead_lettered, oldest = values
    return QueueStats(int(ready), int(in_flight), int(delayed), float(oldest), dead_lettered=int(dead_lettered))


def _signature(key: bytes, period: int, body: bytes) -> bytes:
    return hmac.new(key, f"{TASK}.{period}\n".encode() + body, hashlib.sha256).hexdigest().encode()


def _signed(data: bytes, key: bytes, period: int) -> bool:
    """Whether ``data`` ends with this key's signature of the rest, for ``period``."""
    tail = data[-_SIGNED_LENGTH:]
    if len(data) <= _SIGNED_LENGTH or not tail.startswith(_SIGNATURE_HEAD) or not tail.endswith(_SIGNATURE_TAIL):
        return False
    body = data[:-_SIGNED_LENGTH] + b"}"
    return hmac.compare_digest(tail[len(_SIGNATURE_HEAD):-len(_SIGNATURE_TAIL)], _signature(key, period, body))


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < MAX_COUNT


def _finite(value: Any) -> TypeGuard[float]:
    """A number of the record's range: an int or a finite float below 2**63 in size, no bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return -MAX_COUNT < value < MAX_COUNT and (isinstance(value, int) or math.isfinite(value))
