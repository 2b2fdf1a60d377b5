"""What redrive and start_redrive take as ``to``: a Queue, a str, an os.PathLike,
or None, as before the Queue's cold paths moved to its bases; anything else is
refused as os.fspath refuses it (TypeError), not with an AttributeError."""

from __future__ import annotations

import pathlib

import pytest

import vsqs


@pytest.fixture
def dlq_and_target(tmp_path):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    dlq = spool.create_queue("dlq")
    target = spool.create_queue("jobs")
    return dlq, target


@pytest.mark.parametrize("kind", ["queue", "str", "pathlike"])
def test_redrive_takes_every_target_kind(dlq_and_target, kind):
    dlq, target = dlq_and_target
    dlq.publish(b"x")
    to = {"queue": target, "str": target.path, "pathlike": pathlib.Path(target.path)}[kind]
    assert dlq.redrive(to) == 1
    assert target.receive().body == b"x"


@pytest.mark.parametrize("method", ["redrive", "start_redrive"])
def test_a_target_of_no_path_type_is_a_type_error(dlq_and_target, method):
    dlq, _ = dlq_and_target
    with pytest.raises(TypeError):
        getattr(dlq, method)(42)
