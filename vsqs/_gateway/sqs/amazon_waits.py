"""Amazon's two 60-second rules, applied only when the gateway is told to
(``--sqs-recently-deleted``, ``--sqs-purge-interval``; docs/gateway.md):
CreateQueue of a name deleted less than the wait ago is
``QueueDeletedRecently``, a PurgeQueue less than the interval after the
queue's last purge is ``PurgeQueueInProgress``. The engine records the
facts in the spool (:meth:`vsqs.Spool.deleted_at`,
:attr:`vsqs.Queue.purged_at`), so the rules hold across worker processes,
gateways on other hosts, restarts, and deletions and purges made through
any face; this module only applies the policy."""

from __future__ import annotations

import time

from vsqs import Queue
from vsqs._gateway.sqs.call import Call
from vsqs._gateway.sqs.protocol import SqsError


def refuse_if_deleted_recently(call: Call, name: str) -> None:
    """Amazon's QueueDeletedRecently for a queue ``name`` deleted (by any face, process or host)
    less than ``--sqs-recently-deleted`` seconds ago; nothing when that is 0. Blocking.
    The refusal leaves the deletion's record as it was: the wait runs from the deletion."""
    wait = call.gateway.config.sqs_recently_deleted
    if wait <= 0:
        return
    deleted = call.gateway.spool.deleted_at(name)
    if deleted is not None and time.time() - deleted < wait:
        raise SqsError("QueueDeletedRecently", f"You must wait {wait:g} seconds after deleting a queue before "
                       "you can create another with the same name.")


def purge_unless_purged_recently(call: Call, queue: Queue, name: str) -> None:
    """Purge ``queue``, or Amazon's PurgeQueueInProgress (nothing purged) if it was purged
    (by any face, process or host) less than ``--sqs-purge-interval`` seconds ago. Blocking.
    Two purges racing in one instant (two gateway processes) may both run: the rule is
    Amazon's error for a client to meet, not a lock."""
    interval = call.gateway.config.sqs_purge_interval
    if interval > 0:
        purged = queue.purged_at
        if purged is not None and time.time() - purged < interval:
            raise SqsError("PurgeQueueInProgress",
                           f"Only one PurgeQueue operation on {name} is allowed every {interval:g} seconds.")
    queue.purge()
