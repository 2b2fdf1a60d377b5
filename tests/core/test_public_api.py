"""The public surface is pinned: changing it is a decision, not an accident."""

import dataclasses
import inspect
import pickle
import sys

import pytest

import vsqs


def test_exported_names():
    assert sorted(vsqs.__all__) == sorted(
        [
            "FORMAT_VERSION",
            "IncompatibleFormat",
            "InvalidArgument",
            "InvalidReceipt",
            "Message",
            "MessageInfo",
            "MessageTooLarge",
            "Outgoing",
            "Queue",
            "QueueFull",
            "QueueNotFound",
            "QueueStats",
            "QueueSuspended",
            "Spool",
            "StaleReceipt",
            "StorageError",
            "VsqsError",
            "Worker",
            "WorkerStats",
            "__version__",
        ]
    )
    for name in vsqs.__all__:
        assert getattr(vsqs, name) is not None


def test_exception_tree():
    for name in ["QueueNotFound", "IncompatibleFormat", "InvalidArgument", "InvalidReceipt",
                 "StaleReceipt", "StorageError", "QueueFull", "MessageTooLarge", "QueueSuspended"]:
        assert issubclass(getattr(vsqs, name), vsqs.VsqsError)
    assert issubclass(vsqs.InvalidReceipt, ValueError)
    assert issubclass(vsqs.InvalidArgument, ValueError)
    assert issubclass(vsqs.StorageError, OSError)
    assert issubclass(vsqs.QueueNotFound, LookupError)


