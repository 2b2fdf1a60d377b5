"""vsqs: a brokerless message queue in a directory, with SQS semantics.

    >>> import vsqs
    >>> q = vsqs.Queue("/tmp/spool/jobs", create=True)
    >>> q.publish(b"hello")                                  # doctest: +SKIP
    >>> with q.receiving(visibility_timeout=30) as m:        # deleted on success
    ...     handle(m.body)                                   # doctest: +SKIP

Everything public is re-exported here; the ``_``-modules are private.
"""

from vsqs._errors import (
    IncompatibleFormat,
    InvalidArgument,
    InvalidReceipt,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    QueueSuspended,
    StaleReceipt,
    StorageError,
    VsqsError,
)
from vsqs._format import FORMAT_VERSION
from vsqs._message import Message, MessageInfo, Outgoing, QueueStats
from vsqs._queue import Queue
from vsqs._spool import Spool
from vsqs._version import __version__
from vsqs._worker import Worker, WorkerStats

__all__ = [
    "FORMAT_VERSION",
    "IncompatibleFormat",
    "InvalidArgument",
    "InvalidReceipt",
    "Message",
    "MessageInfo",
    "MessageTooLarge",
    "Outgoing",
    "Queue",
    "QueueFull",
    "QueueNotFound",
    "QueueStats",
    "QueueSuspended",
    "Spool",
    "StaleReceipt",
    "StorageError",
    "VsqsError",
    "Worker",
    "WorkerStats",
    "__version__",
]
