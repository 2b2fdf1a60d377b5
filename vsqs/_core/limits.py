"""Every limit of the library, in one table.

The engine checks its arguments against these; the adapters (the CLI, the
gateway, Spark) take their own limits from here too, or derive stricter ones
of their own from them (the SQS face keeps Amazon's), so that no limit is
written down twice. Nothing here does I/O or imports anything.
"""

from __future__ import annotations

# -- time (seconds) --
MAX_VISIBILITY_TIMEOUT = 12 * 3600.0  # as SQS: a lease longer than 12 h is a mistake
MAX_DELAY = 366 * 86400.0  # a delayed publish, ``at=`` included
MAX_WAIT = 12 * 3600.0  # a library receive's long poll
MAX_CLOCK_SKEW = 3600.0  # the clock_skew allowance of a handle
# a waiting receive where no kernel notification reaches (a network filesystem,
# no inotify, its watch limit reached): how often the queue's directories are
# looked at (a stat each; listed only when one changed), by default and at most
DEFAULT_POLL_INTERVAL = 0.05
MAX_POLL_INTERVAL = 60.0

# -- messages --
MAX_BATCH = 10_000  # messages per publish_batch / receive_batch call
MAX_RUN = 100  # messages of one group a receive takes together (receive_batch(group_runs=True))
SHARE_DIGITS = 3  # the last hex digits of a KEY (random) that deal messages to shares (Queue.prefer_share) ...
MAX_SHARES = 16**SHARE_DIGITS  # ... so at most this many shares
MIN_PRIORITY = 0
MAX_PRIORITY = 9  # higher is delivered first
DEFAULT_PRIORITY = 0
MAX_ATTRIBUTES = 50  # attributes per message
MAX_ATTRIBUTE_BYTES = 64 * 1024  # names and values of a message's attributes, in UTF-8
MAX_ATTRIBUTE_NAME = 256  # characters of an attribute's name
MAX_GROUP_LENGTH = 128  # characters of a message group's name
MAX_DEDUP_ID = 128  # characters of a de-duplication id
MAX_BODY_BYTES = 256 * 1024 * 1024  # a message's body, whatever the queue's max_message_bytes says
# an envelope's header line: the attributes' bytes, each of which JSON may escape
# to six ("\u0001"), and 64 KiB for the rest (names, quotes, the group, dedup)
MAX_HEADER_BYTES = 6 * MAX_ATTRIBUTE_BYTES + 64 * 1024
# the largest message file a reader takes: a larger one is damage, left in place
MAX_MESSAGE_FILE = MAX_BODY_BYTES + MAX_HEADER_BYTES
MAX_RECEIVE_BYTES = 16 * 1024 * 1024  # a receive_batch stops claiming once its bodies reach this
MAX_CONTROL_FILE = 64 * 1024  # a file of vsqs's own: metadata, a settings version, a lease, a source
MAX_JSON_DEPTH = 32  # nesting of a JSON document read from the spool (vsqs writes at most 4)

# -- names of things on disk --
MAX_QUEUE_NAME = 80  # characters of a queue's name in a spool
MAX_STAGE_NAME = 128  # characters of a stage's name
MAX_SHARDS = 256  # shard directories of a queue (a power of two)
MAX_RECEIVE_COUNT = 999_999_999  # the receive count a name can hold
# the queue's area reserved for the Spark adapter (docs/FORMAT.md): a name, kept here
# because the engine's gc and the adapter (which may import only this and a few
# other shared modules) must agree on it
SPARK_AREA = ".spark"
ADAPTER_WRITING_PREFIX = ".tmp-"  # a file of the area being written (gc removes it after its grace)
MAX_ADAPTER_FILE = 4 * 1024 * 1024  # a file of the area: a larger one is damage, left in place
MAX_ADAPTER_DEPTH = 3  # directory levels below .spark/KIND/ (TREE/BATCH/PARTITION): deeper is damage
MAX_ADAPTER_ENTRIES = 200_000  # entries of the area one gc looks at (the next gc goes on)

# -- defaults of maintenance (seconds) --
DEFAULT_GC_GRACE = 900.0  # a .new file this old belongs to a dead publisher
DEFAULT_STAGE_GRACE = 7 * 86400.0  # a stage untouched this long belongs to a dead job
DELETED_KEEP = 3600.0  # a record of a queue's deletion (the spool's .deleted/) is kept this long
DELETED_SWEEP_EVERY = 60.0  # seconds between one handle's sweeps of .deleted/ (a deletion lists it then)
RECORD_AHEAD = 60.0  # a record of when something happened this far ahead of the reader's clock is planted
