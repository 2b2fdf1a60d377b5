"""The SQS actions, one function each: read the parameters, make public vsqs
calls on the thread pool, answer the result's JSON. vsqs errors rise to the
endpoint, which answers them in SQS's terms."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vsqs import (
    InvalidArgument,
    InvalidReceipt,
    MessageTooLarge,
    Queue,
    QueueNotFound,
    StaleReceipt,
    VsqsError,
)
from vsqs._gateway.limits import (
    FIFO_DEDUP_WINDOW,
    MAX_BATCH,
    MAX_LIST_RESULTS,
    MAX_VISIBILITY_TIMEOUT,
    MAX_WAIT_SECONDS,
)
from vsqs._gateway.sqs.amazon_waits import purge_unless_purged_recently, refuse_if_deleted_recently
from vsqs._gateway.sqs.attributes import (
    ATTRIBUTE_OF_SETTING,
    REPORTED_DEFAULTS,
    check_dead_letter_exists,
    check_dead_letter_region,
    queue_attributes,
    settings_of,
    unknown_attribute,
    unknown_queue_attributes,
)
from vsqs._gateway.sqs.call import Call
from vsqs._gateway.sqs.management import MANAGEMENT_ACTIONS, check_tags
from vsqs._gateway.sqs.messages import (
    Prepared,
    check_dedup,
    check_fifo_batch,
    dead_letter_sources,
    prepare,
    received_message,
    send_result,
)
from vsqs._gateway.sqs.parameters import (
    BOUNDS,
    FIFO_NAME_RULE,
    STANDARD_NAME_RULE,
    batch_entries,
    existing_queue_name,
    integer,
    is_fifo,
    queue_name_of_url,
    required_string,
    sqs_queue_name,
    string,
    string_list,
    string_map,
)
from vsqs._gateway.sqs.protocol import SqsError, invalid_parameter_value, missing, sqs_error_of

log = logging.getLogger("vsqs.gateway.sqs")


def _outcome_of(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or the vsqs error it raised (a batch entry's outcome)."""
    try:
        return fn(*args)
    except (StaleReceipt, InvalidReceipt, InvalidArgument, SqsError) as exc:
        return exc


def _invalid_handle(handle: str) -> SqsError:
    """Amazon's answer to a receipt handle that is not one (malformed, or another queue's)."""
    return SqsError("ReceiptHandleIsInvalid",
                    f'The input receipt handle "{handle[:1024]}" is not a valid receipt handle.')


def _not_changeable(handle: str) -> SqsError:
    """Amazon's answer to ChangeMessageVisibility for a message that is gone."""
    return invalid_parameter_value("ReceiptHandle", handle[:1024],
                                   "Message does not exist or is not available for visibility timeout change.")


def _change_visibility(call: Call, queue: Queue, handle: str, timeout: float) -> str | None:
    """Change the visibility of ``handle``'s message (blocking): its new receipt, or
    None when the handle no longer holds its message but the message is still in
    the queue (its lease ran out and it was received again: success, nothing
    changes, the later receiver keeps its lease). ReceiptHandleIsInvalid for a
    malformed handle, InvalidParameterValue (Amazon's wording) for a message
    that was deleted."""
    try:
        return call.aliases.follow(queue, handle, lambda current: queue.change_visibility(current, timeout))
    except InvalidReceipt:
        raise _invalid_handle(handle) from None
    except StaleReceipt:
        if any(True for _ in queue.messages(ids=[queue.message_id(handle)])):
            return None
        raise _not_changeable(handle) from None


def _expired(handle: str) -> SqsError:
    """Amazon's answer to DeleteMessage on a FIFO queue with a handle whose visibility timeout ran out."""
    return invalid_parameter_value("ReceiptHandle", handle[:1024], "The receipt handle has expired.")