def test_exceptions_pickle():
    errors = [
        vsqs.QueueNotFound("no queue at /x"),
        vsqs.StaleReceipt("stale"),
        vsqs.InvalidReceipt("bad"),
        vsqs.InvalidArgument("wait must be >= 0"),
        vsqs.IncompatibleFormat("format 9"),
        vsqs.QueueFull("full"),
        vsqs.MessageTooLarge("too large"),
        vsqs.StorageError(28, "No space left on device", "/spool/q/x.new"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
    assert pickle.loads(pickle.dumps(errors[-1])).errno == 28


def test_py_typed_marker_ships():
    from importlib.resources import files

    assert files("vsqs").joinpath("py.typed").is_file()


# -- every public name and signature -------------------------------------------
#
# Each pinned class is described as {name: what it is}, names sorted: its
# constructor, its public methods and properties (with their signatures), the
# special methods it defines, and for a dataclass its fields. Annotations are
# shown as written (``from __future__ import annotations``), without quotes.
# A change here is a change of the public API: update the literal on purpose.


class _Text(str):
    """An annotation shown as written, without the quotes of its repr."""

    def __repr__(self) -> str:
        return str(self)


def _annotation(annotation):
    if annotation is inspect.Parameter.empty:
        return annotation
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return _Text(text)


def _signature(obj) -> str:
    signature = inspect.signature(obj)
    parameters = [p.replace(annotation=_annotation(p.annotation)) for p in signature.parameters.values()]
    return str(signature.replace(parameters=parameters,
                                 return_annotation=_annotation(signature.return_annotation)))


def _ours(cls) -> list[type]:
    """The classes of cls's MRO that vsqs defines (not object, not pyspark's)."""
    return [klass for klass in cls.__mro__ if klass.__module__.split(".")[0] == "vsqs"]


def _written_in(function, klass) -> bool:
    """Written in klass's module (not made by @dataclass, nor inherited from elsewhere)."""
    code = getattr(function, "__code__", None)
    return code is not None and code.co_filename == sys.modules[klass.__module__].__file__


def _member(raw) -> str:
    if isinstance(raw, property):
        kind = "property" if raw.fset is None else "settable property"
        returns = inspect.signature(raw.fget).return_annotation
        return kind if returns is inspect.Parameter.empty else f"{kind} -> {_annotation(returns)}"
    if isinstance(raw, staticmethod):
        return f"staticmethod {_signature(raw.__func__)}"
    if isinstance(raw, classmethod):
        return f"classmethod {_signature(raw.__func__)}"
    if inspect.isfunction(raw):
        return f"method {_signature(raw)}"
    if type(raw).__name__ == "member_descriptor":
        return "attribute (slot)"
    return f"attribute: {type(raw).__name__}"


def _describe(cls) -> dict[str, str]:
    description = {}
    if any("__init__" in vars(klass) for klass in _ours(cls)):
        description["__init__"] = f"constructor {_signature(cls)}"
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if fields:
        description["@dataclass"] = "frozen" if cls.__dataclass_params__.frozen else "mutable"
    for klass in reversed(_ours(cls)):
        for name, raw in vars(klass).items():
            special = name.startswith("__") and name.endswith("__")
            if name in fields or name == "__init__" or (name.startswith("_") and not special):
                continue
            if special and not (inspect.isfunction(raw) and _written_in(raw, klass)):
                continue  # __doc__, __slots__, __dict__, made by @dataclass...
            description[name] = _member(raw)
    for name, field in fields.items():
        what = f"field: {_annotation(field.type)}"
        if field.default is not dataclasses.MISSING:
            what += f" = {field.default!r}"
        elif field.default_factory is not dataclasses.MISSING:
            what += f" = {field.default_factory.__name__}()"
        description[name] = what
    return dict(sorted(description.items()))


PINNED = {
    "Queue": {
        "__eq__": "method (self, other: object) -> bool",
        "__getstate__": "method (self) -> dict[str, Any]",
        "__hash__": "method (self) -> int",
        "__init__": "constructor (path: str | os.PathLike[str], *, create: bool = False, clock_skew: float = 0.0, mode: int | str | None = None, shards: int | None = None, poll_interval: float | None = None) -> None",
        "__repr__": "method (self) -> str",
        "__setstate__": "method (self, state: dict[str, Any]) -> None",
        "abort_stage": "method (self, stage: str) -> int",
        "cancel_redrive": "method (self, task_id: str) -> dict[str, Any] | None",
        "change_visibility": "method (self, receipt: str, timeout: float) -> str",
        "change_visibility_batch": "method (self, entries: Iterable[tuple[str, float]]) -> list[str | VsqsError]",
        "collect_garbage": "method (self, grace: float = 900.0, *, stage_grace: float = 604800.0) -> int",
        "commit_stage": "method (self, stage: str) -> int",
        "configure": "method (self, **changes: Any) -> Mapping[str, Any]",
        "created_at": "property -> float | None",
        "current_receipt": "method (self, receipt: str) -> str",
        "dead_letter": "method (self, receipt: str) -> None",
        "dead_letter_queue": "method (self, *, create: bool = True) -> Queue | None",
        "dead_letter_sources": "method (self) -> list[str]",
        "delete": "method (self, receipt: str) -> None",
        "delete_batch": "method (self, receipts: Iterable[str]) -> list[VsqsError | None]",
        "held_until": "method (self, receipt: str) -> float",
        "id": "property -> str",
        "message_id": "method (self, receipt: str) -> str",
        "messages": "method (self, *, bodies: bool = False, ids: Iterable[str] | None = None, after: str | None = None, limit: int | None = None, preview: int | None = None) -> Iterator[MessageInfo]",
        "path": "property -> str",
        "prefer_share": "method (self, index: int, count: int) -> None",
        "publish": "method (self, body: Body, *, delay: float | None = None, at: datetime | None = None, priority: int = 0, attributes: Mapping[str, str] | None = None, group: str | None = None, dedup_id: str | None = None, dedup: str | None = None, durable: bool = True) -> str",
        "publish_batch": "method (self, bodies: Iterable[Body | Outgoing], *, delay: float | None = None, at: datetime | None = None, priority: int = 0, attributes: Mapping[str, str] | None = None, group: str | None = None, dedup: str | None = None, durable: bool = True, _dedup_id: str | None = None) -> list[str]",
        "publish_staged": "method (self, bodies: Iterable[Body | Outgoing], *, stage: str, written: Callable[[], object] | None = None) -> list[str]",
        "purge": "method (self, ids: Iterable[str] | None = None) -> int",
        "purged_at": "property -> float | None",
        "read": "method (self, receipt: str) -> bytes",
        "read_message": "method (self, receipt: str) -> Message",
        "areceive": "method (self, *, visibility_timeout: float | None = None, wait: float | None = None, offload: Callable[[Callable[[], list[Message]]], Awaitable[list[Message]]] | None = None) -> Message | None",
        "areceive_batch": "method (self, max_messages: int = 10, *, visibility_timeout: float | None = None, wait: float | None = None, read_bodies: bool = True, group_runs: bool = False, offload: Callable[[Callable[[], list[Message]]], Awaitable[list[Message]]] | None = None) -> list[Message]",
        "receive": "method (self, *, visibility_timeout: float | None = None, wait: float | None = None) -> Message | None",
        "receive_batch": "method (self, max_messages: int = 10, *, visibility_timeout: float | None = None, wait: float | None = None, read_bodies: bool = True, group_runs: bool = False) -> list[Message]",
        "receiving": "method (self, *, visibility_timeout: float | None = None, wait: float = 0) -> Iterator[Message | None]",
        "redrive": "method (self, to: Queue | str | os.PathLike[str] | None = None, *, max_messages: int | None = None) -> int",
        "redrive_tasks": "method (self) -> list[dict[str, Any]]",
        "release": "method (self, receipt: str) -> None",
        "requeue_expired": "method (self) -> int",
        "resume": "method (self, *operations: str) -> None",
        "settings": "property -> Mapping[str, Any]",
        "settings_changed_at": "property -> float | None",
        "shards": "property -> int",
        "stages": "method (self) -> list[str]",
        "start_redrive": "method (self, to: Queue | str | os.PathLike[str] | None = None, *, per_second: int | None = None) -> dict[str, Any]",
        "stats": "method (self, *, groups: bool = False) -> QueueStats",
        "suspend": "method (self, *operations: str) -> None",
        "throttled": "method (self) -> bool",
        "update_setting": "method (self, name: str, change: Callable[[Any], Any]) -> Mapping[str, Any]",
    },
    "Spool": {
        "__contains__": "method (self, name: object) -> bool",
        "__getitem__": "method (self, name: str) -> Queue",
        "__init__": "constructor (root: str | os.PathLike[str], *, create: bool = False) -> None",
        "__iter__": "method (self) -> Iterator[Queue]",
        "__reduce__": "method (self) -> Any",
        "__repr__": "method (self) -> str",
        "claim_period": "method (self, task: str, seconds: float, *, now: float | None = None) -> bool",
        "create_queue": "method (self, name: str, *, shards: int | None = None, **settings: Any) -> Queue",
        "delete_queue": "method (self, name: str) -> int",
        "deleted_at": "method (self, name: str) -> float | None",
        "path": "method (self, name: str) -> str",
        "put_record": "method (self, task: str, period: int, data: bytes, *, keep: int) -> bool",
        "queue": "method (self, name: str) -> Queue",
        "queues": "method (self) -> list[str]",
        "record": "method (self, task: str, period: int) -> bytes | None",
        "root": "property -> str",
    },
    "Message": {
        "__init__": "constructor (queue: Queue, id: str, body: bytes | None, receipt: str, receive_count: int, sent_at: float | None, header: dict[str, Any] | None = None) -> None",
        "__reduce__": "method (self) -> Any",
        "__repr__": "method (self) -> str",
        "attributes": "property -> dict[str, str]",
        "body": "property -> bytes",
        "change_visibility": "method (self, seconds: float) -> str",
        "dead_letter": "method (self) -> None",
        "dead_letter_source": "property -> str | None",
        "delete": "method (self) -> None",
        "first_received_at": "property -> float | None",
        "group": "property -> str | None",
        "id": "attribute (slot)",
        "id_of_uuid": "staticmethod (uuid: str) -> str",
        "md5": "property -> str",
        "priority": "property -> int",
        "queue": "attribute (slot)",
        "receipt": "attribute (slot)",
        "receive_count": "attribute (slot)",
        "release": "method (self) -> None",
        "sent_at": "property -> float",
        "sequence_number": "property -> str",
        "sequence_number_of": "staticmethod (message_id: str) -> str",
        "settled": "property -> bool",
        "uuid": "property -> str",
        "uuid_of": "staticmethod (message_id: str) -> str",
    },
    "Worker": {
        "__init__": "constructor (queue: Queue, handler: Callable[[Message], object], *, visibility_timeout: float | None = None, wait: float = 1, concurrency: int = 1, max_messages: int | None = None, burst: bool = False, retry_delay: float = 0) -> None",
        "stop": "method (self) -> None",
        "stopping": "property -> bool",
        "work": "method (self) -> WorkerStats",
    },
    "MessageInfo": {
        "@dataclass": "frozen",
        "__init__": "constructor (id: str, state: str, receive_count: int, sent_at: float, visible_at: float, priority: int, body: bytes | None = None, attributes: dict[str, str] = <factory>, group: str | None = None, size: int | None = None) -> None",
        "attributes": "field: dict[str, str] = dict()",
        "body": "field: bytes | None = None",
        "group": "field: str | None = None",
        "id": "field: str",
        "priority": "field: int",
        "receive_count": "field: int",
        "sent_at": "field: float",
        "size": "field: int | None = None",
        "state": "field: str",
        "visible_at": "field: float",
    },
    "Outgoing": {
        "@dataclass": "frozen",
        "__init__": "constructor (body: Body, delay: float | None = None, at: datetime | None = None, priority: int | None = None, attributes: Mapping[str, str] | None = None, group: str | None = None, dedup_id: str | None = None) -> None",
        "at": "field: datetime | None = None",
        "attributes": "field: Mapping[str, str] | None = None",
        "body": "field: Body",
        "dedup_id": "field: str | None = None",
        "delay": "field: float | None = None",
        "group": "field: str | None = None",
        "priority": "field: int | None = None",
    },
    "QueueStats": {
        "@dataclass": "frozen",
        "__init__": "constructor (ready: int, in_flight: int, delayed: int, oldest_ready_age: float, writing: int = 0, dead_lettered: int = 0, groups: dict[str, dict[str, int]] | None = None, staged: int = 0) -> None",
        "dead_lettered": "field: int = 0",
        "delayed": "field: int",
        "groups": "field: dict[str, dict[str, int]] | None = None",
        "in_flight": "field: int",
        "oldest_ready_age": "field: float",
        "ready": "field: int",
        "staged": "field: int = 0",
        "total": "property -> int",
        "writing": "field: int = 0",
    },
    "WorkerStats": {
        "@dataclass": "mutable",
        "__init__": "constructor (processed: int = 0, failed: int = 0, lost: int = 0) -> None",
        "failed": "field: int = 0",
        "lost": "field: int = 0",
        "processed": "field: int = 0",
    },
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_public_names_and_signatures(name):
    assert _describe(getattr(vsqs, name)) == PINNED[name]


SPARK_PINNED = {
    "ProcessResult": {
        "@dataclass": "frozen",
        "__add__": "method (self, other: ProcessResult) -> ProcessResult",
        "__init__": "constructor (processed: int = 0, failed: int = 0, redelivered: int = 0, lost: int = 0, published: int = 0, tasks: int = 0, died: int = 0) -> None",
        "died": "field: int = 0",
        "failed": "field: int = 0",
        "lost": "field: int = 0",
        "processed": "field: int = 0",
        "published": "field: int = 0",
        "redelivered": "field: int = 0",
        "tasks": "field: int = 0",
    },
    "VsqsDataSource": {
        "name": "classmethod (cls) -> str",
        "reader": "method (self, schema: StructType) -> DataSourceReader",
        "schema": "method (self) -> StructType",
        "streamReader": "method (self, schema: StructType) -> DataSourceStreamReader",
        "streamWriter": "method (self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter",
        "writer": "method (self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter",
    },
    "process_queue": "(spark: SparkSession, path: str | os.PathLike[str] | Queue, fn: Callable[[Any], Any], *, output: str | os.PathLike[str] | Queue | None = None, parallelism: int | None = None, concurrency: int = 1, batch_size: int | None = None, visibility_timeout: float = 60.0, wait: float = 1.0, retry_delay: float | None = None, max_messages: int | None = None) -> ProcessResult",
    "register": "(spark: SparkSession) -> None",
}


def _spark():
    """vsqs.spark, which needs pyspark (the test extra installs it: skipped only without)."""
    pytest.importorskip("pyspark", reason="vsqs.spark needs pyspark: pip install 'vsqs[spark]'")
    import vsqs.spark

    return vsqs.spark


def test_spark_exported_names():
    spark = _spark()
    assert sorted(spark.__all__) == sorted([
        "COLUMNS",
        "NAME",
        "OPTIONS",
        "SCHEMA",
        "WRITE_COLUMNS",
        "ProcessResult",
        "VsqsDataSource",
        "process_queue",
        "register",
    ])
    for name in spark.__all__:
        assert getattr(spark, name) is not None


@pytest.mark.parametrize("name", sorted(SPARK_PINNED))
def test_spark_names_and_signatures(name):
    obj = getattr(_spark(), name)
    described = _describe(obj) if inspect.isclass(obj) else _signature(obj)
    assert described == SPARK_PINNED[name]


def test_spark_constants():
    spark = _spark()
    assert spark.NAME == "vsqs"
    assert spark.WRITE_COLUMNS == ("body", "delay", "group", "dedup_id", "priority", "attributes")
    assert list(spark.OPTIONS) == [
        "path", "create", "clockSkew", "numPartitions", "maxMessagesPerTrigger", "visibilityTimeout",
    ]
    assert {name: type_.simpleString() for name, type_ in spark.COLUMNS.items()} == {
        "id": "string",
        "body": "binary",
        "state": "string",
        "receive_count": "int",
        "sent_at": "timestamp",
        "priority": "int",
        "group": "string",
        "attributes": "map<string,string>",
    }
    assert spark.SCHEMA.simpleString() == (
        "struct<id:string,body:binary,state:string,receive_count:int,sent_at:timestamp,"
        "priority:int,group:string,attributes:map<string,string>>"
    )
