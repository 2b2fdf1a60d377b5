"""Which queue a dead letter came from: the dead-letter queue's ``.sources``
entry for the origin id in the message's name (docs/FORMAT.md, Dead letters).

Below the message (which shows it as ``Message.dead_letter_source``) and the
dead-letter part (which writes the entries), so that neither reaches the other.
"""

from __future__ import annotations

import logging
import os

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import StorageError
from vsqs._core.rules import is_queue_name

log = logging.getLogger("vsqs")

_SOURCE_NAMES: dict[tuple[str, str], str] = {}  # (dead-letter queue path, origin id) -> source queue name
_MAX_SOURCE_NAMES = 4096  # bound of that cache (forgotten all at once when full)


def source_name(dead_letter_queue: str, origin: str) -> str | None:
    """The name of the queue whose dead letters in the queue at
    ``dead_letter_queue`` carry the origin id ``origin``: the last component
    of the path its ``.sources`` entry records, if that is a queue name
    (see :func:`vsqs._core.rules.is_queue_name`); else, or with no such
    entry, ``None``. A found name is kept for the process's life: an entry
    is written once and never changed (a missing one is looked for again)."""
    key = (dead_letter_queue, origin)
    found = _SOURCE_NAMES.get(key)
    if found is not None:
        return found
    directory = os.path.join(dead_letter_queue, _format.SOURCES_DIR)
    if not _format.is_queue_id(origin) or not _fs.is_private_dir(directory):
        return None
    try:
        data = _fs.read_control(os.path.join(directory, origin))
    except StorageError as exc:  # unreadable: reported, and the attribute is absent
        log.warning("%s", exc)
        return None
    name = os.path.basename(data.decode("utf-8", "replace")) if data else ""
    if not is_queue_name(name):
        return None
    if len(_SOURCE_NAMES) >= _MAX_SOURCE_NAMES:
        _SOURCE_NAMES.clear()
    _SOURCE_NAMES[key] = name
    return name
