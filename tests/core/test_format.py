"""The name grammar, with no filesystem: build, parse, keys and receipts."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vsqs import IncompatibleFormat, InvalidArgument, InvalidReceipt
from vsqs._core import format as _format
from vsqs._core.format import Name, State

keys = st.builds(
    lambda p, t, r: f"{p}-{t:016d}-{r:016x}",
    st.integers(0, 9),
    st.integers(0, 10**16 - 1),
    st.integers(0, 2**64 - 1),
)
counts = st.integers(0, _format.MAX_COUNT)
untils = st.integers(0, 10**16 - 1)
tags = st.integers(0, 2**48 - 1).map(lambda t: f"{t:012x}")


@given(keys, st.integers(0, _format.MAX_COUNT))
def test_ready_round_trip(key, count):
    parsed = _format.parse_name(_format.ready_name(key, count))
    assert parsed == Name(key, State.READY, count)
    assert str(parsed) == _format.ready_name(key, count)


@given(keys, untils, counts, tags)
def test_hidden_round_trip(key, until, count, tag):
    name = _format.hidden_name(key, until, count, tag)
    assert _format.parse_name(name) == Name(key, State.HIDDEN, count, until, tag)
    assert str(_format.parse_name(name)) == name


@given(keys)
def test_writing_round_trip(key):
    assert _format.parse_name(_format.writing_name(key)) == Name(key, State.WRITING)


GRAMMAR = re.compile(
    r"[0-9]-[0-9]{16}-[0-9a-f]{16}(-g[0-9a-f]{12})?(-o[0-9a-f]{8})?(-e)?"
    r"(\.new|\.[1-9][0-9]{0,8}|\.[0-9]{16}\.(0|[1-9][0-9]{0,8})\.[0-9a-f]{12})?"
)

groups = st.one_of(st.just(""), st.integers(0, 2**48 - 1).map(lambda g: f"{g:012x}"))
origins = st.one_of(st.just(""), st.integers(0, 2**32 - 1).map(lambda o: f"{o:08x}"))


@given(keys, groups, origins, st.booleans(), untils, counts, tags)
def test_stem_flags_round_trip(key, group, origin, envelope, until, count, tag):
    stem = _format.make_stem(key, group_hash=group, origin=origin, envelope=envelope)
    for name in (_format.ready_name(stem, count), _format.hidden_name(stem, until, count, tag)):
        parsed = _format.parse_name(name)
        assert (parsed.key, parsed.stem, parsed.group_hash, parsed.origin, parsed.envelope) == (
            key, stem, group, origin, envelope
        )
        assert str(parsed) == name
    assert _format.with_origin(_format.parse_name(stem), "") == _format.make_stem(
        key, group_hash=group, envelope=envelope
    )


@given(st.text(max_size=80))
def test_foreign_names_are_never_messages(name):
    parsed = _format.parse_name(name)
    assert (parsed is not None) == bool(GRAMMAR.fullmatch(name))


@given(keys, st.integers(0, _format.KEY_LENGTH - 1), st.characters())
def test_a_key_with_one_character_changed_is_checked_in_full(key, position, char):
    """A dotless name of a key's length takes a short path through parse_name:
    it must still accept exactly the grammar (no Unicode digits, no upper case)."""
    name = key[:position] + char + key[position + 1 :]
    parsed = _format.parse_name(name)
    assert (parsed is not None) == bool(GRAMMAR.fullmatch(name))
    if parsed is not None:
        assert parsed == Name(name, State.READY) and str(parsed) == name


@pytest.mark.parametrize(
    "name",
    [
        ".vsqs.json",
        "README",
        "9-1795305501723584-892190c0ba724662.tmp",
        "9-1795305501723584-892190c0ba72466",  # short random part
        "9-1795305501723584-892190C0BA724662",  # upper case
        "9-1795305501723584-892190c0ba724662.0",  # ready count 0 is written without suffix
        "9-1795305501723584-892190c0ba724662.01",
        "9-1795305501723584-892190c0ba724662.1795305501723584.1",
        "9-1795305501723584-892190c0ba724662.1795305501723584.1.abc",
        "9-1795305501723584-892190c0ba724662/../x",
        "9-1795305501723584-892190c0ba72466\n",  # a key's length, a newline at the end
        "9-17953055017235\u06684-892190c0ba724662",  # an Arabic-Indic digit
        "9-1795305501723584_892190c0ba724662",
        "9-1795305501723584-892190c0ba724662\n",
        "../9-1795305501723584-892190c0ba724662",
        "9-1795305501723584-892190c0ba724662.new.new",
    ],
)
def test_near_misses_are_foreign(name):
    assert _format.parse_name(name) is None


def test_names_sort_in_delivery_order():
    early = _format.new_key()
    late = _format.new_key()
    urgent = _format.new_key(priority=9)
    assert sorted([late, urgent, early]) == [urgent, early, late]
    # a requeued or hidden name of a message still sorts by its key
    assert sorted([_format.ready_name(late), _format.ready_name(early, 3)]) == [
        _format.ready_name(early, 3),
        _format.ready_name(late),
    ]


def test_keys_fixed_width_and_monotonic_in_process():
    keys_ = [_format.new_key() for _ in range(10_000)]
    assert {len(k) for k in keys_} == {35}
    assert all(_format.is_key(k) for k in keys_)
    sent = [_format.sent_us_of(k) for k in keys_]
    assert sent == sorted(sent) and len(set(sent)) == len(sent)  # strictly increasing


def _keys(_: int) -> list[str]:
    return [_format.new_key() for _ in range(2_000)]


def test_keys_unique_across_processes():
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        batches = pool.map(_keys, range(4))
    every = [k for batch in batches for k in batch]
    assert len(set(every)) == len(every)


def test_key_sent_time_is_now():
    before = _format.now_us()
    key = _format.new_key()
    assert before <= _format.sent_us_of(key) <= _format.now_us() + 1


def test_priority_is_encoded_so_higher_sorts_first():
    assert _format.parse_name(_format.new_key(priority=7)).priority == 7
    assert _format.parse_name(_format.new_key()).priority == _format.DEFAULT_PRIORITY


def test_tags_are_fresh():
    assert len({_format.new_tag() for _ in range(1000)}) == 1000


# -- a key as a UUID (the SQS face's MessageId) ------------------------------------

_UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


@given(keys)
def test_a_keys_uuid_is_a_version_8_uuid_that_gives_the_key_back(key):
    text = _format.key_uuid(key)
    assert _UUID_TEXT.fullmatch(text)
    parsed = uuid.UUID(text)
    assert str(parsed) == text and parsed.version == 8 and parsed.variant == uuid.RFC_4122
    assert _format.key_of_uuid(text) == key


@given(keys, keys)
def test_key_uuids_are_one_to_one_and_sort_as_their_keys(one, two):
    assert (_format.key_uuid(one) == _format.key_uuid(two)) == (one == two)
    assert (_format.key_uuid(one) < _format.key_uuid(two)) == (one < two)


def test_a_keys_uuid_is_the_one_format_md_gives():
    """The layout is a contract (other programs compute it): FORMAT.md's example, bit for bit."""
    assert _format.key_uuid("9-1795305501723584-892190c0ba724662") == "91983488-ac62-8f02-8921-90c0ba724662"


