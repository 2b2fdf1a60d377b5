"""The claims of a stream's partitions, without a Spark session: each
partition of a micro-batch claims the messages of its own share first
(``Queue.prefer_share``), so that partitions running at once race less."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from vsqs._core.format import KEY_LENGTH  # noqa: E402
from vsqs._core.limits import SHARE_DIGITS  # noqa: E402
from vsqs._spark.claims import StreamPartition, read_partition  # noqa: E402
from vsqs._spark.options import Options  # noqa: E402
from vsqs._spark.schema import SCHEMA  # noqa: E402

QUERY = "0123456789abcdef"


def _ids(batches) -> list[str]:
    return [value for batch in batches for value in batch.column("id").to_pylist()]


def test_each_partition_of_a_batch_claims_its_share_first(flat_queue):
    flat_queue.publish_batch([b"m%d" % i for i in range(400)])
    options = Options.parse({"path": flat_queue.path})
    claimed = []
    for index in range(4):
        partition = StreamPartition(QUERY, 1, index, 60, [], parts=4)
        ids = _ids(read_partition(options, SCHEMA, partition))
        assert len(ids) == 60
        assert {int(i[KEY_LENGTH - SHARE_DIGITS : KEY_LENGTH], 16) % 4 for i in ids} == {index}
        claimed.extend(ids)
    assert len(set(claimed)) == 240


def test_a_partition_whose_share_runs_out_takes_the_others(flat_queue):
    ids = flat_queue.publish_batch([b"m%d" % i for i in range(40)])
    options = Options.parse({"path": flat_queue.path})
    got = _ids(read_partition(options, SCHEMA, StreamPartition(QUERY, 1, 0, 40, [], parts=4)))
    assert sorted(got) == sorted(ids)