def _delete(call: Call, queue: Queue, handle: str, fifo: bool) -> None:
    """Delete ``handle``'s message (blocking); StaleReceipt if it no longer holds it. On a FIFO
    queue, as Amazon, a handle that no longer holds a message still in the queue (its visibility
    timeout ran out, here or after a change through another gateway, or it was received again)
    deletes nothing (the message comes back): InvalidParameterValue, "The receipt handle has
    expired". A handle whose message is gone (a retried delete) answers as a stale one does."""
    def delete(receipt: str) -> None:
        if fifo and queue.held_until(receipt) <= time.time():
            raise StaleReceipt("the receipt's visibility timeout ran out")  # (follow looks for a later one)
        queue.delete(receipt)

    try:
        call.aliases.follow(queue, handle, delete)
    except StaleReceipt:
        if fifo and any(True for _ in queue.messages(ids=[queue.message_id(handle)])):
            raise _expired(handle) from None
        raise


def _failed(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": error.status < 500, "Code": error.query_code, "Message": error.message}


def _batch_result(call: Call, successful: list[dict[str, Any]], failed: list[dict[str, Any]],
                  stale: bool = False) -> dict[str, Any]:
    """A batch's answer and its metrics outcome. An empty list is left out, as
    Amazon's JSON answers leave it out (no ``Failed`` when nothing failed)."""
    call.outcome = "partial" if failed else "stale" if stale else "ok"
    return {key: entries for key, entries in (("Successful", successful), ("Failed", failed)) if entries}


# -- the actions -------------------------------------------------------------------


async def create_queue(call: Call) -> dict[str, Any]:
    name = sqs_queue_name(call.params)
    attributes = string_map(call.params, "Attributes")
    fifo_flag = attributes.get("FifoQueue")
    if is_fifo(name) and (fifo_flag or "").lower() != "true":
        raise SqsError("InvalidParameterValue", STANDARD_NAME_RULE)  # Amazon: a standard queue's name rule
    if not is_fifo(name) and fifo_flag is not None:
        if fifo_flag.lower() == "true":
            raise SqsError("InvalidParameterValue", FIFO_NAME_RULE)
        raise unknown_attribute("FifoQueue")  # Amazon refuses even "false" on a standard queue
    settings = settings_of(attributes, name)
    if call.home.multi_region:
        check_dead_letter_region(attributes.get("RedrivePolicy", ""), call.region)
    tags = check_tags(string_map(call.params, "tags"))  # kept as the queue's tags setting (management.py)
    spool = call.gateway.spool

    def create() -> None:
        check_dead_letter_exists(spool.queues(), settings, attributes.get("RedrivePolicy", ""))
        try:
            existing = spool.queue(name)
        except QueueNotFound:
            refuse_if_deleted_recently(call, name)
            extra: dict[str, object] = {}
            if is_fifo(name):  # Amazon's de-duplication interval and scope, one message of a group at a time
                extra.update(dedup_window=FIFO_DEDUP_WINDOW, group_concurrency=1, dedup_scope="queue")
            call.gateway.create_queue(name, **{**extra, **settings, **({"tags": tags} if tags else {})})
            return
        current = {**existing.settings}
        current.update((key, value) for key, value in REPORTED_DEFAULTS.items() if current[key] is None)
        differing = sorted(ATTRIBUTE_OF_SETTING.get(key, key) for key, value in settings.items()
                           if current[key] != value)
        if differing:
            raise SqsError("QueueNameExists", "A queue already exists with the same name and a different value "
                           f"for attribute {differing[0]}")

    call.queue_name = name
    try:
        await call.run(create)
    except InvalidArgument as exc:
        raise SqsError("InvalidAttributeValue", str(exc)) from None
    call.gateway.forget(name)
    return {"QueueUrl": call.url_of(name)}


async def get_queue_url(call: Call) -> dict[str, Any]:
    call.queue_name = existing_queue_name(call.params)
    await call.queue()
    return {"QueueUrl": call.url_of(call.queue_name)}


async def list_queues(call: Call) -> dict[str, Any]:
    prefix = string(call.params, "QueueNamePrefix") or ""
    limit = integer(call.params, "MaxResults", 1, MAX_LIST_RESULTS)
    token = string(call.params, "NextToken")
    after = ""
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
        except (ValueError, UnicodeError):
            raise SqsError("InvalidParameterValue", "Invalid NextToken value.") from None
    names = [name for name in await call.run(call.gateway.spool.queues) if name.startswith(prefix) and name > after]
    shown = names[: limit or MAX_LIST_RESULTS]
    result: dict[str, Any] = {}
    if shown:
        result["QueueUrls"] = [call.url_of(name) for name in shown]
    if limit is not None and len(names) > len(shown):
        result["NextToken"] = base64.urlsafe_b64encode(shown[-1].encode("utf-8")).decode("ascii")
    return result


async def delete_queue(call: Call) -> dict[str, Any]:
    name = queue_name_of_url(call.params)
    call.queue_name = name
    await call.run(call.gateway.spool.delete_queue, name)
    call.gateway.forget(name)
    return {}


async def get_queue_attributes(call: Call) -> dict[str, Any]:
    wanted = set(string_list(call.params, "AttributeNames"))
    unknown = unknown_queue_attributes(wanted)
    if unknown:
        raise unknown_attribute(unknown[0])
    name = queue_name_of_url(call.params)
    attributes = await call.on_queue(lambda queue: queue_attributes(call, queue, name, wanted) if wanted else {})
    return {"Attributes": attributes} if attributes else {}


async def set_queue_attributes(call: Call) -> dict[str, Any]:
    name = queue_name_of_url(call.params)
    call.queue_name = name
    attributes = string_map(call.params, "Attributes")
    if not attributes:
        raise missing("Attributes")
    settings = settings_of(attributes, name)
    if call.home.multi_region:
        check_dead_letter_region(attributes.get("RedrivePolicy", ""), call.region)

    def configure(queue: Queue) -> None:
        check_dead_letter_exists(call.gateway.spool.queues(), settings, attributes.get("RedrivePolicy", ""))
        if settings:
            queue.configure(**settings)

    try:
        await call.on_queue(configure)
    except InvalidArgument as exc:
        raise SqsError("InvalidAttributeValue", str(exc)) from None
    return {}


async def send_message(call: Call) -> dict[str, Any]:
    def send(queue: Queue) -> tuple[Prepared, str]:
        settings = call.settings_now(queue)
        prepared = prepare(call.params, name, call.message_limit(settings), call.trace_header)
        check_dedup(prepared, name, settings)
        return prepared, queue.publish_batch([prepared.message])[0]

    name = queue_name_of_url(call.params)
    prepared, message_id = await call.on_queue(send)  # one hop: the queue, its settings, the publish
    return send_result(message_id, prepared)


async def send_message_batch(call: Call) -> dict[str, Any]:
    name = queue_name_of_url(call.params)
    entries = batch_entries(call.params, "SendMessageBatch")
    batch_limit = call.gateway.config.max_body_bytes  # SQS: a batch may be as large as one message can

    def send(queue: Queue) -> tuple[list[dict[str, Any]], list[tuple[str, Prepared]], list[str | SqsError]]:
        """Check the entries (against the queue's settings), then publish the good
        ones together (one hop: the queue, its settings, the publish)."""
        settings = call.settings_now(queue)
        check_fifo_batch(entries, name, settings)
        limit = call.message_limit(settings)
        failed: list[dict[str, Any]] = []
        ready: list[tuple[str, Prepared]] = []
        total = 0
        for entry in entries:
            try:
                prepared = prepare(entry, name, limit, call.trace_header, in_batch=True)
                check_dedup(prepared, name, settings)
                total += prepared.size
                ready.append((entry["Id"], prepared))
            except SqsError as exc:
                failed.append(_failed(entry["Id"], exc))
                total += len(str(entry.get("MessageBody", "")).encode("utf-8", "replace"))  # SQS counts it too
        if total > batch_limit:
            raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than {batch_limit} bytes. "
                           f"You have sent {total} bytes.")
        return failed, ready, _publish_each(queue, [prepared.message for _, prepared in ready]) if ready else []

    failed, ready, outcomes = await call.on_queue(send)
    successful: list[dict[str, Any]] = []
    if ready:
        for (entry_id, prepared), outcome in zip(ready, outcomes, strict=True):
            if isinstance(outcome, SqsError):
                failed.append(_failed(entry_id, outcome))
            else:
                successful.append({"Id": entry_id, **send_result(outcome, prepared)})
    return _batch_result(call, successful, failed)