def test_the_widest_keys_have_uuids():
    for key in ("0-0000000000000000-0000000000000000", "9-9999999999999999-ffffffffffffffff"):
        assert _format.key_of_uuid(_format.key_uuid(key)) == key


@pytest.mark.parametrize("text", [
    "not a uuid", "", "98e1bc9b-f03f-4fff-bfff-ffffffffffff",  # version 4
    "98e1bc9b-f03f-8fff-7fff-ffffffffffff",  # not the RFC variant
    "98E1BC9B-F03F-8FFF-BFFF-FFFFFFFFFFFF",  # upper case
    "98e1bc9bf03f8fffbfffffffffffffff",  # no dashes
    "a0000000-0000-8000-8000-000000000000",  # P = 10
    "08e1bc9b-f040-8000-8000-000000000000",  # SENT = 10**16
    "{98e1bc9b-f03f-8fff-bfff-ffffffffffff}",
])
def test_a_uuid_no_key_gives_is_refused(text):
    with pytest.raises(InvalidArgument):
        _format.key_of_uuid(text)


@pytest.mark.parametrize("text", ["nope", "9-1795825039908395-66868A4DE0DC0C30",
                                  "98e1bc9b-f03f-8fff-bfff-ffffffffffff"])
def test_what_is_no_key_has_no_uuid(text):
    with pytest.raises(InvalidArgument):
        _format.key_uuid(text)


