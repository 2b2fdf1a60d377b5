"""The streaming read's record batches (vsqs._spark.record_batches), without Spark:
equal to what ``pyarrow.array`` builds of the same values, for every column
and any subset of them, and built without importing pandas."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pyarrow
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

import vsqs
from vsqs._spark import record_batches
from vsqs._spark.record_batches import record_batches as build
from vsqs._spark.schema import SCHEMA

ARROW = to_arrow_schema(SCHEMA, timezone="UTC")


def _expected(messages: list[vsqs.Message], arrow: Any, content: bool) -> Any:
    """The batch as pyarrow.array builds it from the messages' values."""
    values = {
        "id": lambda m: m.id,
        "body": lambda m: m.body if content else None,
        "state": lambda m: "in_flight",
        "receive_count": lambda m: m.receive_count,
        "sent_at": lambda m: round(m.sent_at * 1_000_000),
        "priority": lambda m: m.priority,
        "group": lambda m: m.group if content else None,
        "attributes": lambda m: list(m.attributes.items()) if content else None,
    }
    arrays = [pyarrow.array([values[f.name](m) for m in messages], type=f.type) for f in arrow]
    return pyarrow.RecordBatch.from_arrays(arrays, schema=arrow)


@pytest.fixture
def messages(tmp_path: Any) -> list[vsqs.Message]:
    spool = vsqs.Spool(str(tmp_path))
    plain = spool.create_queue("plain")
    plain.publish(b"")
    plain.publish(b"\x00\xffbytes", priority=7, attributes={"k": "v", "ünï": "cödé ✓", "empty": ""})
    plain.publish(b"x" * 5000, priority=0)
    fifo = spool.create_queue("groups.fifo")
    fifo.publish(b"g1", group="grüppe", dedup_id="1")
    fifo.publish(b"g2", group="other", dedup_id="2", attributes={"a": "b"})
    got = plain.receive_batch(10) + fifo.receive_batch(10)
    again = plain.receive_batch(10, visibility_timeout=0)  # (nothing: all held)
    assert len(got) == 5 and not again
    return got


@pytest.mark.parametrize("content", [True, False])
def test_a_batch_equals_the_one_pyarrow_array_builds(messages: list[vsqs.Message], content: bool) -> None:
    batches = list(build(messages, ARROW, content))
    assert len(batches) == 1
    assert batches[0].equals(_expected(messages, ARROW, content))
    assert batches[0].schema == ARROW


@pytest.mark.parametrize("names", [["attributes", "id"], ["group"], ["sent_at", "state", "body", "priority"]])
def test_any_subset_of_columns_in_any_order(messages: list[vsqs.Message], names: list[str]) -> None:
    arrow = to_arrow_schema(StructType([SCHEMA[name] for name in names]), timezone="UTC")
    assert next(build(messages, arrow, True)).equals(_expected(messages, arrow, True))


def test_messages_of_a_standard_queue_have_null_groups(messages: list[vsqs.Message]) -> None:
    batch = next(build(messages[:3], ARROW, True))
    assert batch.column("group").null_count == 3
    assert batch.column("attributes").null_count == 0  # (no attributes: an empty map)


def test_bodies_past_a_column_bound_are_cut_into_batches(messages: list[vsqs.Message],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_batches, "MAX_BATCH_BYTES", 5000)
    batches = list(build(messages, ARROW, True))
    assert [batch.num_rows for batch in batches] == [2, 1, 2]  # (the 5000-byte body alone)
    whole = pyarrow.Table.from_batches(batches).combine_chunks().to_batches()[0]
    assert whole.equals(_expected(messages, ARROW, True))


def test_no_pandas_is_imported(tmp_path: Any) -> None:
    code = (
        "import sys, vsqs\n"
        "from pyspark.sql.pandas.types import to_arrow_schema\n"
        "from vsqs._spark.schema import SCHEMA\n"
        "from vsqs._spark.record_batches import record_batches\n"
        f"q = vsqs.Queue({str(tmp_path / 'q')!r}, create=True)\n"
        "q.publish(b'x', attributes={'a': 'b'})\n"
        "batch = next(record_batches(q.receive_batch(1), to_arrow_schema(SCHEMA, timezone='UTC'), True))\n"
        "assert batch.num_rows == 1\n"
        "print('pandas' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


def test_without_content_no_message_file_is_read(tmp_path: Any) -> None:
    """Columns that are not the message's content come from the claim alone:
    a batch of messages deleted since their claim is still built."""
    queue = vsqs.Queue(str(tmp_path / "q"), create=True)
    queue.publish_batch([b"a", b"b"])
    claimed = queue.receive_batch(10, read_bodies=False)
    for message in claimed:
        queue.delete(message.receipt)
    arrow = to_arrow_schema(StructType([SCHEMA["id"], SCHEMA["sent_at"], SCHEMA["body"]]), timezone="UTC")
    batch = next(build(claimed, arrow, False))
    assert batch.num_rows == 2 and batch.column("body").null_count == 2


def test_a_null_among_values_is_a_null() -> None:
    rows = [_Row(None), _Row(b"x"), _Row(b"")]
    arrow = to_arrow_schema(StructType([SCHEMA["body"]]), timezone="UTC")
    assert next(build(rows, arrow, True)).column("body").to_pylist() == [None, b"x", b""]  # type: ignore[arg-type]


class _Row:
    def __init__(self, body: bytes | None) -> None:
        self.body = body
        self.attributes: dict[str, str] = {}


def test_the_driver_side_of_the_source_imports_no_pyarrow() -> None:
    """Spark starts fresh Python processes on the driver for a query; those that
    look the source up and create it import its modules and build no batch,
    and pyarrow would cost each 0.1-0.2 s of CPU to import."""
    code = (
        "import sys, pyspark_vsqs, vsqs.spark\n"
        "from vsqs._spark import stream, source\n"
        "print('pyarrow' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"