def _publish_each(queue: Queue, messages: list[Any]) -> list[str | SqsError]:
    """Publish ``messages`` together; if the batch is refused, nothing was published:
    then one by one, to find the culprits (each one's id or error)."""
    try:
        return list(queue.publish_batch(messages))
    except (InvalidArgument, MessageTooLarge):
        pass
    outcomes: list[str | SqsError] = []
    for message in messages:
        try:
            outcomes.append(queue.publish_batch([message])[0])
        except (InvalidArgument, MessageTooLarge) as exc:
            outcomes.append(sqs_error_of(exc))
    return outcomes


async def receive_message(call: Call) -> dict[str, Any]:
    params = call.params
    count = integer(params, "MaxNumberOfMessages", 1, MAX_BATCH) or 1
    visibility = integer(params, "VisibilityTimeout", 0, MAX_VISIBILITY_TIMEOUT)
    wait = integer(params, "WaitTimeSeconds", 0, MAX_WAIT_SECONDS, BOUNDS)
    # Amazon ignores names it does not know here, and takes All in any case (see received_message)
    system_names = set(string_list(params, "AttributeNames")) | set(string_list(params, "MessageSystemAttributeNames"))
    attribute_names = string_list(params, "MessageAttributeNames")
    timeout = None if visibility is None else float(visibility)

    sources: dict[str, str | None] = {}  # receipt -> dead-letter source, looked up in worker threads

    def first_attempt(queue: Queue) -> tuple[dict[str, Any], list[Any]]:
        """The queue's settings and what a receive finds now (one hop). FIFO: a
        group's next messages together, as Amazon (group runs)."""
        runs = is_fifo(call.queue_name or "")
        settings = call.settings_now(queue)
        got = queue.receive_batch(count, visibility_timeout=timeout, wait=0, group_runs=runs)
        dead_letter_sources(got, system_names, sources)  # (a long poll does it in its own worker thread)
        return settings, got

    settings, messages = await call.on_queue(first_attempt)
    name = call.queue_name
    assert name is not None
    fifo = is_fifo(name)
    waits = float(settings["receive_wait"] if wait is None else wait)
    if not messages and waits > 0:
        messages = await call.gateway.long_poll(name, count, timeout, waits, call.request.is_disconnected,
                                                group_runs=fifo,
                                                prepare=lambda got: dead_letter_sources(got, system_names, sources))
    received = [received_message(call, m, fifo, bool(settings["content_dedup"]), system_names, attribute_names,
                                 sources) for m in messages]
    return {"Messages": received} if received else {}


