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
SQS_MAX_MESSAGE_BYTES = 1024 * 1024  # SQS's own limit since 2025: the default --max-body-bytes
MIN_MESSAGE_BYTES = 1024  # the lowest MaximumMessageSize
MIN_RETENTION, MAX_RETENTION = 60, 1_209_600  # MessageRetentionPeriod: a minute .. 14 days
SQS_DEFAULT_RETENTION = 345_600  # MessageRetentionPeriod reported for a queue that sets none (Amazon's: 4 days)
MAX_RECEIVE_COUNT = 1000  # RedrivePolicy's maxReceiveCount
MAX_LIST_RESULTS = 1000  # ListQueues' MaxResults, and its answer without one
MAX_SQS_QUEUE_NAME = 80  # characters of a queue name CreateQueue takes
FIFO_DEDUP_WINDOW = 300.0  # seconds a FIFO queue made through the SQS face holds a dedup id
AMAZON_RECENTLY_DELETED = 60.0  # seconds Amazon refuses CreateQueue of a deleted name (QueueDeletedRecently)
AMAZON_PURGE_INTERVAL = 60.0  # seconds Amazon refuses a queue's next PurgeQueue (PurgeQueueInProgress)
# the most --sqs-recently-deleted may ask: the engine keeps a deletion's record this long
MAX_RECENTLY_DELETED = _engine.DELETED_KEEP
MAX_PURGE_INTERVAL = 3600.0  # the most --sqs-purge-interval may ask

# -- the gateway's own --
MAX_JSON_BATCH = 100  # messages per native JSON request
MAX_BODY_BYTES_CEILING = 64 * 1024 * 1024  # the largest --max-body-bytes

# -- how long a client may take to send a request (vsqs._gateway.timeouts) --
MAX_REQUEST_HEAD_BYTES = 16 * 1024  # request line and headers (h11's own default, made explicit)
HEADER_TIMEOUT = 10.0  # seconds a client has to send a request's head (--header-timeout)
BODY_TIMEOUT = 30.0  # seconds it then has to send the whole body (--body-timeout)
KEEP_ALIVE_TIMEOUT = 5  # seconds an idle connection is kept after a response (uvicorn's default)
MAX_REQUEST_TIMEOUT = 600.0  # the longest --header-timeout or --body-timeout

# -- request bodies, judged before they are parsed (vsqs._gateway.json_body) --
MAX_SMALL_BODY_BYTES = 128 * 1024  # a request without message bodies (settings, receipts, receive options)
MAX_SMALL_JSON_VALUES = 2048  # JSON values in such a request (100 receipts or visibility entries fit)
# a native batch: per message its ~8 fields and MAX_ATTRIBUTES attributes, as name and value
MAX_BATCH_JSON_VALUES = MAX_JSON_BATCH * 2 * (8 + _engine.MAX_ATTRIBUTES + 2)
MAX_SQS_JSON_VALUES = 10_000  # an SQS request (a batch of 10 with 10 attributes each is ~2000)
MAX_JSON_DEPTH = 32  # nesting of arrays and objects (the deepest request needs 5)
MAX_JSON_INTEGER_DIGITS = 32  # an integer longer than this is no count, size or time
# a Query-protocol form (vsqs._gateway.sqs.query): a batch of 10 with 10 attributes each is ~500 fields
MAX_QUERY_FIELDS = 2048
INLINE_JSON_BYTES = 64 * 1024  # bodies up to this size are parsed on the event loop, larger ones on a thread
GC_INTERVAL = 60.0  # seconds between the gateway's housekeeping sweeps (vsqs._gateway.housekeeping)
# a SigV4 check is made on the event loop when the body and the request head are at most these sizes
# (tens of microseconds, less than a hop to a thread), on a thread when either is larger
INLINE_SIGNATURE_BYTES = 64 * 1024
INLINE_SIGNATURE_HEAD_BYTES = 8 * 1024
# -- guessing the API key (vsqs._gateway.guesses): wrong keys counted by client address --
KEY_GUESS_BURST = 10  # wrong keys an address may present at once ...
KEY_GUESS_SECONDS = 6.0  # ... then one every this many seconds
KEY_GUESS_ADDRESSES = 10_000  # buckets (addresses and prefixes) remembered, ~300 bytes each
KEY_GUESS_PREFIX_SHARE = 32  # a /24 (IPv4) or /56 (IPv6) guesses as much as this many addresses; 4x each 8 bits wider
KEY_GUESS_LONGEST_WAIT = 3600.0  # seconds a bucket is held back at most (reached only by wrong keys checked at once)
KEY_GUESS_TRUSTED = 10_000  # addresses that showed the right key, remembered ...
KEY_GUESS_TRUST_SECONDS = 86_400.0  # ... for this long after they last did
CONSOLE_INTERVAL = 5.0  # seconds between the console's samples of every queue (vsqs._gateway.console.history)
