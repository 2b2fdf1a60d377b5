"""vsqs: a brokerless message queue in a directory, with SQS semantics.

    >>> import vsqs
    >>> q = vsqs.Queue("/tmp/spool/jobs", create=True)
    >>> q.publish(b"hello")                                  # doctest: +SKIP
    >>> with q.receiving(visibility_timeout=30) as m:        # deleted on success
    ...     handle(m.body)                                   # doctest: +SKIP

Everything public is re-exported here; the ``_``-modules are private.
"""

from vsqs._core.errors import (
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
from vsqs._core.format import FORMAT_VERSION
from vsqs._core.message import Message, MessageInfo, Outgoing, QueueStats
from vsqs._core.queue import Queue
from vsqs._core.spool import Spool
from vsqs._core.worker import Worker, WorkerStats
from vsqs._version import __version__

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