# -- receipts -------------------------------------------------------------------


def test_receipt_round_trip():
    name = _format.hidden_name(_format.new_key(), 10**15, 2)
    receipt = _format.make_receipt("0a1b2c3d", name)
    parsed, text, slot = _format.parse_receipt("0a1b2c3d", receipt)
    assert str(parsed) == text == name and slot is None


@pytest.mark.parametrize(
    "receipt",
    [
        "",
        "garbage",
        "0a1b2c3d:",
        "0a1b2c3d:../../etc/passwd",
        "0a1b2c3d:/etc/passwd",
        "0a1b2c3d:.vsqs.json",
        "0a1b2c3d:9-1795305501723584-892190c0ba724662",  # a ready name is no receipt
        "0a1b2c3d:9-1795305501723584-892190c0ba724662.new",
        "0a1b2c3d:9-1795305501723584-892190c0ba724662.1795305501723584.1.0191cc303a5c\x00",
        "0A1B2C3D:9-1795305501723584-892190c0ba724662.1795305501723584.1.0191cc303a5c",
        "x" * 10_000,
    ],
)
def test_malformed_receipts(receipt):
    with pytest.raises(InvalidReceipt, match="malformed receipt"):
        _format.parse_receipt("0a1b2c3d", receipt)


def test_receipt_of_another_queue():
    name = _format.hidden_name(_format.new_key(), 10**15, 1)
    with pytest.raises(InvalidReceipt, match="another queue"):
        _format.parse_receipt("0a1b2c3d", _format.make_receipt("ffffffff", name))


def test_receipt_must_be_str():
    with pytest.raises(InvalidReceipt, match="must be a str"):
        _format.parse_receipt("0a1b2c3d", b"bytes")


@given(st.text(max_size=120))
def test_no_text_escapes_through_a_receipt(text):
    try:
        name, _, _ = _format.parse_receipt("0a1b2c3d", "0a1b2c3d:" + text)
    except InvalidReceipt:
        return
    assert "/" not in str(name) and "\x00" not in str(name) and str(name) == text


# -- metadata -------------------------------------------------------------------


def test_metadata_round_trip():
    assert _format.decode_metadata(_format.encode_metadata("0a1b2c3d"), "m") == ("0a1b2c3d", 1, True)
    assert _format.decode_metadata(_format.encode_metadata("0a1b2c3d", 16), "m") == ("0a1b2c3d", 16, True)
    for shards in (1, 16):  # the formats of vsqs before format 3: no -rFIRST written in them
        old = _format.encode_metadata("0a1b2c3d", shards, first_receive=False)
        assert _format.decode_metadata(old, "m") == ("0a1b2c3d", shards, False)


def test_new_queues_are_format_3_with_their_shard_count():
    for shards in (1, 4):
        doc = json.loads(_format.encode_metadata("0a1b2c3d", shards))
        assert (doc["format"], doc["shards"]) == (3, shards) == (_format.FORMAT_VERSION, shards)