async def delete_message(call: Call) -> dict[str, Any]:
    handle = required_string(call.params, "ReceiptHandle")
    fifo = is_fifo(queue_name_of_url(call.params))
    try:
        await call.on_queue(lambda queue: _delete(call, queue, handle, fifo))
    except InvalidReceipt:
        raise _invalid_handle(handle) from None
    except StaleReceipt:
        log.debug("DeleteMessage with a stale receipt on %s: nothing deleted", call.queue_name)
        call.outcome = "stale"
    call.aliases.settled(handle)
    return {}


async def delete_message_batch(call: Call) -> dict[str, Any]:
    entries = batch_entries(call.params, "DeleteMessageBatch")
    failed: list[dict[str, Any]] = []
    todo: list[tuple[str, str]] = []
    for entry in entries:
        handle = entry.get("ReceiptHandle")
        if not isinstance(handle, str):
            failed.append(_failed(entry["Id"], missing("ReceiptHandle")))
        else:
            todo.append((entry["Id"], handle))
    fifo = is_fifo(queue_name_of_url(call.params))
    outcomes = await call.on_queue(lambda queue: [_outcome_of(_delete, call, queue, handle, fifo)
                                                  for _, handle in todo])
    successful: list[dict[str, Any]] = []
    stale = False
    for (entry_id, handle), outcome in zip(todo, outcomes, strict=True):
        if isinstance(outcome, (InvalidReceipt, SqsError)):
            error = _invalid_handle(handle) if isinstance(outcome, InvalidReceipt) else outcome
            failed.append(_failed(entry_id, error))
            continue
        stale = stale or isinstance(outcome, StaleReceipt)
        call.aliases.settled(handle)
        successful.append({"Id": entry_id})
    return _batch_result(call, successful, failed, stale)


