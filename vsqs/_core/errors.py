"""The vsqs exception tree.

Every error vsqs raises on purpose derives from :class:`VsqsError`, and mixes
in the builtin it resembles, so ``except ValueError`` and friends keep
working::

    VsqsError
    ├── QueueNotFound          (also LookupError)  no queue at that path
    ├── IncompatibleFormat                         queue written by another format version
    ├── InvalidArgument        (also ValueError)   a bad argument, named in the message
    ├── InvalidReceipt         (also ValueError)   malformed, or of another queue
    ├── StaleReceipt                               the receipt no longer holds the message
    ├── QueueFull                                  max_messages reached: back-pressure
    ├── QueueSuspended                             the operation is suspended on this queue
    ├── MessageTooLarge        (also ValueError)   over max_message_bytes, or MAX_BODY_BYTES
    └── StorageError           (also OSError)      the filesystem failed; errno kept
        └── DamagedEntry                           not a regular file, or too large to read

``DamagedEntry`` is not exported: callers outside the engine see a
``StorageError``; inside, it marks an entry to report and skip, never to
delete.

All of them pickle (Spark ships exceptions between processes): each keeps its
constructor arguments in ``args``.
"""

from __future__ import annotations

__all__ = [
    "VsqsError",
    "QueueNotFound",
    "IncompatibleFormat",
    "InvalidArgument",
    "InvalidReceipt",
    "StaleReceipt",
    "QueueFull",
    "QueueSuspended",
    "MessageTooLarge",
    "StorageError",
    "DamagedEntry",
]


class VsqsError(Exception):
    """Base class of every error vsqs raises."""


class QueueNotFound(VsqsError, LookupError):
    """The path is not a vsqs queue (missing, or no queue metadata)."""


class IncompatibleFormat(VsqsError):
    """The queue's metadata names a format version this vsqs cannot use."""


class InvalidArgument(VsqsError, ValueError):
    """An argument has a bad value; the message names the argument."""


class InvalidReceipt(VsqsError, ValueError):
    """A receipt is malformed, or belongs to another queue."""


class StaleReceipt(VsqsError):
    """The receipt no longer holds its message.

    The message was deleted, its visibility was changed with this receipt
    already, or its lease ran out and another consumer received it.
    """


class QueueFull(VsqsError):
    """The queue holds ``max_messages`` already: publish later (back-pressure)."""


class QueueSuspended(VsqsError):
    """The operation (publish, receive or delete) is suspended on this queue."""


class MessageTooLarge(VsqsError, ValueError):
    """The body is over the queue's ``max_message_bytes``, or over the
    largest body vsqs takes at all (``limits.MAX_BODY_BYTES``, 256 MiB)."""


class StorageError(VsqsError, OSError):
    """A filesystem call failed for a reason other than a lost race.

    ``errno``, ``strerror`` and ``filename`` are those of the underlying
    :class:`OSError`, which is also kept as ``__cause__``.
    """


class DamagedEntry(StorageError):
    """An entry of the spool that is not what its name says: a FIFO, a
    directory, a symlink or another non-regular file where a file of vsqs's
    own is expected, or a file over the size any such file can have. It is
    reported and skipped, left in place: it is never read, deleted, nor
    counted as a message."""