def test_the_formats_of_older_vsqs_are_written_as_they_wrote_them():
    flat = json.loads(_format.encode_metadata("0a1b2c3d", first_receive=False))
    assert flat["format"] == 1 and "shards" not in flat
    assert json.loads(_format.encode_metadata("0a1b2c3d", 4, first_receive=False))["format"] == 2


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "unreadable"),
        (b"{not json", "unreadable"),
        (b'{"format": 4, "queue_id": "0a1b2c3d", "shards": 1}', "format 4, this vsqs reads formats 1 to 3"),
        (b'{"format": 3, "queue_id": "0a1b2c3d"}', "unreadable"),  # format 3 always says its shards
        (b'{"format": 3, "queue_id": "0a1b2c3d", "shards": 3}', "bad shards 3"),
        (b'{"format": true, "queue_id": "0a1b2c3d"}', "format True"),
        (b'[1, 2]', "unreadable"),
        (b'{"format": 2, "queue_id": "0a1b2c3d", "shards": 3}', "bad shards 3"),
        (b'{"format": 2, "queue_id": "0a1b2c3d", "shards": 512}', "bad shards 512"),
        (b'{"format": 2, "queue_id": "0a1b2c3d", "shards": "4"}', "bad shards"),
        (b'{"format": 1}', "unreadable"),
        (b'{"format": 1, "queue_id": "../x"}', "bad queue_id"),
    ],
)
def test_bad_metadata(data, match):
    with pytest.raises(IncompatibleFormat, match=match):
        _format.decode_metadata(data, "/q/.vsqs.json")


# -- shards ---------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 2, 16, 256])
def test_every_name_of_a_message_maps_to_one_shard(shards):
    key = _format.new_key()
    stem = _format.make_stem(key, envelope=True)
    hidden = _format.hidden_name(stem, 1795305531723584, 1)
    names = [stem, _format.ready_name(stem, 3), hidden, _format.writing_name(stem),
             _format.hidden_name(stem, 1795305561723584, 1, hidden.rsplit(".", 1)[1])]  # after a visibility change
    assert len({_format.shard_of(name, shards) for name in names}) == 1
    assert 0 <= _format.shard_of(stem, shards) < shards


def test_a_group_lives_in_one_shard_whatever_its_keys():
    group = _format.group_hash("tenant-7")
    shards = {_format.shard_of(_format.make_stem(_format.new_key(), group_hash=group), 64) for _ in range(200)}
    assert shards == {int(group[:2], 16) % 64}


def test_keys_spread_over_the_shards():
    counts = [0] * 16
    for _ in range(16_000):
        counts[_format.shard_of(_format.new_key(), 16)] += 1
    assert min(counts) > 800 and max(counts) < 1200


@pytest.mark.parametrize("bad", [0, 3, 257, 512, -2, True, 2.0, "4", None])
def test_bad_shard_counts(bad):
    with pytest.raises(InvalidArgument, match="power of two"):
        _format.check_shards(bad)


def test_shard_directory_names():
    assert _format.shard_dir_name(0) == "shards/00"
    assert _format.shard_dir_name(255) == "shards/ff"


def test_tags_are_unique_and_a_forked_child_never_repeats_its_parents():
    """Tags are drawn ahead in batches: each is handed out once, and a child
    forked with a half-used batch draws its own (two consumers forked from one
    parent must never rename to one name)."""
    tags = [_format.new_tag() for _ in range(1000)]
    assert len(set(tags)) == 1000 and all(re.fullmatch(r"[0-9a-f]{12}", tag) for tag in tags)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the next tags it hands out
        os.write(writer, "".join(_format.new_tag() for _ in range(20)).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(writer)
    child = os.read(reader, 240).decode()
    os.close(reader)
    parent = "".join(_format.new_tag() for _ in range(20))
    assert {child[i : i + 12] for i in range(0, 240, 12)}.isdisjoint(parent[i : i + 12] for i in range(0, 240, 12))
