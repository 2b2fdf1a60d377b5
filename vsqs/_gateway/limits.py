"""The gateway's own limits, in one place.

Those that are the engine's facts come from :mod:`vsqs._core.limits`; the
rest mirror Amazon SQS (so that an SQS client meets the limits it knows) or
bound what one HTTP request may ask for. Nothing here imports more than the
engine's table, so the ``serve`` command can read it without the server extra.
"""

from __future__ import annotations

from vsqs._core import limits as _engine

# -- shared with the engine --
MAX_VISIBILITY_TIMEOUT = int(_engine.MAX_VISIBILITY_TIMEOUT)  # 43200: the engine's 12 h, in whole seconds
MAX_QUEUE_NAME = _engine.MAX_QUEUE_NAME
MAX_SHARDS = _engine.MAX_SHARDS
MIN_PRIORITY = _engine.MIN_PRIORITY
MAX_PRIORITY = _engine.MAX_PRIORITY
MAX_GROUP_LENGTH = _engine.MAX_GROUP_LENGTH
MAX_ATTRIBUTE_NAME = _engine.MAX_ATTRIBUTE_NAME
MAX_DEDUP_ID = _engine.MAX_DEDUP_ID  # (SQS's is 128 too)

# -- as Amazon SQS --
MAX_WAIT = 20.0  # seconds a receive may long-poll: a longer wait belongs in a loop
MAX_WAIT_SECONDS = int(MAX_WAIT)
MAX_DELAY_SECONDS = 900  # DelaySeconds
MAX_BATCH = 10  # entries per batch request, and messages per receive
MAX_MESSAGE_ATTRIBUTES = 10  # per message
SQS_MAX_MESSAGE_BYTES = 1024 * 1024  # SQS's own limit since 2025: the default --max-message-bytes
MIN_MESSAGE_BYTES = 1024  # the lowest MaximumMessageSize
MIN_RETENTION, MAX_RETENTION = 60, 1_209_600  # MessageRetentionPeriod: a minute .. 14 days
SQS_DEFAULT_RETENTION = 345_600  # MessageRetentionPeriod reported for a queue that sets none (Amazon's: 4 days)
MAX_RECEIVE_COUNT = 1000  # RedrivePolicy's maxReceiveCount
MAX_LIST_RESULTS = 1000  # ListQueues' MaxResults, and its answer without one
MAX_SQS_QUEUE_NAME = 80  # characters of a queue name CreateQueue takes
FIFO_DEDUP_WINDOW = 300.0  # seconds a FIFO queue made through the SQS face holds a dedup id

# -- the gateway's own --
MAX_JSON_BATCH = 100  # messages per native JSON request
MAX_MESSAGE_BYTES_CEILING = 64 * 1024 * 1024  # the largest --max-message-bytes
