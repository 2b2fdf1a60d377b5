"""A PySpark daemon whose Python workers can die between a claim and its record.

For the crash-point test of the streaming read: Spark starts it instead of
``pyspark.daemon`` (``spark.python.daemon.module``) and forks every Python
worker from it, so the workers inherit the patch below. With
``VSQS_TEST_DIE_BEFORE_RECORD=PATH`` set, the first worker about to record
chunk ``VSQS_TEST_DIE_CHUNK`` (default 1) of generation 0 of a manifest
writes the receipts it claimed to PATH (created exclusively: only one worker
ever dies) and SIGKILLs itself: the messages are claimed, the manifest does
not know them. Any other worker records as usual.
"""

from __future__ import annotations

import json
import os
import signal

from vsqs._spark import manifest

_record = manifest.Manifest.write_chunk


def _dying_record(self: manifest.Manifest, generation: int, chunk: int, receipts: list[str]) -> bool:
    marker = os.environ.get("VSQS_TEST_DIE_BEFORE_RECORD")
    if marker and generation == 0 and chunk == int(os.environ.get("VSQS_TEST_DIE_CHUNK", "1")):
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            pass  # a worker died here already: record
        else:
            os.write(fd, json.dumps(receipts).encode())
            os.fsync(fd)
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no signal mask helps: as the OOM killer does
    return _record(self, generation, chunk, receipts)


manifest.Manifest.write_chunk = _dying_record  # type: ignore[method-assign]

if __name__ == "__main__":
    from pyspark.daemon import manager

    manager()