async def change_message_visibility(call: Call) -> dict[str, Any]:
    handle = required_string(call.params, "ReceiptHandle")
    if call.params.get("VisibilityTimeout") is None:
        raise missing("VisibilityTimeout")
    timeout = integer(call.params, "VisibilityTimeout", 0, MAX_VISIBILITY_TIMEOUT)
    receipt = await call.on_queue(lambda queue: _change_visibility(call, queue, handle, float(timeout or 0)))
    if receipt is None:
        call.outcome = "stale"
    else:
        call.aliases.moved(handle, receipt)
    return {}


async def change_message_visibility_batch(call: Call) -> dict[str, Any]:
    entries = batch_entries(call.params, "ChangeMessageVisibilityBatch")
    failed: list[dict[str, Any]] = []
    todo: list[tuple[str, str, float]] = []
    for entry in entries:
        try:
            handle = required_string(entry, "ReceiptHandle")
            if entry.get("VisibilityTimeout") is None:
                raise missing("VisibilityTimeout")
            timeout = integer(entry, "VisibilityTimeout", 0, MAX_VISIBILITY_TIMEOUT)
            todo.append((entry["Id"], handle, float(timeout or 0)))
        except SqsError as exc:
            failed.append(_failed(entry["Id"], exc))

    def change_all(queue: Queue) -> list[str | None | SqsError | VsqsError]:
        outcomes: list[str | None | SqsError | VsqsError] = []
        for _, handle, timeout in todo:
            try:
                outcomes.append(_change_visibility(call, queue, handle, timeout))
            except (SqsError, InvalidArgument) as exc:
                outcomes.append(exc)
        return outcomes

    successful: list[dict[str, Any]] = []
    stale = False
    for (entry_id, handle, _), outcome in zip(todo, await call.on_queue(change_all), strict=True):
        if isinstance(outcome, (SqsError, VsqsError)):
            failed.append(_failed(entry_id, outcome if isinstance(outcome, SqsError) else sqs_error_of(outcome)))
        elif outcome is None:
            stale = True
            successful.append({"Id": entry_id})
        else:
            call.aliases.moved(handle, outcome)
            successful.append({"Id": entry_id})
    return _batch_result(call, successful, failed, stale)


async def purge_queue(call: Call) -> dict[str, Any]:
    name = call.queue_name = queue_name_of_url(call.params)
    await call.on_queue(lambda queue: purge_unless_purged_recently(call, queue, name))
    return {}


Action = Callable[[Call], Awaitable[dict[str, Any]]]
ACTIONS: dict[str, Action] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "PurgeQueue": purge_queue,
    **MANAGEMENT_ACTIONS,  # tags, permissions, dead-letter sources, move tasks (management.py)
}
# the actions whose requests carry message bodies: they take the face's cap, the others a small one
MESSAGE_ACTIONS = frozenset({"SendMessage", "SendMessageBatch"})
UNSUPPORTED_ACTIONS: frozenset[str] = frozenset()
# the actions that change nothing (ReceiveMessage does: it hides messages, counts receives)
READ_ONLY_ACTIONS = frozenset({"GetQueueUrl", "ListQueues", "GetQueueAttributes", "ListQueueTags",
                               "ListDeadLetterSourceQueues", "ListMessageMoveTasks"})
