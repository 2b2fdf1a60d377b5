"""The public surface is pinned: changing it is a decision, not an accident."""

import pickle

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
